"""The subcommands that hand the traces to other tools: ``sql`` (queries), ``view``
(Perfetto's UI) and ``mcp`` (LLM agents, over the Model Context Protocol)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .command_parts import (EXECUTOR_HELP, Run, command, execution_options, inputs_argument, printable_text, rows_option,
                            subcommand)
from .read.sources import SQL_PARTITION_BYTES
from .runtime.deps import ANALYSIS

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

Only the columns a query names are decoded; events reach the query a few pieces of the
files at a time, so a query that reduces them holds about those pieces and its result.
The SQL is polars' dialect (SELECT, WHERE,
GROUP BY, JOIN, WITH, window functions, ...); quote names that are SQL words: "group", "offset".

examples:
  dftrace sql "SELECT name, count(*) AS n, sum(dur) AS total_us FROM spans
               GROUP BY name ORDER BY total_us DESC LIMIT 10" traces/
  dftrace sql "SELECT rank, max(dur) FROM steps GROUP BY rank" traces/ -o slowest.parquet
"""


def register_sql(subparsers: Any) -> None:
    p = subcommand(
        subparsers, "sql", _run_sql,
        help="answer a question with one SQL query over the events table and its views",
        description="Run one SQL query over trace files and print its result (a table on the\n"
        "terminal, --csv, --json) or write it (-o FILE.parquet|.csv|.json)." + EXECUTOR_HELP,
        epilog=_SQL_TABLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("query", help="the SQL query (tables: events, spans, steps, collectives, kernels, "
                   "gpu, span_gpu, io; their columns below)")
    inputs_argument(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--csv", action="store_true", help="print the result as CSV")
    out.add_argument("--json", action="store_true", help="print the result as a JSON array of rows")
    out.add_argument("-o", "--output", metavar="FILE", help="write the result to FILE (.parquet, .csv or .json)")
    rows_option(p, 100, "rows of the terminal table (default 100; -1 for all)", "--max-rows", all_rows=True)
    p.add_argument("--allow-file-functions", action="store_true",
                   help="let the query call polars' table functions that read files (read_csv(...), ...); "
                   "without it a query reads only the traces given")
    execution_options(p, partition_mb=SQL_PARTITION_BYTES / (1 << 20))


@command(*ANALYSIS)
def _run_sql(args: argparse.Namespace) -> int:
    import polars as pl

    from .answers.sql import check_output, query_error_text, result_json, result_table, run_sql, write_result

    if args.output:
        check_output(args.output)
    if os.path.exists(args.query) and any(not os.path.exists(p) and " " in p for p in args.paths):
        print("dftrace sql: the query comes first, then the traces: dftrace sql QUERY PATHS...",
              file=sys.stderr)
        return 2
    try:
        with Run(args) as options:
            broken: list[int] = []
            copies: list[dict[str, str]] = []
            result = run_sql(args.query, args.paths, allow_file_functions=args.allow_file_functions,
                             broken=broken, copies=copies, **options)
    except pl.exceptions.PolarsError as exc:
        print(f"dftrace: error: in the query: {printable_text(query_error_text(exc))}", file=sys.stderr)
        return 2
    if copies:
        from .render.text import copies_left_out

        print(f"dftrace sql: {copies_left_out(copies)}", file=sys.stderr)
    if sum(broken):
        print(f"dftrace sql: {sum(broken)} broken line{'s' if sum(broken) != 1 else ''} of the input left out "
              "(dftrace summary lists them)", file=sys.stderr)
    if args.output:
        write_result(result, args.output)
        print(f"wrote {args.output}: {result.height} rows")
    elif args.csv:
        csv = result.write_csv()
        sys.stdout.write(printable_text(csv) if sys.stdout.isatty() else csv)
    elif args.json:
        sys.stdout.buffer.write(result_json(result))
    else:
        sys.stdout.write(printable_text(result_table(result, args.rows)))
    return 0


# --- dftrace mcp ------------------------------------------------------------------


def register_mcp(subparsers: Any) -> None:
    p = subcommand(
        subparsers, "mcp", _run_mcp,
        help="answer LLM agents: a Model Context Protocol server over stdio",
        description="""\
            Serve the analysis's answers to an LLM agent as a Model Context Protocol server on
            stdin/stdout (an MCP client starts it): tools list_runs, summary, steps, stragglers,
            dataloader, gpu, io, breakdown, diff, sql and validate, each answering as JSON. Only
            traces under the roots are read. Needs the mcp extra; docs/agents.md shows the set-up.""",
    )
    p.add_argument("--root", action="append", metavar="DIR",
                   help="a directory whose traces the tools may read (repeatable; default: the current "
                   "directory); a relative path in a call is taken from the first")


@command(*ANALYSIS, "mcp")
def _run_mcp(args: argparse.Namespace) -> int:
    from .agent_server import serve

    return serve(args.root or [os.getcwd()])


# --- dftrace view ---------------------------------------------------------------------


def register_view(subparsers: Any) -> None:
    p = subcommand(
        subparsers, "view", _run_view,
        help="open a trace in Perfetto's UI: served from this machine, nothing uploaded",
        description="""\
            Open traces in Perfetto's UI in one command. A .pftrace, or one Chrome JSON or pfw file
            Perfetto reads (up to 64 MB), is served as it is; a directory, several files or a bigger
            file are merged into a .pftrace first (ranks in order, clocks aligned), in a temporary
            folder removed at the end (or kept with -o). The file is served on 127.0.0.1:PORT to the
            UI, which the browser opens at UI/#!/?url=http://127.0.0.1:PORT/NAME; on a remote
            machine forward the port (the command prints the ssh -L line). Serves until Ctrl-C (exit
            code 0), or with --once until the UI has fetched the trace.""" + EXECUTOR_HELP,
    )
    inputs_argument(p)
    p.add_argument("--port", type=int, default=9001,
                   help="the port on 127.0.0.1 to serve the trace from (default 9001, where the UI looks)")
    p.add_argument("--no-browser", action="store_true", help="print the URL only; open no browser")
    p.add_argument("--ui", default="https://ui.perfetto.dev", metavar="URL",
                   help="a Perfetto UI of your own instead of https://ui.perfetto.dev")
    p.add_argument("--once", action="store_true", help="exit once the UI has fetched the trace")
    p.add_argument("-o", "--output", metavar="FILE.pftrace", help="keep the converted trace at FILE.pftrace")
    execution_options(p)


@command(*ANALYSIS)
def _run_view(args: argparse.Namespace) -> int:
    from .export.viewer import view

    with Run(args) as options:
        return view(args.paths, port=args.port, ui=args.ui, browser=not args.no_browser, once=args.once,
                    output=args.output, **options)
