"""Wall time of a small training epoch's file I/O: untraced, dftrace ``io=True`` and
DFTracer 2.2.0's preload library.

    python bench/io_epoch.py [--runs 5] [--files 20000] [--dir DIR] [--dftracer-preload SO]

The epoch: 20,000 files of 4-64 KiB (random sizes, seed 0, created once under DIR,
a temporary directory by default) read through a torch DataLoader with 4 workers
(``fork``, then ``spawn``), each item ``open(path, "rb").read()``, batches of 64;
then a checkpoint, ``torch.save`` of a 50 MB tensor into the same directory. Each run
is a process of its own; the runs of the configurations are interleaved (run 1 of
each, then run 2 of each, ...), and the table gives the median of each. *epoch*: the
DataLoader's workers' start, the epoch and the checkpoint, timed inside the process;
*to the first batch*: mostly the workers' start (with ``spawn``, each imports torch);
*process*: the whole process, timed from outside (the interpreter's start, torch's
import and the tracer's start and finish included). *file events*: the POSIX and
STDIO events in the traces, every process's.

dftrace: ``dftrace.initialize(io=True, data_dir=DIR)`` (default writer; spawned
workers trace from the environment). DFTracer: ``LD_PRELOAD`` of
``libdftracer_preload.so`` with ``DFTRACER_INIT=PRELOAD``, ``DFTRACER_DATA_DIR=DIR``
(its defaults otherwise); its rows are skipped where the library is not found. Needs
torch (``pip install 'dftrace[torch]'``); DFTracer's wheel may live in another
environment: pass its library with ``--dftracer-preload``.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
TRACERS = ("untraced", "dftrace", "dftracer")
METHODS = ("fork", "spawn")
BATCH = 64
WORKERS = 4
CHECKPOINT_FLOATS = 50 * 1000 * 1000 // 4


# -- the epoch, in a process of its own ------------------------------------------------------
class Files:
    """The dataset: item i is the bytes read of file i (its length handed back)."""

    def __init__(self, paths: list[str]):
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> int:
        with open(self.paths[i], "rb") as f:
            return len(f.read())


def epoch(data: str, method: str, out: str, tracer: str) -> dict:
    import torch
    from torch.utils.data import DataLoader

    if tracer == "dftrace":
        import dftrace

        dftrace.initialize(io=True, data_dir=data, log_file=os.path.join(out, "t"))
    paths = sorted(glob.glob(os.path.join(data, "files", "*.bin")))
    t0 = time.perf_counter()
    loader = DataLoader(Files(paths), batch_size=BATCH, num_workers=WORKERS,
                        multiprocessing_context=method)
    read, first = 0, None
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
        read += int(batch.sum())
    torch.save(torch.ones(CHECKPOINT_FLOATS), os.path.join(data, f"ckpt-{os.getpid()}.pt"))
    seconds = time.perf_counter() - t0
    os.remove(os.path.join(data, f"ckpt-{os.getpid()}.pt"))
    if tracer == "dftrace":
        dftrace.finalize()
    return {"epoch_s": seconds, "first_batch_s": first, "bytes": read, "files": len(paths)}


# -- the driver ---------------------------------------------------------------------------------
def make_files(data: str, n: int) -> None:
    """``n`` files of 4-64 KiB under ``data``/files (kept when they are there already)."""
    root = os.path.join(data, "files")
    if len(glob.glob(os.path.join(root, "*.bin"))) == n:
        return
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    rng = random.Random(0)
    for i in range(n):
        with open(os.path.join(root, f"{i:06d}.bin"), "wb") as f:
            f.write(rng.randbytes(rng.randint(4 << 10, 64 << 10)))


def dftracer_preload() -> str | None:
    spec = importlib.util.find_spec("dftracer")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "lib*",
                                          "libdftracer_preload.so")))
    return found[0] if found else None


def run_once(tracer: str, method: str, data: str, out: str, preload: str | None) -> dict:
    os.makedirs(out)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFTRACE_", "DFTRACER_"))}
    if tracer == "dftracer":
        env.update(LD_PRELOAD=preload or "", DFTRACER_ENABLE="1", DFTRACER_INIT="PRELOAD",
                   DFTRACER_DATA_DIR=data, DFTRACER_LOG_FILE=os.path.join(out, "dft"))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, HERE, "--child", tracer, method, data, out],
                          capture_output=True, text=True, env=env, timeout=900)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{tracer} {method} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = wall
    result["trace_bytes"] = sum(os.path.getsize(p) for p in glob.glob(os.path.join(out, "*"))
                                if os.path.isfile(p))
    result["events"] = file_events(out)
    return result


def file_events(out: str) -> int:
    """The POSIX and STDIO events in the traces under ``out`` (either tracer's)."""
    import gzip

    n = 0
    for path in glob.glob(os.path.join(out, "*.pfw*")):
        if path.endswith(".zst"):
            import zstandard

            with open(path, "rb") as f:
                text = zstandard.ZstdDecompressor().stream_reader(f).read()
        elif path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                text = f.read()
        else:
            with open(path, "rb") as f:
                text = f.read()
        n += text.count(b'"cat":"POSIX"') + text.count(b'"cat":"STDIO"')
    return n


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        tracer, method, data, out = sys.argv[2:6]
        print(json.dumps(epoch(data, method, out, tracer)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="the workers' start methods, comma-separated (default: fork,spawn)")
    parser.add_argument("--dir", help="where the files are made (kept); default: a temporary one")
    parser.add_argument("--dftracer-preload", default=dftracer_preload(),
                        help="DFTracer's libdftracer_preload.so (default: this environment's)")
    args = parser.parse_args()
    if importlib.util.find_spec("torch") is None:
        raise SystemExit("torch is not installed (pip install 'dftrace[torch]')")
    data = os.path.abspath(args.dir) if args.dir else tempfile.mkdtemp(prefix="dftrace-epoch-")
    outs = tempfile.mkdtemp(prefix="dftrace-epoch-out-")
    tracers = [t for t in TRACERS if t != "dftracer" or args.dftracer_preload]
    methods = [m for m in args.methods.split(",") if m]
    try:
        make_files(data, args.files)
        results: dict[tuple[str, str], list[dict]] = {}
        for run in range(args.runs):
            for method in methods:
                for tracer in tracers:
                    r = run_once(tracer, method, data, os.path.join(outs, f"{tracer}-{method}-{run}"),
                                 args.dftracer_preload)
                    results.setdefault((tracer, method), []).append(r)
                    print(f"# run {run + 1}: {tracer} {method}: epoch {r['epoch_s']:.2f} s, "
                          f"process {r['process_s']:.2f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(outs, ignore_errors=True)
        if not args.dir:
            shutil.rmtree(data, ignore_errors=True)
    print(f"{args.files:,} files of 4-64 KiB, DataLoader with {WORKERS} workers, batches of "
          f"{BATCH}, then torch.save of 50 MB; median of {args.runs} interleaved runs:\n")
    print("| start method | tracer | to the first batch (s) | rest of the epoch + checkpoint (s) "
          "| epoch + checkpoint (s) | vs untraced | whole process (s) | vs untraced | file events "
          "| trace written |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for method in methods:
        base = results[("untraced", method)]
        base_epoch = statistics.median(r["epoch_s"] for r in base)
        base_proc = statistics.median(r["process_s"] for r in base)
        for tracer in tracers:
            rs = results[(tracer, method)]
            e = statistics.median(r["epoch_s"] for r in rs)
            p = statistics.median(r["process_s"] for r in rs)
            size = statistics.median(r["trace_bytes"] for r in rs)
            first = statistics.median(r["first_batch_s"] for r in rs)
            rest = statistics.median(r["epoch_s"] - r["first_batch_s"] for r in rs)
            events = statistics.median(r["events"] for r in rs)
            label = {"untraced": "untraced", "dftrace": "dftrace `io=True`",
                     "dftracer": "DFTracer 2.2.0 preload"}[tracer]
            print(f"| {method} | {label} | {first:.2f} | {rest:.2f} | {e:.2f} | "
                  f"{e / base_epoch - 1:+.1%} | {p:.2f} | {p / base_proc - 1:+.1%} | "
                  f"{events:,.0f} | {size / 1e6:.2f} MB |")
    if "dftracer" not in tracers:
        print("\nDFTracer's rows are skipped: libdftracer_preload.so was not found "
              "(pip install 'dftrace[bench]', or --dftracer-preload PATH).")


if __name__ == "__main__":
    main()
