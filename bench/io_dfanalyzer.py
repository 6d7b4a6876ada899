"""DFAnalyzer's ``posix`` preset on dftrace's and on DFTracer's trace of one workload,
beside the workload's own count of what it did.

    python bench/io_dfanalyzer.py [--files 50] [--dftracer-preload SO] [--analyzer-python PY]

The workload: ``--files`` files of 20,000 + 3,001·i bytes written in 16 KiB writes
under a fresh data directory, then read back, the even ones in 4 KiB ``read`` calls
and the odd ones in 64 KiB ``pread`` calls, each to its 0-byte end; every call is an
``os`` call, one libc call each, counted by the workload itself. It runs twice, each
time in a process of its own: traced by ``dftrace.initialize(io=True, data_dir=DIR,
compression="gzip")``, and traced by DFTracer 2.2.0's preload library
(``LD_PRELOAD``, ``DFTRACER_INIT=PRELOAD``, ``DFTRACER_DATA_DIR=DIR``,
``DFTRACER_INC_METADATA=1``). Each trace folder then goes through DFAnalyzer
(``dftracer-analyzer``, its Python API with ``analyzer/preset=posix``, a one-thread
local Dask cluster), and the table gives the sums of its per-process view.

DFAnalyzer may need other versions of its dependencies than this environment has
(``dftracer-analyzer`` 0.0.9 imports names that ``dftracer-utils`` 0.0.12 has and
0.0.14 does not): install it in an environment of its own and pass its interpreter
with ``--analyzer-python``. The DFTracer column is left out where its library is not
found (``pip install dftracer==2.2.0``, or ``--dftracer-preload``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from io_epoch import dftracer_preload

HERE = os.path.abspath(__file__)

#: The table's rows: DFAnalyzer's column (posix_<key>_sum) and what it is.
ROWS = (
    ("read_count", "read calls"),
    ("read_size", "bytes read"),
    ("write_count", "write calls"),
    ("write_size", "bytes written"),
    ("open_count", "open calls"),
    ("close_count", "close calls"),
    ("other_count", "calls filed as other"),
    ("count", "POSIX calls in all"),
    ("size", "POSIX bytes in all"),
)


# -- the workload, in a process of its own --------------------------------------------------
def workload(data: str, files: int, log_file: str | None) -> dict:
    if log_file:
        import dftrace

        dftrace.initialize(io=True, data_dir=data, log_file=log_file, compression="gzip")
    truth = dict.fromkeys(key for key, _ in ROWS)
    truth.update(read_count=0, read_size=0, write_count=0, write_size=0, other_count=0)
    block = os.urandom(16384)
    for i in range(files):
        fd = os.open(os.path.join(data, f"f{i}.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
        left = 20000 + 3001 * i
        while left:
            n = os.write(fd, block[:min(left, len(block))])
            truth["write_count"] += 1
            truth["write_size"] += n
            left -= n
        os.close(fd)
    for i in range(files):
        fd = os.open(os.path.join(data, f"f{i}.bin"), os.O_RDONLY)
        offset = 0
        while True:
            got = os.pread(fd, 65536, offset) if i % 2 else os.read(fd, 4096)
            truth["read_count"] += 1
            truth["read_size"] += len(got)
            offset += len(got)
            if not got:
                break
        os.close(fd)
    truth["open_count"] = truth["close_count"] = 2 * files
    truth["count"] = sum(truth[k] for k in ("read_count", "write_count", "open_count",
                                            "close_count"))
    truth["size"] = truth["read_size"] + truth["write_size"]
    if log_file:
        dftrace.finalize()
    return truth


# -- DFAnalyzer, in a process of its own (it may be another environment's) -------------------
def analyze(trace: str, work: str) -> dict:
    from dftracer.analyzer import init_with_hydra

    analyzer = init_with_hydra([
        f"trace_path={trace}", "analyzer/preset=posix", "analyzer.checkpoint=false",
        "cluster.n_workers=1", "cluster.processes=false", "+cluster.dashboard_address=null",
        f"cluster.local_directory={work}/dask", f"hydra.run.dir={work}", "view_types=[proc_name]"])
    try:
        view = analyzer.analyze_trace().flat_views[("proc_name",)]
        return {c[len("posix_"):-len("_sum")]: int(view[c].sum()) for c in view.columns
                if c.startswith("posix_") and c.endswith(("_count_sum", "_size_sum"))}
    finally:
        analyzer.shutdown()


# -- the driver -----------------------------------------------------------------------------
def child(python: str, args: list[str], env: dict[str, str]) -> dict:
    proc = subprocess.run([python, HERE, *args], capture_output=True, text=True, env=env,
                          timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:1])} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--workload":
        data, files, log_file = sys.argv[2], int(sys.argv[3]), sys.argv[4] or None
        print(json.dumps(workload(data, files, log_file)))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--analyze":
        print(json.dumps(analyze(sys.argv[2], sys.argv[3])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--dftracer-preload", default=dftracer_preload(),
                        help="DFTracer's libdftracer_preload.so (default: this environment's)")
    parser.add_argument("--analyzer-python", default=sys.executable,
                        help="an interpreter that imports dftracer.analyzer (default: this one)")
    args = parser.parse_args()
    probe = subprocess.run([args.analyzer_python, "-c", "import dftracer.analyzer"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise SystemExit(f"{args.analyzer_python} does not import dftracer.analyzer "
                         f"(pip install dftracer-analyzer):\n{probe.stderr.strip()[-2000:]}")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DFTRACE_", "DFTRACER_"))}
    tracers = {"dftrace": base}
    if args.dftracer_preload:
        tracers["DFTracer"] = dict(base, LD_PRELOAD=args.dftracer_preload, DFTRACER_ENABLE="1",
                                   DFTRACER_INIT="PRELOAD", DFTRACER_INC_METADATA="1")
    root = tempfile.mkdtemp(prefix="dftrace-dfanalyzer-")
    truths, reports = {}, {}
    try:
        for tracer, env in tracers.items():
            data, out = os.path.join(root, tracer, "data"), os.path.join(root, tracer, "trace")
            os.makedirs(data)
            os.makedirs(out)
            log_file = os.path.join(out, "t")
            if tracer == "DFTracer":
                env = dict(env, DFTRACER_DATA_DIR=data, DFTRACER_LOG_FILE=log_file)
            truths[tracer] = child(sys.executable, ["--workload", data, str(args.files),
                                                    log_file if tracer == "dftrace" else ""], env)
            work = os.path.join(root, tracer, "dfanalyzer")
            reports[tracer] = child(args.analyzer_python, ["--analyze", out, work], base)
            print(f"# {tracer}: traced and analyzed", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    truth = next(iter(truths.values()))
    assert all(t == truth for t in truths.values()), truths
    print(f"{args.files} files written in 16 KiB writes, read back in 4 KiB reads and 64 KiB "
          "preads; DFAnalyzer's posix preset, per-process view, summed:\n")
    names = list(reports)
    print("| | the workload's count | " + " | ".join(f"DFAnalyzer on {n}" for n in names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for key, label in ROWS:
        got = [reports[n].get(key, 0) for n in names]
        cells = [f"{g:,}" + ("" if g == truth[key] else " ✗") for g in got]
        print(f"| {label} | {truth[key]:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
