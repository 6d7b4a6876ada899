"""What every analysis subcommand is made of: the shared arguments (inputs, execution,
rows, index, output format), the wrapper that checks extras and turns expected
failures into one line (:func:`command`), where the work runs (:class:`Run`) and how
output is written."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from .runtime.deps import check_installed, missing_extra_message
from .runtime.heap import command_heap
from .runtime.polars_loading import load_polars

EXECUTOR_HELP = """
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


def subcommand(subparsers: Any, name: str, run: Callable[[argparse.Namespace], int], *, help: str,
               description: str, **options: Any) -> argparse.ArgumentParser:
    """Add the subcommand ``name`` to ``subparsers`` (from ``add_subparsers()``), with
    ``add_parser``'s ``options``: ``run`` carries it out, given the parsed arguments,
    and returns the exit code."""
    parser = subparsers.add_parser(name, help=help, description=description, **options)
    parser.set_defaults(func=run)
    return parser


def rows_option(p: argparse.ArgumentParser, default: int, help: str, *old: str, all_rows: bool = False) -> None:
    """``--rows N``, the one name of every command's row limit: 1 or more, or with
    ``all_rows`` -1 for all; ``old`` are the names it had before (hidden, deprecated,
    still accepted)."""
    count = functools.partial(_row_count, all_rows=all_rows)
    p.add_argument("--rows", type=count, default=default, metavar="N", help=help)
    for name in old:
        p.add_argument(name, dest="rows", type=count, action=_DeprecatedRows, help=argparse.SUPPRESS)


def _row_count(text: str, *, all_rows: bool) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value >= 1 or (all_rows and value == -1):
        return value
    raise argparse.ArgumentTypeError(f"wants a number of rows, 1 or more{' (or -1 for all)' if all_rows else ''}, "
                                     f"got {text!r}")


def inputs_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="+",
        help="trace files (.pfw, .pfw.gz, .pfw.zst, DFTracer's, .json[.gz], .parquet), directories or globs",
    )


def to_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--to", metavar="FORMAT",
                        help="the output format whatever the suffix: chrome, pfw, parquet or perfetto")


def execution_options(parser: argparse.ArgumentParser, *, index: bool = False, partition_mb: float = 16) -> None:
    """Where a command runs (here or on Dask), its pieces (about ``partition_mb`` on disk
    by default), its progress; with ``index``, ``--no-index`` (see ``reduce/index.py``)."""
    group = parser.add_argument_group("execution")
    where = group.add_mutually_exclusive_group()
    where.add_argument("--dask-workers", type=int, metavar="N", help="run on a local Dask cluster of N workers")
    where.add_argument("--scheduler", metavar="ADDRESS", help="run on the Dask scheduler at ADDRESS")
    group.add_argument("--partition-mb", type=float, default=partition_mb, metavar="MB",
                       help=f"split big files into pieces of about MB on disk (default {partition_mb:g}); a "
                            "piece of a zstd file ends sooner once it holds 8 times MB of text")
    group.add_argument("--no-progress", action="store_true",
                       help="never show progress (on a terminal, a line for each phase that lasts over a second)")
    if index:
        parser.add_argument("--no-index", action="store_true",
                            help="read every file, and keep nothing in the index of files already read "
                            "($DFTRACE_INDEX_DIR, else $XDG_CACHE_HOME/dftrace/index, at most "
                            "$DFTRACE_INDEX_MAX_SIZE bytes, 256M unless set)")


def command(*needs: str) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """A command that needs the modules ``needs`` (checked before anything imports them)
    and turns expected failures (no such or unreadable file, bad option, missing extra) into a message."""

    def decorate(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        @functools.wraps(run)
        def wrapper(args: argparse.Namespace) -> int:
            invoked = f"dftrace {getattr(args, 'command', None) or ''}".strip()
            try:
                check_installed(*needs, needed_by=invoked)
                output = getattr(args, "output", None)
                if output:  # its folder made as --log-file's is
                    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
                command_heap()
                if "polars" in needs:
                    load_polars()
                return run(args)
            except ImportError as exc:
                print(f"dftrace: error: {missing_extra_message(exc, invoked) or exc}", file=sys.stderr)
                return 2
            except BrokenPipeError:
                # the reader of the output went away (`| head`): stop quietly, and keep
                # the interpreter's last flush of stdout from failing again
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 0
            except (OSError, ValueError, argparse.ArgumentTypeError) as exc:
                print(f"dftrace: error: {printable_text(str(exc))}", file=sys.stderr)
                return 2

        return wrapper

    return decorate


def file_threads() -> int:
    """Files (partitions) the summary reads at a time in this process: half the
    CPUs, at least one. polars spreads each piece's work over every CPU already, so
    more files at once add little speed and a piece's working memory each."""
    return max(1, min(os.cpu_count() or 1, 16) // 2)


class Run:
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


def write_bytes(*pieces: bytes) -> None:
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


def printable_text(text: str) -> str:
    from .render.terminal import printable

    return printable(text)


def json_text(data: Any) -> str:
    import orjson

    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()
