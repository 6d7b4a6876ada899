"""Time per file call: no tracer, dftrace ``io=True`` and DFTracer 2.2.0's preload.

Call families, LOOP calls per round: ``pread`` (``os.pread(fd, 4096, 0)`` on a 4 KiB
file), ``read`` (``os.read(fd, 4096)`` through a LOOP x 4 KiB file, rewound between
rounds), ``openclose`` (``os.close(os.open(path, O_RDONLY))``), ``stat``
(``os.stat(path)``), ``fread`` (``numpy.fromfile(path, count=4096)``: Python's open,
then ``dup``, ``fdopen``, ``fread`` and ``fclose`` in C; skipped without numpy).

Variants in each group: ``bare`` (no tracer), ``untraced`` (dftrace ``io=True``,
the file outside ``data_dir``: the wrappers run and find the fd or path untraced),
``traced`` (inside ``data_dir``: one event per call), ``dftracer`` (DFTracer's
``libdftracer_preload.so``, which must be loaded at the process's start: timed in a
process of its own by this file's ``__main__``, beside the same loop in a process
without it; skipped where its wheel is not installed, ``pip install 'dftrace[bench]'``).
The subprocess figures go to ``extra_info`` (``ns_per_call``, ``bare_ns_per_call``);
divide the others' round time by ``calls_per_round``.

    python bench/test_bench_io.py FAMILY DIR    # prints {"ns_per_call": ...}
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import subprocess
import sys
from time import perf_counter_ns

import pytest

LOOP = 10_000
FAMILIES = ("pread", "read", "openclose", "stat", "fread")
HERE = os.path.abspath(__file__)


# -- the loops ---------------------------------------------------------------------------
def make_files(root: str) -> None:
    """``root``/data and ``root``/other, each with a 4 KiB file and a LOOP x 4 KiB one."""
    for sub in ("data", "other"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
        with open(os.path.join(root, sub, "f4k"), "wb") as f:
            f.write(os.urandom(4096))
        with open(os.path.join(root, sub, "long"), "wb") as f:
            f.write(os.urandom(4096) * LOOP)


def make_loop(family: str, directory: str):
    """(loop, setup, teardown) running LOOP calls of ``family`` on files in ``directory``."""
    small, long = os.path.join(directory, "f4k"), os.path.join(directory, "long")
    fds: list[int] = []

    def opened(path: str) -> int:
        if not fds:
            fds.append(os.open(path, os.O_RDONLY))
        return fds[0]

    def teardown() -> None:
        while fds:
            os.close(fds.pop())

    if family == "pread":
        def loop() -> None:
            fd, pread = opened(small), os.pread
            for _ in range(LOOP):
                pread(fd, 4096, 0)
        return loop, lambda: None, teardown
    if family == "read":
        def loop() -> None:
            fd, read = opened(long), os.read
            for _ in range(LOOP):
                read(fd, 4096)
        return loop, lambda: os.lseek(opened(long), 0, os.SEEK_SET), teardown
    if family == "openclose":
        def loop() -> None:
            op, cl, flags = os.open, os.close, os.O_RDONLY
            for _ in range(LOOP):
                cl(op(small, flags))
        return loop, lambda: None, teardown
    if family == "stat":
        def loop() -> None:
            st = os.stat
            for _ in range(LOOP):
                st(small)
        return loop, lambda: None, teardown
    if family == "fread":
        import numpy

        def loop() -> None:
            fromfile, u8 = numpy.fromfile, numpy.uint8
            for _ in range(LOOP):
                fromfile(small, dtype=u8, count=4096)
        return loop, lambda: None, teardown
    raise ValueError(f"unknown family {family!r}")


def time_loop(family: str, directory: str, rounds: int = 30) -> float:
    """The fastest round's time per call, in ns."""
    loop, setup, teardown = make_loop(family, directory)
    best = float("inf")
    try:
        for i in range(rounds + 2):
            setup()
            t0 = perf_counter_ns()
            loop()
            if i >= 2:  # two warm-up rounds, as pedantic's
                best = min(best, perf_counter_ns() - t0)
    finally:
        teardown()
    return best / LOOP


# -- DFTracer, in processes of their own ----------------------------------------------------
def dftracer_preload() -> str | None:
    """DFTracer's preload library, or None where its wheel is not installed."""
    spec = importlib.util.find_spec("dftracer")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(glob.glob(os.path.join(list(spec.submodule_search_locations)[0],
                                          "lib*", "libdftracer_preload.so")))
    return found[0] if found else None


def _timed_process(family: str, root: str, preload: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFTRACE_", "DFTRACER_"))}
    if preload:
        env.update(LD_PRELOAD=preload, DFTRACER_ENABLE="1", DFTRACER_INIT="PRELOAD",
                   DFTRACER_DATA_DIR=os.path.join(root, "data"),
                   DFTRACER_LOG_FILE=os.path.join(root, "out", f"dft-{family}"))
    proc = subprocess.run([sys.executable, HERE, family, os.path.join(root, "data")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])["ns_per_call"]


# -- the benchmarks ----------------------------------------------------------------------------
@pytest.fixture
def files(tmp_path):
    make_files(str(tmp_path))
    os.makedirs(tmp_path / "out")
    return tmp_path


def _need(family: str) -> None:
    if family == "fread" and importlib.util.find_spec("numpy") is None:
        pytest.skip("numpy is not installed")


def _run(benchmark, family: str, directory: str) -> None:
    loop, setup, teardown = make_loop(family, directory)
    benchmark.extra_info.update({"family": family, "calls_per_round": LOOP})
    try:
        benchmark.pedantic(loop, setup=setup, rounds=30, iterations=1, warmup_rounds=2)
    finally:
        teardown()


@pytest.mark.parametrize("family", FAMILIES)
def test_io_bare(benchmark, files, family):
    _need(family)
    benchmark.group = f"io-{family}"
    _run(benchmark, family, str(files / "data"))


@pytest.mark.parametrize("traced", [False, True], ids=["untraced", "traced"])
@pytest.mark.parametrize("family", FAMILIES)
def test_io_dftrace(benchmark, files, family, traced):
    import dftrace

    _need(family)
    benchmark.group = f"io-{family}"
    dftrace.initialize(io=True, data_dir=str(files / "data"), log_file=str(files / "out" / "t"),
                       inherit=False)
    try:
        _run(benchmark, family, str(files / ("data" if traced else "other")))
    finally:
        dftrace.finalize()


@pytest.mark.parametrize("family", FAMILIES)
def test_io_dftracer(benchmark, files, family):
    _need(family)
    preload = dftracer_preload()
    if preload is None:
        pytest.skip("DFTracer is not installed: pip install 'dftrace[bench]'")
    benchmark.group = f"io-{family}"
    benchmark.extra_info.update({
        "family": family, "calls_per_round": LOOP,
        "ns_per_call": round(_timed_process(family, str(files), preload), 1),
        "bare_ns_per_call": round(_timed_process(family, str(files), None), 1)})
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)


if __name__ == "__main__":
    print(json.dumps({"family": sys.argv[1], "ns_per_call": round(time_loop(*sys.argv[1:3]), 1)}))
