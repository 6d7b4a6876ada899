"""The ``dftrace`` command (also ``python -m dftrace``).

Core subcommands live here (``demo``, ``run``); the analysis package adds its own
(``summary``, ``report``, ``convert``, ``merge``, ``validate``) through
``dftrace.analysis.commands.register`` without importing any heavy library until one
of them runs.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shlex
import sys
import time
from collections import Counter
from typing import Any

from ._install_hint import pip_install
from ._core.config import _FALSE, _TRUE, OPTIONS, ConfigError, _bool, auto_unless_set

__all__ = ["main"]


#: What the value of an option that takes text is, in ``--help``.
_TEXT_VALUES = {"log_file": "PREFIX", "data_dir": "DIRS", "process_name": "NAME"}


def _value_name(opt: Any) -> str:
    """What an option's value is, as ``--help`` shows it: its choices, a kind of number,
    or what the text names."""
    choices = getattr(opt.parse, "choices", None)
    if choices:
        return "{" + ",".join(choices) + "}"
    if opt.parse is _bool:
        return "0|1"
    described = getattr(opt.parse, "range", "")
    if described.startswith("a number of seconds"):
        return "SECONDS"
    if described.startswith("a size"):
        return "SIZE"
    if described.startswith("an integer"):
        return "N"
    return _TEXT_VALUES.get(opt.name, "TEXT")


def _add_trace_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tracing options (each defaults to its DFTRACE_* variable)")
    for opt in OPTIONS:
        if opt.name in ("enable", "inherit"):
            continue
        flag = "--" + opt.name.replace("_", "-")
        doc = f"{opt.doc} (variable {opt.env})".replace("%", "%%")
        if opt.parse is _bool:  # --io alone is --io 1
            g.add_argument(flag, dest=opt.name, default=None, nargs="?", const="1",
                           metavar=_value_name(opt), help=doc)
        else:
            g.add_argument(flag, dest=opt.name, default=None, metavar=_value_name(opt), help=doc)


#: What a switch's value may be (``--io 0``); anything else after ``--io`` is not its
#: value but the next argument (``dftrace run --io train.py``).
_SWITCH_VALUES = _TRUE | _FALSE


def _trace_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    return {o.name: getattr(ns, o.name) for o in OPTIONS
            if getattr(ns, o.name, None) is not None}


def _demo_table(paths: list[str]) -> str:
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
        print(f"dftrace demo --ddp needs PyTorch: {pip_install('torch')}", file=sys.stderr)
        return 2

    try:
        out = _fresh_run_dir(os.path.abspath(ns.out))
    except OSError as exc:
        print(f"dftrace demo: cannot write into --out {ns.out!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    ddp_training.launch(out, epochs=ns.epochs)
    print(f"\ntraces written to {_shown(out)}\n"
          f"find the rank that holds the others back with: dftrace summary {_shown(out)}")
    return 0


def _fresh_run_dir(parent: str) -> str:
    """A new ``run-N`` directory under ``parent``, so that runs never mix."""
    os.makedirs(parent, exist_ok=True)
    n = 1 + max((int(d[4:]) for d in os.listdir(parent) if d.startswith("run-") and d[4:].isdigit()),
                default=0)
    while True:
        path = os.path.join(parent, f"run-{n}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:  # another demo took it meanwhile
            n += 1


def _shown(path: str) -> str:
    """``path`` relative to the working directory when it lies inside it (easier to copy)."""
    rel = os.path.relpath(path)
    return path if rel.startswith(os.pardir) else rel


def _cmd_write_samples(ns: argparse.Namespace) -> int:
    from .examples.sample_runs import SAMPLES, write_samples

    try:
        write_samples(ns.write_samples)
    except FileExistsError as exc:
        print(f"dftrace demo: {exc}: write the samples into a directory without them", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"dftrace demo: cannot write into {ns.write_samples!r}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    width = max(map(len, SAMPLES))
    print(f"wrote the sample runs into {_shown(os.path.abspath(ns.write_samples))}:")
    for name, what in SAMPLES.items():
        print(f"  {name:<{width}}  {what}")
    return 0


def _cmd_demo(ns: argparse.Namespace) -> int:
    if ns.write_samples is not None:
        return _cmd_write_samples(ns)
    if ns.ddp:
        return _cmd_demo_ddp(ns)
    import dftrace
    from .examples import toy_training

    kwargs = _trace_kwargs(ns)
    out = None
    if "log_file" not in kwargs:
        try:
            out = _fresh_run_dir(os.path.abspath(ns.out))
        except OSError as exc:
            print(f"dftrace demo: cannot write into --out {ns.out!r}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        kwargs["log_file"] = os.path.join(out, "demo")
    try:
        s = dftrace.initialize(**kwargs)
    except ConfigError as exc:
        print(f"dftrace demo: {exc}", file=sys.stderr)
        return 2
    toy_training.train(epochs=ns.epochs, n=ns.samples)
    dftrace.finalize()
    if s is None:
        print("tracing is off (DFTRACE_ENABLE=0): no trace written")
        return 0
    print(f"\ntrace written to {', '.join(_shown(p) for p in s.paths)}")
    print(_demo_table(s.paths))
    target = shlex.quote(_shown(out)) if out is not None else " ".join(shlex.quote(_shown(p)) for p in s.paths)
    more = f"dftrace summary {target}, or in Perfetto: dftrace view {target}"
    try:
        from .analysis.runtime.deps import ANALYSIS, check_installed

        check_installed(*ANALYSIS)
    except ImportError:
        more = f"{pip_install('analysis')}, then {more}"
    print(f"\nnext: {more}")
    return 0


def _command_on_path(target: str) -> str | None:
    """Where a command named alone (``torchrun``, ``accelerate``: no file of that name
    here) is on PATH, else None."""
    import shutil

    return shutil.which(target) if os.sep not in target and not os.path.exists(target) else None


def _python_script(path: str) -> str | None:
    """``path`` when it is a Python script (its ``#!`` line names a Python: the console
    scripts pip installs), else None."""
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return None
    return path if first.startswith(b"#!") and b"python" in first else None


def _missing_target(module: bool, target: str) -> str | None:
    """Why ``target`` cannot be run (no such script, module or ``__main__``), or None.

    Modules are looked up on the file system below their top-level package, so
    nothing of the user's is imported before tracing starts.
    """
    if not module:
        if os.path.isdir(target) and not os.path.exists(os.path.join(target, "__main__.py")):
            return f"{target!r} is a directory without a __main__.py"
        if os.path.exists(target):
            return None
        found = _command_on_path(target)
        if found is not None and _python_script(found) is None:
            return f"{found!r} is not a Python script (dftrace run runs Python scripts and modules)"
        return None if found is not None else f"no such file: {target!r}"
    import importlib.machinery
    import importlib.util

    top, *parts = target.split(".")
    try:
        spec = importlib.util.find_spec(top) if top else None
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return f"no module named {top or target!r}"
    places = spec.submodule_search_locations
    name = top
    for part in parts:
        name = f"{name}.{part}"
        if places is None:
            return f"no module named {name!r}"
        if not all(os.path.isdir(d) for d in places):
            return None  # a zip file or custom importer: let the import system decide
        packages = [os.path.join(d, part) for d in places if os.path.isdir(os.path.join(d, part))]
        if packages:
            places = packages
            continue
        suffixes = importlib.machinery.all_suffixes()
        if not any(os.path.isfile(os.path.join(d, part + s)) for d in places for s in suffixes):
            return f"no module named {name!r}"
        places = None
    if places is not None and all(os.path.isdir(d) for d in places) and not any(
            os.path.exists(os.path.join(d, "__main__.py")) for d in places):
        return f"{target!r} is a package without a __main__ module; name a module in it"
    return None


def _cmd_run(ns: argparse.Namespace) -> int:
    import dftrace

    target_argv = ns.target[1:] if ns.target[:1] == ["--"] else ns.target
    if not target_argv:
        print("dftrace run: give a script (or -m module) to run", file=sys.stderr)
        return 2
    target, *rest = target_argv
    if ns.module and os.getcwd() not in sys.path[:1]:  # as `python -m` puts it (the command's own is first)
        sys.path.insert(0, os.getcwd())
    problem = _missing_target(ns.module, target)
    if problem is not None:
        print(f"dftrace run: {problem}", file=sys.stderr)
        return 2
    if not ns.module:  # as python puts it, before tracing starts (io: a directory imports look up)
        target = _command_on_path(target) or target  # a console script named alone: `dftrace run torchrun ...`
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
    started_ns = time.time_ns()
    old_argv = sys.argv
    sys.argv = [target, *rest]  # before tracing starts: the trace's command line is the script's
    try:
        session = dftrace.initialize(**auto_unless_set(_trace_kwargs(ns)))
    except ConfigError as exc:
        sys.argv = old_argv
        print(f"dftrace run: {exc}", file=sys.stderr)
        return 2
    code = 0
    try:
        if ns.module:
            try:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            except ImportError as exc:
                missing = getattr(exc, "name", None)
                if not missing or not (target == missing or target.startswith(missing + ".")):
                    raise  # the module ran and failed to import something: its own error
                print(f"dftrace run: no module named {missing!r}", file=sys.stderr)
                code = 2
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        if code:
            from ._core.lifecycle import say_how_it_ended

            say_how_it_ended(f"exited with status {code}")
    except BaseException as exc:  # the program's own end: its trace says so, then it goes on
        from ._core.lifecycle import say_it_raised

        say_it_raised(exc)
        raise
    finally:
        sys.argv = old_argv
        dftrace.finalize()
        if session is not None:
            _say_where_the_trace_went(session, started_ns)
    return code


def _children_files(session: Any, paths: list[str], started_ns: int) -> list[str]:
    """The trace files of the run's child processes (DataLoader workers, pools,
    subprocesses, a launcher's ranks) and theirs: those of the session's prefix
    written since the run started whose process descends from this one, through
    processes that wrote a file or not (a forkserver's server writes none): each
    carries this run's clock anchor, handed down to every traced descendant. The
    other ranks of a job, each run by its own ``dftrace run``, are not its."""
    import glob

    from .format.names import is_trace_file

    found: dict[str, tuple[int, int, Any] | None] = {}
    for p in glob.glob(glob.escape(session.prefix) + "-*"):
        try:
            if p not in paths and is_trace_file(p) and os.stat(p).st_mtime_ns >= started_ns:
                found[p] = _process_of(p)
        except OSError:
            continue
    ours, kids = {os.getpid()}, []
    anchor = (session.wall_ns, session.mono_ns)
    while True:
        more = [p for p, ids in found.items()
                if ids is not None and (ids[1] in ours or ids[2] == anchor) and p not in kids]
        if not more:
            return sorted(kids)
        kids += more
        ours |= {found[p][0] for p in more}  # type: ignore[index]


def _process_of(path: str) -> tuple[int, int, Any] | None:
    """(pid, parent pid, clock anchor: (wall_ns, mono_ns) or None) from a trace file's
    first lines, or None without a process record."""
    from .format import META_CLOCK_ANCHOR, META_PROCESS_INFO
    from .format.reading import iter_trace_lines

    ids, anchor = None, None
    for number, line in enumerate(iter_trace_lines(path)):
        event = line.event
        name = event.get("name") if event is not None else None
        try:
            if name == META_PROCESS_INFO:
                ids = int(event["pid"]), int(event["args"]["ppid"])
            elif name == META_CLOCK_ANCHOR:
                anchor = int(event["args"]["wall_ns"]), int(event["args"]["mono_ns"])
        except (KeyError, TypeError, ValueError):
            return None
        if (ids is not None and anchor is not None) or number > 100:  # the header's records come first
            break
    return None if ids is None else (*ids, anchor)


def _say_where_the_trace_went(session: Any, started_ns: int) -> None:
    """After ``run``: the files written (the program's, and how many its children
    wrote) and the command to read them (on stderr: the program's own output stays its
    own), or that nothing was recorded."""
    from .format.reading import iter_line_pieces

    paths = [p for p in session.paths if os.path.exists(p)]
    children = _children_files(session, paths, started_ns)
    recorded = False
    for p in paths + children:  # a span among the first lines is enough: a long run's file is not read
        try:
            seen = 0
            for piece in iter_line_pieces(p):
                if b'"ph":"X"' in piece.data:
                    recorded = True
                seen += len(piece.data)
                if recorded or seen > 1 << 22:
                    break
        except Exception:
            recorded = True  # unreadable now (still being written): say where it is
        if recorded:
            break
    directory = os.path.dirname(session.prefix) or "."
    relative = os.path.relpath(directory)
    shown = shlex.quote(directory if relative.startswith("..") else relative)  # a command to paste
    files = ", ".join(p if relative.startswith("..") else os.path.relpath(p) for p in paths)
    if children:  # a launcher (torchrun) records nothing itself: its ranks do
        kids = f"{len(children)} file{'s' if len(children) != 1 else ''} of its child processes"
        files = f"{files} and {kids}" if files else kids
    files = files or "(none)"
    if not recorded:
        print(f"dftrace run: nothing was recorded: no annotated code ran and no PyTorch or Keras work was seen "
              f"(files: {files}); annotate your loop with ai.* (see the README) or check that the "
              "script trains", file=sys.stderr)
        return
    print(f"dftrace run: trace written to {files}\n"
          f"  next: dftrace summary {shown}   (or in Perfetto: dftrace view {shown})",
          file=sys.stderr)


def _at_least_one(text: str) -> int:
    """A count given on the command line: a whole number, 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number is needed, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"1 or more is needed, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dftrace", description="Trace AI/DL pipelines and read the traces.")
    from ._version import __version__
    p.add_argument("--version", action="version", version=f"dftrace {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    d = sub.add_parser("demo", help="run a bundled toy training pipeline with tracing on",
                       description="Run a toy training pipeline (no framework needed) with tracing "
                                   "on, then print where the trace went and what is in it.")
    d.add_argument("--out", default="dftrace-demo",
                   help="directory for the traces; each demo writes a new run-N directory in it "
                        "(default: %(default)s)")
    d.add_argument("--epochs", type=_at_least_one, default=3, help="epochs to train (default: %(default)s)")
    d.add_argument("--samples", type=_at_least_one, default=256,
                   help="samples in the toy dataset (default: %(default)s)")
    d.add_argument("--ddp", action="store_true",
                   help="run 2 DistributedDataParallel ranks instead (CPU, gloo, loopback; rank 1 made "
                        "slow on purpose); needs PyTorch")
    d.add_argument("--write-samples", nargs="?", const=".", metavar="DIR",
                   help="instead of a run, write the sample runs the documentation reads (traces/, "
                        "ddp-run/, ddp-buckets/, diff-runs/, gpu-job/, gpu-h200/, DFTracer's files) "
                        "into DIR (default: the current directory), then exit")
    _add_trace_options(d)
    d.set_defaults(func=_cmd_demo)

    r = sub.add_parser("run", help="run a Python script or module with tracing initialised",
                       description="Run SCRIPT [ARGS] (or -m MODULE [ARGS]) with tracing initialised "
                                   "from the options and DFTRACE_* variables; child processes trace too.")
    r.add_argument("-m", dest="module", action="store_true", help="run a module, like python -m")
    _add_trace_options(r)
    r.add_argument("target", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS]",
                   help="the script and its arguments (with -m: the module and its arguments); a "
                        "Python command on PATH named alone is found there (dftrace run torchrun ...)")
    r.set_defaults(func=_cmd_run)

    try:
        from .analysis import commands as analysis_cli
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
    switches = {a for act in parser._actions if act.nargs == "?" for a in act.option_strings}
    argv = list(argv)
    i = 1
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return argv
        if not tok.startswith("-") or tok == "-":
            break
        if tok in switches and (i + 1 >= len(argv) or argv[i + 1].lower() not in _SWITCH_VALUES):
            argv.insert(i + 1, "1")  # --io alone: --io 1
        i += 2 if tok in takes_value else 1
    return argv[:i] + ["--"] + argv[i:]


