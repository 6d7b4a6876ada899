"""Imported at interpreter start by the ``dftrace-autostart.pth`` file the install puts
beside the package, when ``DFTRACE_ENABLE`` is set (and not 0): ``import dftrace``
then starts tracing before the program's first line, so a program that never imports
dftrace is traced too. Without the variable the file imports nothing and costs one
look at the environment."""

def start() -> None:
    """Tracing per DFTRACE_ENABLE (the import of dftrace does it); never raises."""
    try:
        import dftrace  # noqa: F401  (its import starts the session: DFTRACE_ENABLE=1)
    except BaseException as exc:  # never the reason a program cannot start
        if isinstance(exc, KeyboardInterrupt):
            raise
        import sys

        print(f"dftrace: tracing is off in this process: {exc!r}", file=sys.stderr)
