"""The analysis subcommands: summary, report, convert, merge, validate, diff, watch, sql, mcp, view.

``register(subparsers)`` adds them to an argparse subparsers object; each sets
``func`` to a callable taking the parsed arguments and returning the exit code.
Nothing heavy is imported until a command runs, so registering costs nothing and
``validate`` works without the analysis extra.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .runtime.deps import ANALYSIS, check_installed, missing_extra_message
from .runtime.heap import command_heap
from .runtime.polars_loading import load_polars

_EXECUTOR_HELP = """
Where the work runs: by default on threads in this process. --dask-workers N starts
a local Dask cluster of N worker processes; --scheduler ADDRESS uses a running Dask
scheduler (workers must see the same paths).
"""


class _DeprecatedRows(argparse.Action):
    """An old name of ``--rows`` (hidden): it still works, with a note on stderr."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"dftrace: {option_string} is deprecated; use --rows", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _rows_option(p: argparse.ArgumentParser, default: int, help: str, *old: str) -> None:
    """``--rows N``, the one name of every command's row limit; ``old`` are the names
    it had before (hidden, deprecated, still accepted)."""
    p.add_argument("--rows", type=int, default=default, metavar="N", help=help)
    for name in old:
        p.add_argument(name, dest="rows", type=int, action=_DeprecatedRows, help=argparse.SUPPRESS)


def register(subparsers: Any) -> None:
    """Add the analysis subcommands to ``subparsers`` (from ``add_subparsers()``)."""
    p = subparsers.add_parser(
        "summary",
        help="tables of where the time goes: categories, epochs, steps, overlap, stalls, stragglers",
        description="Summarise trace files: time per category and name (count, total, mean, "
        "p50/p95/max), epochs and steps, a time breakdown with overlap, data-loader stall and "
        "per-rank imbalance." + _EXECUTOR_HELP,
    )
    _inputs(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    _rows_option(p, 20, "rows of the longest tables (default 20)", "--top")
    _execution(p)
    _index_option(p)
    p.set_defaults(func=_run_summary)

    p = subparsers.add_parser(
        "report",
        help="one self-contained HTML file with plots",
        description="Write an HTML report (plotly, works offline): step timeline per rank, "
        "time breakdown, duration distributions, stragglers, data-loader stall." + _EXECUTOR_HELP,
    )
    _inputs(p)
    p.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")
    p.add_argument("--title", default="dftrace report", help="page title")
    _execution(p)
    _index_option(p)
    p.set_defaults(func=_run_report)

    p = subparsers.add_parser(
        "convert",
        help="to Chrome JSON (.json, .json.gz), dftrace's pfw (.pfw, .pfw.gz, .pfw.zst), Parquet "
        "or Perfetto's own format (.pftrace)",
        description="Convert traces (all inputs into one output). The output suffix picks the "
        "format: .json/.json.gz strict Chrome JSON for chrome://tracing and Perfetto, "
        ".pfw/.pfw.gz/.pfw.zst dftrace's own format (DFAnalyzer reads it too), .parquet for "
        "the events table, .pftrace/.perfetto-trace Perfetto's own protobuf format (a quarter "
        "of the JSON's size, which Perfetto opens where the JSON is too big; with flows between "
        "the calls of a collective; 'dftrace view' opens it)." + _EXECUTOR_HELP,
    )
    _inputs(p)
    p.add_argument("-o", "--output", required=True, help="output file")
    _to_option(p)
    _execution(p)
    p.set_defaults(func=_run_convert)

    p = subparsers.add_parser(
        "merge",
        help="many processes and ranks into one Perfetto-loadable file",
        description="Merge processes and ranks into one file with unique pids, processes named "
        "'rank R · host · pid' in rank order, and the clocks of each host's processes aligned "
        "from their recorded anchors. Filters keep big runs openable." + _EXECUTOR_HELP,
    )
    _inputs(p)
    p.add_argument("-o", "--output", default="merged.json.gz",
                   help="output file (default merged.json.gz; a .pftrace name writes Perfetto's own format)")
    _to_option(p)
    p.add_argument("--cat", action="append", metavar="CAT", help="keep only this category (repeatable)")
    p.add_argument("--start", type=float, metavar="S", help="keep events after S seconds from the start")
    p.add_argument("--end", type=float, metavar="S", help="keep events before S seconds from the start")
    p.add_argument("--steps", metavar="A[:B]", help="keep each rank's time of steps A to B (inclusive)")
    p.add_argument("--epoch", type=int, help="with --steps: the epoch the steps are in")
    p.add_argument("--no-align", action="store_true", help="leave timestamps as recorded")
    _execution(p)
    p.set_defaults(func=_run_merge)

    p = subparsers.add_parser(
        "validate",
        help="check trace files (and Parquet files from convert) against the format's rules",
        description="Check trace files against the trace format's rules ('dftrace validate --explain' "
        "lists them): '[' first, one JSON object per line, UTF-8 without surrogate "
        "escapes, metadata first, uint32 pid/tid, ts and dur in [0, 2**53], spans nested per "
        "thread, p_idx/level consistent. A last frame cut off by a kill is reported ('cut off at "
        "byte N, K events readable'), a file without its closing ']' as 'cut'; neither is a "
        "violation unless --strict. A .parquet file written by 'dftrace convert' is checked "
        "against the events table instead (needs the analysis extra). Exit code 1 if "
        "any file breaks a rule, 2 if a file cannot be read.",
    )
    p.add_argument("paths", nargs="*", help="trace files, directories or glob patterns")
    p.add_argument("--explain", nargs="?", const="", metavar="RULE",
                   help="say what RULE (the name validate prints in brackets) checks, or every rule")
    _rows_option(p, 50, "violations to print per file (default 50)", "--max")
    p.add_argument("--json", action="store_true", help="print violations as JSON")
    p.add_argument("--strict", action="store_true",
                   help="count a cut file (a last frame cut off mid-write, or no closing ']': a killed "
                   "process) as a violation")
    p.set_defaults(func=_run_validate)

    _register_diff_and_watch(subparsers)
    _register_sql(subparsers)
    _register_mcp(subparsers)
    _register_view(subparsers)


def _inputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="+",
        help="trace files (.pfw, .pfw.gz, .pfw.zst, DFTracer's, .json[.gz], .parquet), directories or globs",
    )


