"""Time reading PyTorch profiler traces: dftrace's reader against HolisticTraceAnalysis' parser.

    python bench/kineto_parse.py TRACE.json.gz [TRACE ...] [--repeat N]

For each file: the best of N reads by ``dftrace.analysis.load_traces`` (events table
plus GPU activity, every column) and by ``summarize`` (what ``dftrace summary`` does,
GPU answers included), and the best of N parses by HTA 0.5.0's
``hta.common.trace_parser.parse_trace_dataframe`` with its default configuration, in
this process, one thread each way. Needs ``pip install 'dftrace[analysis,gpu-check]'``.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any, Callable


def best_of(repeat: int, run: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("POLARS_MAX_THREADS", "1")
    logging.disable(logging.WARNING)
    from hta.common.trace_parser import parse_trace_dataframe
    from hta.configs.parser_config import ParserConfig

    from dftrace.analysis import load_traces, summarize

    for path in args.paths:
        size = os.path.getsize(path) / 1e6
        ours = best_of(args.repeat, lambda: load_traces(path, progress=False))
        summary = best_of(args.repeat, lambda: summarize(path, progress=False, index=False))
        hta = best_of(args.repeat, lambda: parse_trace_dataframe(path, ParserConfig.get_default_cfg()))
        print(f"{path} ({size:.2f} MB): dftrace load_traces {ours:.3f} s, summarize {summary:.3f} s; "
              f"HTA parse_trace_dataframe {hta:.3f} s")


if __name__ == "__main__":
    main()
