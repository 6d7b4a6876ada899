"""The ``dftrace`` command (also ``python -m dftrace``).

Core subcommands live here (``demo``, ``run``); the analysis package adds its own
(``summary``, ``report``, ``convert``, ``merge``, ``validate``) through
``dftrace.analysis._cli.register`` without importing any heavy library until one
of them runs.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from collections import Counter
from typing import Any

from ._config import OPTIONS, ConfigError

__all__ = ["main"]


def _add_trace_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tracing options (default: the DFTRACE_* variables)")
    for opt in OPTIONS:
        if opt.name in ("enable", "inherit"):
            continue
        g.add_argument("--" + opt.name.replace("_", "-"), dest=opt.name, default=None,
                       metavar=opt.env, help=opt.doc.replace("%", "%%"))


def _trace_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    return {o.name: getattr(ns, o.name) for o in OPTIONS
            if getattr(ns, o.name, None) is not None}


def _summarize(paths: list[str]) -> str:
    from .testing import read_events

    rows: Counter[tuple[str, str]] = Counter()
    total: Counter[tuple[str, str]] = Counter()
    n = 0
    for p in paths:
        for e in read_events(p, strict=False):
            if e.get("ph") == "X":
                key = (e.get("cat", "?"), e.get("name", "?"))
                rows[key] += 1
                total[key] += e.get("dur", 0)
                n += 1
    lines = [f"{'category':<12} {'name':<22} {'count':>7} {'total ms':>10}"]
    for (cat, name), c in sorted(rows.items()):
        lines.append(f"{cat:<12} {name:<22} {c:>7} {total[(cat, name)] / 1000:>10.2f}")
    lines.append(f"{n} spans in {len(rows)} kinds")
    return "\n".join(lines)


def _cmd_demo_ddp(ns: argparse.Namespace) -> int:
    try:
        from .examples import ddp_training
    except ImportError:
        print("dftrace demo --ddp needs PyTorch: pip install 'dftrace[torch]'", file=sys.stderr)
        return 2

    out = ddp_training.launch(ns.out, epochs=ns.epochs)
    print(f"\ntrace written to {out}\nfind the rank that holds the others back with: dftrace summary {out}")
    return 0


def _cmd_demo(ns: argparse.Namespace) -> int:
    if ns.ddp:
        return _cmd_demo_ddp(ns)
    import dftrace
    from .examples import toy_training

    out = os.path.abspath(ns.out)
    kwargs = _trace_kwargs(ns)
    kwargs.setdefault("log_file", os.path.join(out, "demo"))
    s = dftrace.initialize(**kwargs)
    toy_training.train(epochs=ns.epochs, n=ns.samples)
    dftrace.finalize()
    if s is None:
        print("tracing is off (DFTRACE_ENABLE=0): no trace written")
        return 0
    print(f"\ntrace written to {', '.join(s.paths)}")
    print(_summarize(s.paths))
    import importlib.util

    more = f"dftrace summary {out}"
    if importlib.util.find_spec("polars") is None:
        more = f"pip install 'dftrace[analysis]' && {more}"
    print(f"\nopen it in https://ui.perfetto.dev, or: {more}")
    return 0


def _cmd_run(ns: argparse.Namespace) -> int:
    import dftrace

    target_argv = ns.target[1:] if ns.target[:1] == ["--"] else ns.target
    if not target_argv:
        print("dftrace run: give a script (or -m module) to run", file=sys.stderr)
        return 2
    try:
        dftrace.initialize(**_trace_kwargs(ns))
    except ConfigError as exc:
        print(f"dftrace run: {exc}", file=sys.stderr)
        return 2
    target, *rest = target_argv
    code = 0
    old_argv = sys.argv
    try:
        if ns.module:
            sys.argv = [target, *rest]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [target, *rest]
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    finally:
        sys.argv = old_argv
        dftrace.finalize()
    return code


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dftrace", description="Trace AI/DL pipelines and read the traces.")
    from ._version import __version__
    p.add_argument("--version", action="version", version=f"dftrace {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    d = sub.add_parser("demo", help="run a bundled toy training pipeline with tracing on",
                       description="Run a toy training pipeline (no framework needed) with tracing "
                                   "on, then print where the trace went and what is in it.")
    d.add_argument("--out", default="dftrace-demo", help="directory for the trace (default: %(default)s)")
    d.add_argument("--epochs", type=int, default=3)
    d.add_argument("--samples", type=int, default=256)
    d.add_argument("--ddp", action="store_true",
                   help="run 2 DistributedDataParallel ranks instead (CPU, gloo, loopback; rank 1 made "
                        "slow on purpose); needs PyTorch")
    _add_trace_options(d)
    d.set_defaults(func=_cmd_demo)

    r = sub.add_parser("run", help="run a Python script or module with tracing initialised",
                       description="Run SCRIPT [ARGS] (or -m MODULE [ARGS]) with tracing initialised "
                                   "from the options and DFTRACE_* variables; child processes trace too.")
    r.add_argument("-m", dest="module", action="store_true", help="run a module, like python -m")
    _add_trace_options(r)
    r.add_argument("target", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS]")
    r.set_defaults(func=_cmd_run)

    try:
        from .analysis import _cli as analysis_cli
    except ImportError:
        analysis_cli = None
    if analysis_cli is not None:
        analysis_cli.register(sub)
    return p


def _split_run(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``run [OPTIONS] SCRIPT [ARGS]``: everything from SCRIPT on belongs to the script,
    even tokens that look like our options; put it behind ``--`` for argparse."""
    takes_value = {a for act in parser._actions if act.option_strings and act.nargs != 0
                   for a in act.option_strings}
    i = 1
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return argv
        if not tok.startswith("-") or tok == "-":
            break
        i += 2 if tok in takes_value else 1
    return argv[:i] + ["--"] + argv[i:]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        run_parser = parser._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
        argv = _split_run(argv, run_parser)
    ns = parser.parse_args(argv)
    if not getattr(ns, "func", None):
        parser.print_help()
        return 2
    return int(ns.func(ns) or 0)


if __name__ == "__main__":
    sys.exit(main())