def _to_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--to", metavar="FORMAT",
                        help="the output format whatever the suffix: chrome, pfw, parquet or perfetto")


def _execution(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("execution")
    where = group.add_mutually_exclusive_group()
    where.add_argument("--dask-workers", type=int, metavar="N", help="run on a local Dask cluster of N workers")
    where.add_argument("--scheduler", metavar="ADDRESS", help="run on the Dask scheduler at ADDRESS")
    group.add_argument("--partition-mb", type=float, default=16, metavar="MB",
                       help="split compressed files into pieces of about MB on disk (default 16)")
    group.add_argument("--no-progress", action="store_true",
                       help="never show progress (on a terminal, a line for each phase that lasts over a second)")


def _index_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-index", action="store_true",
                        help="read every file, and keep nothing in the index of files already read "
                        "($DFTRACE_INDEX_DIR, else $XDG_CACHE_HOME/dftrace/index, at most "
                        "$DFTRACE_INDEX_MAX_SIZE bytes, 256M unless set)")


def _command(*needs: str) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """A command that needs the modules ``needs`` (checked before anything imports them)
    and turns expected failures (no such or unreadable file, bad option, missing extra) into a message."""

    def decorate(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        @functools.wraps(run)
        def wrapper(args: argparse.Namespace) -> int:
            command = f"dftrace {getattr(args, 'command', None) or ''}".strip()
            try:
                check_installed(*needs, needed_by=command)
                command_heap()
                if "polars" in needs:
                    load_polars()
                return run(args)
            except ImportError as exc:
                print(f"dftrace: error: {missing_extra_message(exc, command) or exc}", file=sys.stderr)
                return 2
            except BrokenPipeError:
                # the reader of the output went away (`| head`): stop quietly, and keep
                # the interpreter's last flush of stdout from failing again
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 0
            except (OSError, ValueError, argparse.ArgumentTypeError) as exc:
                print(f"dftrace: error: {_printable(str(exc))}", file=sys.stderr)
                return 2

        return wrapper

    return decorate


def file_threads() -> int:
    """Files (partitions) the summary reads at a time in this process: half the
    CPUs, at least one. polars spreads each piece's work over every CPU already, so
    more files at once add little speed and a piece's working memory each."""
    return max(1, min(os.cpu_count() or 1, 16) // 2)


class _Run:
    """The executor and options of one command, closed when the command ends."""

    def __init__(self, args: argparse.Namespace, threads: int | None = None):
        if args.scheduler or args.dask_workers:
            option = "--scheduler" if args.scheduler else "--dask-workers"
            check_installed("dask", "distributed", needed_by=option)
        from .runtime.executor import DaskExecutor, EmbeddedExecutor

        if args.scheduler:
            self.executor: Any = DaskExecutor(args.scheduler)
        elif args.dask_workers:
            self.executor = DaskExecutor(workers=args.dask_workers)
        else:
            self.executor = EmbeddedExecutor(threads)
        self.options = {
            "executor": self.executor,
            "partition_bytes": int(args.partition_mb * (1 << 20)),
            "progress": False if args.no_progress else None,
        }

    def __enter__(self) -> dict[str, Any]:
        return self.options

    def __exit__(self, *exc: object) -> None:
        self.executor.close()


@_command(*ANALYSIS)
def _run_summary(args: argparse.Namespace) -> int:
    from .render.text import render_text
    from .answers.summary import summarize

    with _Run(args, file_threads()) as options:
        summary = summarize(args.paths, **options, index=not args.no_index)
    if args.json:
        data = summary.to_json_bytes()
        del summary  # the answers as Python objects are let go once they are text
        _write_bytes(data, b"\n")
    else:
        sys.stdout.write(_printable(render_text(summary, top=args.rows)))
    return 0


def _write_bytes(*pieces: bytes) -> None:
    """Write UTF-8 text to stdout as bytes where it takes them (no decoded copy of a
    long output), else as text."""
    stream = getattr(sys.stdout, "buffer", None)
    if stream is None:
        for piece in pieces:
            sys.stdout.write(piece.decode())
        return
    sys.stdout.flush()
    for piece in pieces:
        stream.write(piece)
    stream.flush()


@_command(*ANALYSIS, "plotly")
def _run_report(args: argparse.Namespace) -> int:
    from .render.html import write_html
    from .answers.summary import summarize

    with _Run(args) as options:
        summary = summarize(args.paths, **options, index=not args.no_index)
    write_html(summary, args.output, title=args.title)
    print(f"wrote {args.output} ({os.path.getsize(args.output) / 1e6:.1f} MB)")
    return 0


@_command(*ANALYSIS)
def _run_convert(args: argparse.Namespace) -> int:
    from .export.perfetto import output_kind
    from .export.streamed import convert

    output_kind(args.output, args.to)  # fail on an unknown suffix before reading anything
    with _Run(args) as options:
        written = convert(args.paths, args.output, to=args.to, **options)
    print(f"wrote {args.output}: {_events_of(written)}")
    return 0


@_command(*ANALYSIS)
def _run_merge(args: argparse.Namespace) -> int:
    from .export.perfetto import output_kind
    from .export.tables import MergeFilter
    from .export.streamed import merge_files

    output_kind(args.output, args.to)
    keep = MergeFilter(
        categories=args.cat, start_s=args.start, end_s=args.end, steps=_step_range(args.steps), epoch=args.epoch
    )
    with _Run(args) as options:
        written = merge_files(args.paths, args.output, keep, align_clocks=not args.no_align, to=args.to, **options)
    print(f"wrote {args.output}: {_events_of(written)}")
    return 0


def _events_of(written: Any) -> str:
    from .answers.units import count_of

    broken = sum(f.broken_count for f in written.trace.files)
    skipped = f" ({count_of(broken, 'broken line')} left out; dftrace summary lists them)" if broken else ""
    if written.left_out:
        phases = ", ".join(f"{n} of phase {ph!r}" for ph, n in sorted(written.left_out.items()))
        skipped += f" (events the format has no place for left out: {phases})"
    return (f"{count_of(written.events, 'event')} of "
            f"{count_of(written.trace.processes.height, 'process', 'processes')}{skipped}")


def _step_range(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    first, _, last = text.partition(":")
    try:
        return int(first), int(last or first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--steps wants A or A:B, got {text!r}") from None


def _explain_rules(rule: str) -> int:
    """Print what ``rule`` checks (every rule when it is empty)."""
    import difflib

    from ..format.rules import RULES

    if rule and rule not in RULES:
        close = difflib.get_close_matches(rule, list(RULES), n=1)
        raise ValueError(f"no rule named {rule!r}" + (f" (did you mean {close[0]}?)" if close else "")
                         + f"; the rules: {', '.join(RULES)}")
    for name, what in RULES.items():
        if not rule or name == rule:
            print(f"[{name}] {what}")
    return 0


@_command()
def _run_validate(args: argparse.Namespace) -> int:
    import orjson

    from .read.checks import violations_of
    from .read.sources import expand_paths

    if args.explain is not None:
        return _explain_rules(args.explain)
    if not args.paths:
        raise ValueError("validate needs the trace files, directories or patterns to check (or --explain)")
    failed = 0
    report: dict[str, list[dict[str, Any]]] = {}
    for path in expand_paths(args.paths):
        torn: list[Any] = []
        violations = violations_of(path, strict=args.strict, torn=torn)
        failed += bool(violations)
        report[path] = [v._asdict() for v in violations]
        if args.json:
            continue
        if not violations:
            print(f"{path}: OK" + (f" ({torn[0]})" if torn else ""))
            continue
        print(f"{path}: {len(violations)} violation{'s' if len(violations) > 1 else ''}")
        for v in violations[: args.rows]:
            print(f"  {_printable(str(v))}")
        if len(violations) > args.rows:
            print(f"  ... {len(violations) - args.rows} more")
    if args.json:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif failed:
        print("each [rule] is explained by: dftrace validate --explain RULE")
    return 1 if failed else 0


# --- diff and watch ------------------------------------------------------------------


def _register_diff_and_watch(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "diff",
        help="compare two runs: step time, names, breakdown, stalls, stragglers; guard CI",
        description="Compare two runs side by side (BASE first): step time p50/p95, epoch time, "
        "per category and name count/total/mean/p95, the time breakdown, data-loader stall, "
        "the straggler, events and dropped events, each with its absolute and relative change. "
        "Figures that moved beyond --threshold (and names whose count changed) are flagged "
        "and listed first, largest effect on step time first. Runs may have different numbers "
        "of ranks and be written by dftrace or DFTracer. Each change comes with a 95 % interval "
        "from the noise: the spread over several runs per side (--base/--new repeated, or a "
        "directory of runs), else, for step figures, the spread over blocks of steps. Exit code 1 "
        "when --fail-on-regression is given and the --metric got worse by more than it and "
        "outside the noise, 2 when a run cannot be read."
        + _EXECUTOR_HELP,
    )
    p.add_argument("base", help="the reference run: trace files, a directory or a glob; a directory "
                   "whose subdirectories hold the traces is several runs, one per subdirectory")
    p.add_argument("new", help="the run to check, as BASE")
    p.add_argument("--base", dest="more_base", action="append", default=[], metavar="RUN",
                   help="another run of the reference (repeat for more): the spread of each figure "
                   "over a side's runs is the noise its change is judged against")
    p.add_argument("--new", dest="more_new", action="append", default=[], metavar="RUN",
                   help="another run of the run to check (repeat for more)")
    p.add_argument("--threshold", default="5%", metavar="PCT",
                   help="relative change below which a figure is noise (default 5%%)")
    p.add_argument("--fail-on-regression", metavar="PCT",
                   help="exit with code 1 when --metric got worse (larger) by more than PCT (e.g. 10%%)")
    p.add_argument("--metric", default="step.p50", metavar="KEY",
                   help="the figure --fail-on-regression guards (default step.p50; any metric key of "
                   "the output, such as step.p95, epoch.time or compute.forward.mean)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    _rows_option(p, 20, "flagged rows, and names per category table, to print (default 20)", "--top")
    _execution(p)
    p.set_defaults(func=_run_diff)

    p = subparsers.add_parser(
        "watch",
        help="live view of a running job from its trace files",
        description="Follow trace files while they are written: per rank the current epoch and "
        "step, steps per second, step time p50/p95 over the recent steps, data-loader stall, "
        "communication wait and the straggler; totals; files that stopped growing or were cut off. "
        "Reads only the bytes added since the last look, picks up new files (a directory or glob "
        "is searched again), and exits by itself when no file will grow again: each closed, cut "
        "off with its writer gone (a process of this host that no longer runs), or naming no "
        "writer and not grown for --stale seconds; or on Ctrl-C (exit code 0). "
        "Without a terminal it prints plain snapshots.",
    )
    p.add_argument("paths", nargs="+", help="trace files, directories or globs (quote globs)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between refreshes (default 1)")
    p.add_argument("--window", type=int, default=50, metavar="N",
                   help="recent steps per rank for steps/s, p50/p95 and the straggler (default 50)")
    p.add_argument("--stale", type=float, default=10.0, metavar="S",
                   help="an open file that did not grow for S seconds is shown as stalled (default 10)")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--json", action="store_true", help="with --once: the snapshot as JSON")
    p.set_defaults(func=_run_watch)


@_command(*ANALYSIS)
def _run_diff(args: argparse.Namespace) -> int:
    from .answers.diff import compare_summaries
    from .render.diff import parse_percent, render_diff
    from .answers.step_shifts import step_times
    from .read.sources import runs_in
    from .answers.summary import summarize

    threshold = parse_percent(args.threshold)
    limit = parse_percent(args.fail_on_regression) if args.fail_on_regression is not None else None
    runs = ([run for path in [args.base, *args.more_base] for run in runs_in(path)],
            [run for path in [args.new, *args.more_new] for run in runs_in(path)])
    steps = None
    with _Run(args) as options:
        base = [summarize([run], **options) for run in runs[0]]
        new = [summarize([run], **options) for run in runs[1]]
        if len(base) == len(new) == 1:
            steps = (step_times([runs[0][0]], partition_bytes=options["partition_bytes"]),
                     step_times([runs[1][0]], partition_bytes=options["partition_bytes"]))
    diff = compare_summaries(base, new, threshold=threshold, steps=steps)
    failure = diff.regression(args.metric, limit) if limit is not None else None
    if args.json:
        data = diff.to_dict()
        if limit is not None:
            data["regression"] = {"metric": args.metric, "limit": limit, "failed": failure is not None,
                                  "reason": failure}
        sys.stdout.write(_json_text(data) + "\n")
    else:
        sys.stdout.write(_printable(render_diff(diff, args.base, args.new, top=args.rows)))
    if failure is not None:
        print(f"dftrace diff: regression: {_printable(failure)}", file=sys.stderr)
        return 1
    return 0


def _printable(text: str) -> str:
    from .render.terminal import printable

    return printable(text)


def _json_text(data: Any) -> str:
    import orjson

    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()


@_command(*ANALYSIS, "rich")
def _run_watch(args: argparse.Namespace) -> int:
    from .render.watch import watch

    if args.json and not args.once:
        raise ValueError("--json needs --once (a live view is for people)")
    if args.interval <= 0 or args.window < 2 or args.stale <= 0:
        raise ValueError("--interval and --stale must be > 0 and --window at least 2")
    return watch(args.paths, interval=args.interval, window=args.window, stale_s=args.stale,
                 once=args.once, as_json=args.json)


# --- dftrace sql ------------------------------------------------------------------

_SQL_TABLES = """
tables:
  events       one row per event (metadata records left out):
               pid, tid, rank, host, cat, name, ph, ts, dur (µs), id, parent_id, level,
               epoch, step, count, incomplete, group, seq, args (all args as JSON text),
               and one column per other arg found in the first events of each file
               (bytes, size, lr, ...; named arg_<key> when the key is a column name)
  spans        complete events (ph 'X') with end = ts + dur (file calls: see io)
  steps        one row per step per rank, by the summary's step model:
               rank, unit, epoch, step, ts, end, dur, n_spans
  collectives  communication spans: rank, host, pid, tid, name, group, seq, ts, dur,
               end, bytes, epoch, step
  kernels      GPU activity of PyTorch profiler traces: rank, host, pid, device, stream,
               cat, name, type, ts, end, dur (µs, ns resolution), correlation,
               launch_name, launch_tid, launch_ts, queued, counted
  gpu          GPU answers per rank and device (see docs/analysis.md, GPU traces)
  span_gpu     spans with the kernels launched inside them: ..., kernels, kernel_us
  io           traced file calls (cat POSIX, STDIO), one row each: pid, host, rank, tid,
               ts, dur, name, cat, category (read, write, metadata, sync, other), path,
               bytes, count, offset, calls

Only the columns a query names are decoded. The SQL is polars' dialect (SELECT, WHERE,
GROUP BY, JOIN, WITH, window functions, ...); quote names that are SQL words: "group".

examples:
  dftrace sql "SELECT name, count(*) AS n, sum(dur) AS total_us FROM spans
               GROUP BY name ORDER BY total_us DESC LIMIT 10" traces/
  dftrace sql "SELECT rank, max(dur) FROM steps GROUP BY rank" traces/ -o slowest.parquet
"""


def _register_sql(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sql",
        help="answer a question with one SQL query over the events table and its views",
        description="Run one SQL query over trace files and print its result (a table on the\n"
        "terminal, --csv, --json) or write it (-o FILE.parquet|.csv|.json)." + _EXECUTOR_HELP,
        epilog=_SQL_TABLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("query", help="the SQL query (tables: events, spans, steps, collectives)")
    _inputs(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--csv", action="store_true", help="print the result as CSV")
    out.add_argument("--json", action="store_true", help="print the result as a JSON array of rows")
    out.add_argument("-o", "--output", metavar="FILE", help="write the result to FILE (.parquet, .csv or .json)")
    _rows_option(p, 100, "rows of the terminal table (default 100; -1 for all)", "--max-rows")
    p.add_argument("--allow-file-functions", action="store_true",
                   help="let the query call polars' table functions that read files (read_csv(...), ...); "
                   "without it a query reads only the traces given")
    _execution(p)
    p.set_defaults(func=_run_sql)


@_command(*ANALYSIS)
def _run_sql(args: argparse.Namespace) -> int:
    import polars as pl

    from .answers.sql import check_output, result_json, result_table, run_sql, write_result

    if args.output:
        check_output(args.output)
    try:
        with _Run(args) as options:
            broken: list[int] = []
            result = run_sql(args.query, args.paths, allow_file_functions=args.allow_file_functions,
                             broken=broken, **options)
    except pl.exceptions.PolarsError as exc:
        # polars explains a bad query in its first line; the plan dump after it is noise.
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"dftrace: error: in the query: {_printable(message)}", file=sys.stderr)
        return 2
    if sum(broken):
        print(f"dftrace sql: {sum(broken)} broken line{'s' if sum(broken) != 1 else ''} of the input left out "
              "(dftrace summary lists them)", file=sys.stderr)
    if args.output:
        write_result(result, args.output)
        print(f"wrote {args.output}: {result.height} rows")
    elif args.csv:
        csv = result.write_csv()
        sys.stdout.write(_printable(csv) if sys.stdout.isatty() else csv)
    elif args.json:
        sys.stdout.buffer.write(result_json(result))
    else:
        sys.stdout.write(_printable(result_table(result, args.rows)))
    return 0


# --- dftrace mcp ------------------------------------------------------------------


def _register_mcp(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "mcp",
        help="answer LLM agents: a Model Context Protocol server over stdio",
        description="Serve the analysis's answers to an LLM agent as a Model Context Protocol server on "
        "stdin/stdout (an MCP client starts it): tools list_runs, summary, steps, stragglers, "
        "dataloader, gpu, io, breakdown, diff, sql and validate, each answering as JSON. Only "
        "traces under the roots are read. Needs the mcp extra; docs/agents.md shows the set-up.",
    )
    p.add_argument("--root", action="append", metavar="DIR",
                   help="a directory whose traces the tools may read (repeatable; default: the current "
                   "directory); a relative path in a call is taken from the first")
    p.set_defaults(func=_run_mcp)


@_command(*ANALYSIS, "mcp")
def _run_mcp(args: argparse.Namespace) -> int:
    from .agent_server import serve

    return serve(args.root or [os.getcwd()])


# --- dftrace view ---------------------------------------------------------------------


def _register_view(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "view",
        help="open a trace in Perfetto's UI: served from this machine, nothing uploaded",
        description="Open traces in Perfetto's UI in one command. A .pftrace, or one Chrome JSON or "
        "pfw file Perfetto reads (up to 64 MB), is served as it is; a directory, several files or "
        "a bigger file are merged into a .pftrace first (ranks in order, clocks aligned), in a "
        "temporary folder removed at the end (or kept with -o). The file is served on "
        "127.0.0.1:PORT to the UI, which the browser opens at UI/#!/?url=http://127.0.0.1:PORT/NAME; "
        "on a remote machine forward the port (the command prints the ssh -L line). Serves until "
        "Ctrl-C (exit code 0), or with --once until the UI has fetched the trace." + _EXECUTOR_HELP,
    )
    _inputs(p)
    p.add_argument("--port", type=int, default=9001,
                   help="the port on 127.0.0.1 to serve the trace from (default 9001, where the UI looks)")
    p.add_argument("--no-browser", action="store_true", help="print the URL only; open no browser")
    p.add_argument("--ui", default="https://ui.perfetto.dev", metavar="URL",
                   help="a Perfetto UI of your own instead of https://ui.perfetto.dev")
    p.add_argument("--once", action="store_true", help="exit once the UI has fetched the trace")
    p.add_argument("-o", "--output", metavar="FILE.pftrace", help="keep the converted trace at FILE.pftrace")
    _execution(p)
    p.set_defaults(func=_run_view)


@_command(*ANALYSIS)
def _run_view(args: argparse.Namespace) -> int:
    from .export.viewer import view

    with _Run(args) as options:
        return view(args.paths, port=args.port, ui=args.ui, browser=not args.no_browser, once=args.once,
                    output=args.output, **options)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one analysis subcommand, as ``dftrace <command>`` does."""
    parser = argparse.ArgumentParser(prog="dftrace", description="Analyse dftrace and DFTracer traces.")
    register(parser.add_subparsers(dest="command", required=True, metavar="command"))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