#: Other tracers' spellings of an option (viztracer's and py-spy's ``-o``), where the
#: command has an option of that meaning.
_OTHER_SPELLINGS = {"-o": "--log-file", "--output": "--log-file", "--output-file": "--log-file",
                    "--output_file": "--log-file", "--log_file": "--log-file"}


def _did_you_mean(word: str, known: list[str]) -> str:
    """ " (did you mean X?)" for the nearest of ``known`` to a mistyped ``word``."""
    import difflib

    if _OTHER_SPELLINGS.get(word) in known:
        return f" (did you mean {_OTHER_SPELLINGS[word]}?)"
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        run_parser = parser._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
        argv = _split_run(argv, run_parser)
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    if argv and not argv[0].startswith("-") and argv[0] not in commands:
        parser.error(f"unknown command {argv[0]!r}{_did_you_mean(argv[0], list(commands))}; "
                     f"the commands: {', '.join(commands)}")
    ns, extras = parser.parse_known_args(argv)
    if extras:
        # The command's own usage, with the options it has that the typo was closest to.
        command = commands.get(getattr(ns, "command", None) or "", parser)
        typo = next((e.split("=", 1)[0] for e in extras if e.startswith("-")), extras[0])
        command.error(f"unrecognized arguments: {' '.join(extras)}"
                      f"{_did_you_mean(typo, [s for a in command._actions for s in a.option_strings])}")
    if not getattr(ns, "func", None):
        parser.print_help()
        return 2
    return int(ns.func(ns) or 0)


if __name__ == "__main__":
    sys.exit(main())
