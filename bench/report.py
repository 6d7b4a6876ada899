"""Turn a pytest-benchmark JSON file into the tables of docs/performance.md.

    pytest bench/test_bench_core.py --benchmark-json=core.json
    python bench/report.py core.json

Times are per event: a benchmark's minimum round time divided by the events it
recorded per round (``extra_info["events_per_round"]``); the minimum is the figure
least disturbed by the rest of the machine.
"""

from __future__ import annotations

import json
import sys

STYLES = ("decorator", "with", "iter", "startstop")
VARIANTS = ("bare", "flag", "hand", "hot", "disabled", "offconfig")


def per_event_ns(bench: dict) -> float:
    n = bench.get("extra_info", {}).get("events_per_round", 1)
    return bench["stats"]["min"] * 1e9 / n


def _pause(info: dict, mode: str) -> str:
    worst, count = info[f"{mode}_max_ms"], info.get(f"{mode}_gaps_over_1ms", 0)
    return f"{worst} ms ({count} gaps over 1 ms in 3 s)" if worst else "no gap over 1 ms"


#: The single figures a benchmark's extra_info may hold: (key present, its table rows).
_FIGURE_ROWS = (
    ("bytes_per_buffered_event", lambda name, i: f"| memory per buffered event without args, {i['engine']} engine "
                                                 f"| {i['bytes_per_buffered_event']} B |"),
    ("gil_hold_ms_median", lambda name, i: "| writer: longest GIL hold while writing one 16,384-record frame "
                                           f"(median / max of 20) | {i['gil_hold_ms_median']} / {i['gil_hold_ms_max']} ms |"),
    ("bytes_per_event", lambda name, i: f"| bytes per event on disk, {name.split('[')[-1].rstrip(']')} "
                                        f"| {i['bytes_per_event']} |"),
    ("during_flush_max_ms", lambda name, i: "\n".join((
        f"| longest pause of a traced thread overlapping a flush | {i['during_flush_max_ms']} ms |",
        f"| longest pause of that thread overall (traced) | {_pause(i, 'traced')} |",
        f"| longest pause of the same loop untraced (machine noise) | {_pause(i, 'untraced')} |"))),
    ("during_gc_max_ms", lambda name, i: "| longest pause overlapping a garbage collection (any thread) "
                                         f"| {i['during_gc_max_ms']} ms |"),
    ("import_ms", lambda name, i: f"| `import dftrace` | {i['import_ms']} ms |"),
)


def main(path: str) -> None:
    data = json.load(open(path))
    by_name = {b["name"]: b for b in data["benchmarks"]}
    print(f"Machine: {data['machine_info'].get('cpu', {}).get('brand_raw', '?')}, "
          f"Python {data['machine_info'].get('python_version')}\n")
    print("| style | bare call | flag-check wrapper | hand-written recorder | dftrace hot path "
          "| hot / hand | dftrace disabled at run time | disabled / flag | off by configuration |")
    print("|---|---|---|---|---|---|---|---|---|")
    for style in STYLES:
        v = {var: by_name.get(f"test_{style}_{var}") for var in VARIANTS}
        ns = {k: per_event_ns(b) if b else None for k, b in v.items()}

        def cell(k: str) -> str:
            return "—" if ns[k] is None else f"{ns[k]:.0f} ns"

        ratio_hot = f"{ns['hot'] / ns['hand']:.2f}x" if ns["hot"] and ns["hand"] else "—"
        flag = ns["flag"] or ns["bare"]
        ratio_dis = f"{ns['disabled'] / flag:.2f}x" if ns["disabled"] and flag else "—"
        print(f"| {style} | {cell('bare')} | {cell('flag')} | {cell('hand')} | {cell('hot')} | "
              f"{ratio_hot} | {cell('disabled')} | {ratio_dis} | {cell('offconfig')} |")
    print("\n| end to end (N events, then finalize) | per event |")
    print("|---|---|")
    for name, b in sorted(by_name.items()):
        if name.startswith("test_e2e_"):
            print(f"| {name[len('test_e2e_'):]} | {per_event_ns(b):.0f} ns |")
    patterns_table(by_name)
    instructions_table(by_name)
    allocations_table(by_name)
    print("\n| figure | value |")
    print("|---|---|")
    for name, b in sorted(by_name.items()):
        info = b.get("extra_info", {})
        for key, row in _FIGURE_ROWS:
            if key in info:
                print(row(name, info))
    if "test_threads_do_not_block_each_other" in by_name:
        b = by_name["test_threads_do_not_block_each_other"]
        print(f"| 4 threads recording at once, per event | {per_event_ns(b):.0f} ns |")


