"""The analysis subcommands: summary, report, convert, merge, validate, diff, watch, sql, mcp, view.

``register(subparsers)`` adds them to an argparse subparsers object; each sets
``func`` to a callable taking the parsed arguments and returning the exit code.
Nothing heavy is imported until a command runs, so registering costs nothing and
``validate`` works without the analysis extra. What every command is made of is in
``command_parts``; ``sql``, ``view`` and ``mcp`` are in ``tool_commands``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from .command_parts import (EXECUTOR_HELP, Run, command, execution_options, file_threads,
                            inputs_argument, json_text, printable_text, rows_option, subcommand, to_option,
                            write_bytes)
from .runtime.deps import ANALYSIS
from .tool_commands import register_mcp, register_sql, register_view


def register(subparsers: Any) -> None:
    """Add the analysis subcommands to ``subparsers`` (from ``add_subparsers()``)."""
    p = subcommand(
        subparsers, "summary", _run_summary,
        help="tables of where the time goes: categories, epochs, steps, overlap, stalls, stragglers",
        description="""\
            Summarise trace files: time per category and name (count, total, mean, p50/p95/max),
            epochs and steps, a time breakdown with overlap, data-loader stall and per-rank
            imbalance.""" + EXECUTOR_HELP,
    )
    inputs_argument(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    rows_option(p, 20, "rows of the longest tables (default 20)", "--top")
    execution_options(p, index=True)

    p = subcommand(
        subparsers, "report", _run_report,
        help="one self-contained HTML file with plots",
        description="""\
            Write an HTML report (plotly, works offline): step timeline per rank, time breakdown,
            duration distributions, stragglers, data-loader stall.""" + EXECUTOR_HELP,
    )
    inputs_argument(p)
    p.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")
    p.add_argument("--title", default="dftrace report", help="page title")
    execution_options(p, index=True)

    p = subcommand(
        subparsers, "convert", _run_convert,
        help="to Chrome JSON (.json, .json.gz), dftrace's pfw (.pfw, .pfw.gz, .pfw.zst), Parquet "
        "or Perfetto's own format (.pftrace)",
        description="""\
            Convert traces (all inputs into one output). The output suffix picks the format:
            .json/.json.gz strict Chrome JSON for chrome://tracing and Perfetto,
            .pfw/.pfw.gz/.pfw.zst dftrace's own format (DFAnalyzer reads it too), .parquet for the
            events table, .pftrace/.perfetto-trace Perfetto's own protobuf format (a quarter of the
            JSON's size, which Perfetto opens where the JSON is too big; with flows between the
            calls of a collective; 'dftrace view' opens it).""" + EXECUTOR_HELP,
    )
    inputs_argument(p)
    p.add_argument("-o", "--output", required=True, help="output file")
    to_option(p)
    execution_options(p)

    p = subcommand(
        subparsers, "merge", _run_merge,
        help="many processes and ranks into one Perfetto-loadable file",
        description="""\
            Merge processes and ranks into one file with unique pids, processes named 'rank R · host
            · pid' in rank order, and the clocks of each host's processes aligned from their
            recorded anchors. Filters keep big runs openable.""" + EXECUTOR_HELP,
    )
    inputs_argument(p)
    p.add_argument("-o", "--output", default="merged.json.gz",
                   help="output file (default merged.json.gz; a .pftrace name writes Perfetto's own format)")
    to_option(p)
    p.add_argument("--cat", action="append", metavar="CAT", help="keep only this category (repeatable)")
    p.add_argument("--start", type=float, metavar="S", help="keep events after S seconds from the start")
    p.add_argument("--end", type=float, metavar="S", help="keep events before S seconds from the start")
    p.add_argument("--steps", metavar="A[:B]", help="keep each rank's time of steps A to B (inclusive) of each epoch")
    p.add_argument("--epoch", type=int, help="with --steps: only that epoch's steps")
    p.add_argument("--no-align", action="store_true", help="leave timestamps as recorded")
    execution_options(p)

    p = subcommand(
        subparsers, "validate", _run_validate,
        help="check trace files (and Parquet files from convert) against the format's rules",
        description="""\
            Check trace files against the trace format's rules ('dftrace validate --explain' lists
            them): '[' first, one JSON object per line, UTF-8 without surrogate escapes, metadata
            first, uint32 pid/tid, ts and dur in [0, 2**53], spans nested per thread, p_idx/level
            consistent. A last frame cut off by a kill is reported ('cut off at byte N, K events
            readable'), a file without its closing ']' as 'cut'; neither is a violation unless
            --strict. A .parquet file written by 'dftrace convert' is checked against the events
            table instead (needs the analysis extra). Exit code 1 if any file breaks a rule, 2 if a
            file cannot be read.""",
    )
    p.add_argument("paths", nargs="*", help="trace files, directories or glob patterns")
    p.add_argument("--explain", nargs="?", const="", metavar="RULE",
                   help="say what RULE (the name validate prints in brackets) checks, or every rule")
    rows_option(p, 50, "violations to print per file (default 50)", "--max")
    p.add_argument("--json", action="store_true", help="print violations as JSON")
    p.add_argument("--strict", action="store_true",
                   help="count a cut file (a last frame cut off mid-write, or no closing ']': a killed "
                   "process) as a violation")

    _register_diff_and_watch(subparsers)
    register_sql(subparsers)
    register_mcp(subparsers)
    register_view(subparsers)


@command(*ANALYSIS)
def _run_summary(args: argparse.Namespace) -> int:
    from .render.text import render_text
    from .answers.summary import summarize

    with Run(args, file_threads()) as options:
        summary = summarize(args.paths, **options, index=not args.no_index)
    if args.json:
        data = summary.to_json_bytes()
        del summary  # the answers as Python objects are let go once they are text
        write_bytes(data, b"\n")
    else:
        sys.stdout.write(printable_text(render_text(summary, top=args.rows)))
    return 0


@command(*ANALYSIS, "plotly")
def _run_report(args: argparse.Namespace) -> int:
    from .render.html import write_html
    from .answers.summary import summarize

    with Run(args) as options:
        summary = summarize(args.paths, **options, index=not args.no_index)
    write_html(summary, args.output, title=args.title)
    print(f"wrote {args.output} ({os.path.getsize(args.output) / 1e6:.1f} MB)")
    return 0


@command(*ANALYSIS)
def _run_convert(args: argparse.Namespace) -> int:
    from .export.perfetto import output_kind
    from .export.streamed import convert

    output_kind(args.output, args.to)  # fail on an unknown suffix before reading anything
    with Run(args) as options:
        written = convert(args.paths, args.output, to=args.to, **options)
    print(f"wrote {args.output}: {_events_of(written)}")
    return 0


@command(*ANALYSIS)
def _run_merge(args: argparse.Namespace) -> int:
    from .export.perfetto import output_kind
    from .export.tables import MergeFilter
    from .export.streamed import merge_files

    output_kind(args.output, args.to)
    if args.epoch is not None and args.steps is None:
        raise ValueError("--epoch chooses the epoch of --steps: give --steps A[:B] too")
    if args.start is not None and args.end is not None and args.start > args.end:
        raise ValueError(f"--start {args.start:g} is after --end {args.end:g}")
    keep = MergeFilter(
        categories=args.cat, start_s=args.start, end_s=args.end, steps=_step_range(args.steps), epoch=args.epoch
    )
    with Run(args) as options:
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
    if written.copies:
        from .render.text import copies_left_out

        skipped += f"; {copies_left_out(written.copies)}"
    return (f"{count_of(written.events, 'event')} of "
            f"{count_of(written.trace.processes.height, 'process', 'processes')}{skipped}")


def _step_range(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    first, _, last = text.partition(":")
    try:
        steps = int(first), int(last or first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--steps wants A or A:B, got {text!r}") from None
    if steps[0] > steps[1]:
        raise argparse.ArgumentTypeError(f"--steps {text}: the first step is after the last")
    return steps


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


@command()
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
            print(f"  {printable_text(str(v))}")
        if len(violations) > args.rows:
            print(f"  ... {len(violations) - args.rows} more")
    if args.json:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif failed:
        print("each [rule] is explained by: dftrace validate --explain RULE")
    return 1 if failed else 0


# --- diff and watch ------------------------------------------------------------------


def _register_diff_and_watch(subparsers: Any) -> None:
    p = subcommand(
        subparsers, "diff", _run_diff,
        help="compare two runs: step time, names, breakdown, stalls, stragglers; guard CI",
        description="""\
            Compare two runs side by side (BASE first): step time p50/p95, epoch time, per category
            and name count/total/mean/p95, the time breakdown, data-loader stall, the straggler,
            events and dropped events, each with its absolute and relative change. Figures that
            moved beyond --threshold (and names whose count changed) are flagged and listed first,
            largest effect on step time first. Runs may have different numbers of ranks and be
            written by dftrace or DFTracer. Each change comes with a 95 % interval from the noise:
            the spread over several runs per side (--base/--new repeated, or a directory of runs),
            else, for step figures, the spread over blocks of steps. Exit code 1 when
            --fail-on-regression is given and the --metric got worse by more than it and outside the
            noise, 2 when a run cannot be read."""
        + EXECUTOR_HELP,
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
    rows_option(p, 20, "flagged rows, and names per category table, to print (default 20)", "--top")
    execution_options(p, index=True)

    p = subcommand(
        subparsers, "watch", _run_watch,
        help="live view of a running job from its trace files",
        description="""\
            Follow trace files while they are written: per rank the current epoch and step, steps
            per second, step time p50/p95 over the recent steps, data-loader stall, communication
            wait and the straggler; totals; files that stopped growing or were cut off. Reads only
            the bytes added since the last look, picks up new files (a directory or glob is searched
            again), and exits by itself when no file will grow again: each closed, cut off with its
            writer gone (a process of this host that no longer runs), or naming no writer and not
            grown for --stale seconds; or on Ctrl-C (exit code 0). Without a terminal it prints
            plain snapshots.""",
    )
    p.add_argument("paths", nargs="+", help="trace files, directories or globs (quote globs)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between refreshes (default 1)")
    p.add_argument("--window", type=int, default=50, metavar="N",
                   help="recent steps per rank for steps/s, p50/p95 and the straggler (default 50)")
    p.add_argument("--stale", type=float, default=10.0, metavar="S",
                   help="an open file that did not grow for S seconds is shown as stalled (default 10)")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--json", action="store_true", help="with --once: the snapshot as JSON")


@command(*ANALYSIS)
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
    with Run(args) as options:
        base = [summarize([run], **options, index=not args.no_index) for run in runs[0]]
        new = [summarize([run], **options, index=not args.no_index) for run in runs[1]]
        if len(base) == len(new) == 1:
            steps = tuple(step_times([side[0]], partition_bytes=options["partition_bytes"],
                                     executor=options["executor"]) for side in runs)
    diff = compare_summaries(base, new, threshold=threshold, steps=steps)
    failure = diff.regression(args.metric, limit) if limit is not None else None
    explained = diff.explained(args.metric, limit) if limit is not None else None
    if args.json:
        data = diff.to_dict()
        if limit is not None:
            data["regression"] = {"metric": args.metric, "limit": limit, "failed": failure is not None,
                                  "reason": failure, "explained": explained}
        sys.stdout.write(json_text(data) + "\n")
    else:
        sys.stdout.write(printable_text(render_diff(diff, args.base, args.new, top=args.rows)))
    if failure is not None:
        print(f"dftrace diff: regression: {printable_text(failure)}", file=sys.stderr)
        return 1
    if explained is not None:
        print(f"dftrace diff: no regression, but: {printable_text(explained)}", file=sys.stderr)
    return 0


@command(*ANALYSIS, "rich")
def _run_watch(args: argparse.Namespace) -> int:
    from .render.watch import watch

    if args.json and not args.once:
        raise ValueError("--json needs --once (a live view is for people)")
    if args.interval <= 0 or args.window < 2 or args.stale <= 0:
        raise ValueError("--interval and --stale must be > 0 and --window at least 2")
    return watch(args.paths, interval=args.interval, window=args.window, stale_s=args.stale,
                 once=args.once, as_json=args.json)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one analysis subcommand, as ``dftrace <command>`` does."""
    parser = argparse.ArgumentParser(prog="dftrace", description="Analyse dftrace and DFTracer traces.")
    register(parser.add_subparsers(dest="command", required=True, metavar="command"))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
