"""Whether this process is the ``dftrace`` command running a command of its own.

``DFTRACE_ENABLE=1`` exported for a job is inherited by whatever else the shell
starts, ``dftrace summary`` of that job's traces included: tracing started there would
write a trace of the analysis beside (or into) the traces it reads. So the variable
starts nothing in the ``dftrace`` command, but for ``dftrace run``, which traces the
program it runs.
"""

from __future__ import annotations

import os
import sys

#: The command that traces the program it runs: the variable applies to it.
TRACING_COMMAND = "run"
#: Python's options that take a value as the next argument.
_OPTIONS_WITH_VALUE = frozenset({"-W", "-X", "-Q"})


def is_own_command() -> bool:
    """True in ``dftrace COMMAND ...`` and ``python -m dftrace COMMAND ...`` for every
    COMMAND but ``run`` (and with no command: the help)."""
    args = _command_args()
    return args is not None and (not args or args[0] != TRACING_COMMAND)


def _command_args() -> list[str] | None:
    """The arguments after the ``dftrace`` program, or None when this process runs
    another program."""
    argv = list(getattr(sys, "orig_argv", ()) or ())
    k = 1
    while k < len(argv) and argv[k].startswith("-") and argv[k] != "-":
        option = argv[k]
        if option == "-m":
            module = argv[k + 1] if k + 1 < len(argv) else ""
            return argv[k + 2:] if module in ("dftrace", "dftrace.cli") else None
        if option == "-c" or option == "--":
            return None
        k += 2 if option in _OPTIONS_WITH_VALUE else 1
    if k >= len(argv):
        return None
    # A console script: python runs the file called dftrace (its wrapper).
    return argv[k + 1:] if os.path.basename(argv[k]) == "dftrace" else None