PATTERN_ROWS = (
    ("step", "realistic step: update + fetch.iter item + 3 decorators + with(args=) + start/stop"),
    ("step_args", "the same step, the with's args changing every step"),
    ("decorator", "decorator"),
    ("with", "`with node:`"),
    ("with_args", "`with node(args={...}):`"),
    ("update", "`ai.update(epoch=, step=)`"),
    ("iter", "`.iter()` item (2 spans)"),
    ("startstop", "`start()` / `stop()`"),
    ("stop_args", "`start()` / `Span.stop(args=)`"),
)


def patterns_table(by_name: dict) -> None:
    """Per pattern, µs per operation under each tracer (bench/test_bench_patterns.py)."""
    res: dict[tuple[str, str], dict] = {}
    for b in by_name.values():
        info = b.get("extra_info", {})
        if "hot_ns" in info:
            res[(info["tracer"], info["pattern"])] = info
    if not res:
        return

    def us(tracer: str, pattern: str, key: str) -> str:
        r = res.get((tracer, pattern))
        return "—" if r is None else f"{r[key] / 1000:.2f}"

    def ratio(a: str, b: str, pattern: str, key: str) -> str:
        ra, rb = res.get((a, pattern)), res.get((b, pattern))
        return "—" if not ra or not rb or not rb[key] else f"{ra[key] / rb[key]:.2f}x"

    print("\nµs per operation; *hot*: recording only (fastest of 5 rounds); *e2e*: the "
          "operations then finalize (encoding, compression, writing included).\n")
    print("| pattern | bare | hand-written e2e | dftrace hot | dftrace e2e | e2e / hand | "
          "e2e / hand, medians | off at run time | off by config | DFTracer 2.2.0 e2e | "
          "DFTracer / dftrace e2e |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for pattern, label in PATTERN_ROWS:
        print(f"| {label} | {us('bare', pattern, 'hot_ns')} | {us('hand', pattern, 'e2e_ns')} | "
              f"{us('dftrace', pattern, 'hot_ns')} | {us('dftrace', pattern, 'e2e_ns')} | "
              f"{ratio('dftrace', 'hand', pattern, 'e2e_ns')} | "
              f"{ratio('dftrace', 'hand', pattern, 'e2e_median_ns')} | {us('dftrace-off', pattern, 'hot_ns')} | "
              f"{us('dftrace-offconfig', pattern, 'hot_ns')} | {us('dftracer', pattern, 'e2e_ns')} | "
              f"{ratio('dftracer', 'dftrace', pattern, 'e2e_ns')} |")


def instructions_table(by_name: dict) -> None:
    """Instructions per operation end to end, hand-written recorder and dftrace."""
    res = {(i["tracer"], i["pattern"]): i["instructions_per_op"] for i in
           (b.get("extra_info", {}) for b in by_name.values()) if "instructions_per_op" in i}
    if not res:
        return
    print("\nInstructions per operation end to end (callgrind; all threads, the writer's included).\n")
    print("| pattern | no tracer | hand-written | dftrace | dftrace / hand | dftrace's added instructions |")
    print("|---|---|---|---|---|---|")
    for pattern, label in PATTERN_ROWS:
        bare, hand, ours = (res.get((t, pattern)) for t in ("bare", "hand", "dftrace"))
        if hand and ours:
            added = f"{ours - bare:,}" if bare else "—"
            print(f"| {label} | {bare or 0:,} | {hand:,} | {ours:,} | {ours / hand:.2f}x | {added} |")
    print("\nSwitched off: instructions per operation over the loop alone (every tracer call removed).\n")
    print("| pattern | the loop alone | no tracer | off at run time | off by configuration |")
    print("|---|---|---|---|---|")
    for pattern, label in PATTERN_ROWS:
        loop, bare, off, offc = (res.get((t, pattern)) for t in
                                 ("loop", "bare", "dftrace-off", "dftrace-offconfig"))
        if loop is not None and off is not None and offc is not None:
            print(f"| {label} | {loop:,} | +{(bare or loop) - loop:,} | +{off - loop:,} | +{offc - loop:,} |")


def allocations_table(by_name: dict) -> None:
    """Allocations per operation once warm, over the loop's own."""
    res = {(i["tracer"], i["pattern"]): i["allocs_per_op"] for i in
           (b.get("extra_info", {}) for b in by_name.values()) if "allocs_per_op" in i}
    if not res:
        return
    print("\nAllocations per operation once warm, over the loop's own (CPython's allocators,"
          " the calling thread).\n")
    print("| pattern | the loop alone | hand-written | dftrace | DFTracer |")
    print("|---|---|---|---|---|")
    for pattern, label in PATTERN_ROWS:
        loop = res.get(("loop", pattern))
        if loop is None:
            continue
        cells = [f"+{res[(t, pattern)] - loop:.2f}" if (t, pattern) in res else "—"
                 for t in ("hand", "dftrace", "dftracer")]
        print(f"| {label} | {loop:.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench.json")
