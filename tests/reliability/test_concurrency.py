"""Many threads and tasks on the same nodes, and finalize() while they still emit."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
import time
from collections import Counter, defaultdict

import pytest

import dftrace
from dftrace import ai, testing
from dftrace.format import VIRTUAL_TID_BASE

from ._util import assert_valid, files, meta, run, spans


@ai.compute.forward
def _inner(i: int) -> int:
    return i


def test_eight_threads_on_the_same_nodes_lose_nothing(tmp_path):
    """8 threads x 10,000 events: all present, each on its thread's tid, properly nested."""
    tids: dict[int, int] = {}

    def work(k: int) -> None:
        tids[k] = threading.get_native_id()
        for i in range(5000):
            with ai.pipeline.epoch:
                _inner(i)

    with testing.trace_to(tmp_path) as t:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert_valid(t.paths)  # includes: spans on a track nest or are disjoint
    events = t.spans()
    assert len(events) == 80_000
    per_tid = defaultdict(Counter)
    for e in events:
        per_tid[e["tid"]][e["name"]] += 1
    assert set(per_tid) == set(tids.values())
    assert all(c == {"epoch": 5000, "forward": 5000} for c in per_tid.values())
    epochs = {e["id"]: e for e in events if e["name"] == "epoch"}
    for e in events:
        if e["name"] == "forward":
            parent = epochs[e["args"]["p_idx"]]
            assert parent["tid"] == e["tid"] and e["args"]["level"] == 2
    assert len({e["id"] for e in events}) == len(events)


def test_hundred_concurrent_tasks_each_get_their_own_track(tmp_path):
    """100 overlapping asyncio tasks on one node: 100 spans, each its own duration and track."""

    @ai.compute.backward
    async def work(k: int) -> None:
        async with ai.comm.all_reduce(args={"task": k}):
            await asyncio.sleep(0.001 * (k % 10 + 1))

    async def main() -> None:
        await asyncio.gather(*(work(k) for k in range(100)))

    with testing.trace_to(tmp_path) as t:
        asyncio.run(main())
    assert_valid(t.paths)
    reduces = t.spans("all_reduce")
    assert sorted(e["args"]["task"] for e in reduces) == list(range(100))
    for e in reduces:  # its own sleep at least (µs; 100 µs for clock rounding)
        assert e["dur"] >= 1000 * (e["args"]["task"] % 10 + 1) - 100
    assert len({e["tid"] for e in reduces}) == 100
    assert all(e["tid"] >= VIRTUAL_TID_BASE for e in reduces)
    outer = {e["id"]: e for e in t.spans("backward")}
    assert len(outer) == 100
    for e in reduces:  # nested in its own task's backward span, on the same track
        assert outer[e["args"]["p_idx"]]["tid"] == e["tid"]
    names = {m["tid"]: m["args"]["name"] for m in meta(t.events, "thread_name")}
    assert all("asyncio" in names[e["tid"]] for e in reduces)


def test_finalize_while_threads_emit_leaves_a_clean_file(tmp_path):
    """finalize() racing with emitting threads: no error, no broken line, no hole in any thread."""
    stop = threading.Event()
    done = [0] * 4
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            while not stop.is_set():
                with ai.data.item(args={"k": k, "i": done[k]}):
                    _inner(done[k])
                done[k] += 1
        except BaseException as exc:  # pragma: no cover - the failure being tested for
            errors.append(exc)

    # A short interval keeps the final batch small: finalize is quick even with
    # four threads spinning for the GIL.
    s = dftrace.initialize(log_file=str(tmp_path / "t"), compression="zstd", inherit=False,
                           flush_interval=0.05)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    while min(done) < 1000 and not errors:
        stop.wait(0.01)
    dftrace.finalize()  # while the threads run on
    # Each thread ends two more items (the second begun after finalize returned) before
    # they stop: on a busy machine 50 ms may pass without a thread's turn.
    after = list(done)
    deadline = time.monotonic() + 60
    while min(d - a for d, a in zip(done, after)) < 2 and time.monotonic() < deadline and not errors:
        stop.wait(0.01)
    stop.set()
    for th in threads:
        th.join()
    assert errors == []
    assert_valid(s.paths)
    events = testing.read_events(s.path)
    for k in range(4):
        seen = sorted(e["args"]["i"] for e in spans(events, "item") if e["args"]["k"] == k)
        assert len(seen) >= 1000 and seen == list(range(len(seen)))  # no hole inside
        assert len(seen) < done[k]  # the thread went on after tracing stopped


def _capture_held_open() -> tuple[threading.Thread, threading.Event]:
    """Start a thread that opens ``ai.checkpoint.capture`` (args ``path``) and keeps it
    open until the event returned is set; return once the span is open."""
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with ai.checkpoint.capture(args={"path": "ckpt-7"}):
            entered.set()
            release.wait(30)

    th = threading.Thread(target=hold)
    th.start()
    entered.wait(30)
    return th, release


def test_span_still_open_on_another_thread_is_written_incomplete_or_counted_late(tmp_path):
    """A span that outlives finalize() on another thread: the default writer writes it
    incomplete, ending at the finalize, with its args (sticky and its own), and its end
    records nothing (the ring's table of open spans keeps it); the writer thread counts
    it in a 'dropped' line, reason late."""
    s = dftrace.initialize(log_file=str(tmp_path / "t"), compression="none", inherit=False)
    keeps_open_spans = hasattr(s.writer, "end_open_spans")  # the default writer, a drainer
    ai.update(epoch=3)
    with ai.compute.step:
        pass
    th, release = _capture_held_open()
    dftrace.finalize()
    release.set()
    th.join()
    assert_valid(s.paths)
    events = testing.read_events(s.path)
    if keeps_open_spans:
        step, capture = spans(events)
        assert (step["name"], capture["name"], capture["args"]["incomplete"]) == ("step", "capture", True)
        assert (capture["args"]["epoch"], capture["args"]["path"]) == (3, "ckpt-7")
        assert meta(events, "dropped") == []
    else:
        assert [e["name"] for e in spans(events)] == ["step"]
        (late,) = meta(events, "dropped")
        assert late["args"]["count"] == 1 and late["args"]["reason"] == "late"


def test_call_running_when_finalize_closes_its_enclosing_span_is_kept_or_counted(tmp_path):
    """finalize() from inside a decorated call inside a start() span: closing the
    start() span unwinds the call, which can never end in the file. The default writer
    writes it incomplete, nested in the span, ending with it; the other writers count
    it late. Before, it was neither written nor counted."""
    s = dftrace.initialize(log_file=str(tmp_path / "t"), compression="none", inherit=False)
    keeps_open_spans = hasattr(s.writer, "end_open_spans")
    ai.pipeline.train.start()

    @ai.compute.forward
    def forward():
        dftrace.finalize()

    forward()
    assert_valid(s.paths)
    events = testing.read_events(s.path)
    if keeps_open_spans:
        train, call = spans(events)
        assert (train["name"], call["name"]) == ("train", "forward")
        assert train["args"]["incomplete"] is True and call["args"]["incomplete"] is True
        assert call["args"]["p_idx"] == train["id"]
        assert call["ts"] + call["dur"] == train["ts"] + train["dur"]
        assert meta(events, "dropped") == []
    else:
        (train,) = spans(events)
        assert train["name"] == "train" and train["args"]["incomplete"] is True
        (late,) = meta(events, "dropped")
        assert (late["args"]["count"], late["args"]["reason"]) == (1, "late")


def test_span_ending_soon_after_finalize_is_still_written(tmp_path):
    """A span on another thread that ends within the grace period is written, not dropped."""
    s = dftrace.initialize(log_file=str(tmp_path / "t"), compression="none", inherit=False)
    th, release = _capture_held_open()
    threading.Timer(0.02, release.set).start()
    dftrace.finalize()
    th.join()
    assert_valid(s.paths)
    events = testing.read_events(s.path)
    assert [e["name"] for e in spans(events)] == ["capture"]
    assert meta(events, "dropped") == []


def test_task_still_open_when_the_loop_finalizes_is_counted_late(tmp_path):
    """finalize() called from inside an event loop counts the other tasks' open spans as late."""

    async def hold(release: asyncio.Event) -> None:
        async with ai.comm.barrier:
            await release.wait()

    async def main() -> None:
        release = asyncio.Event()
        task = asyncio.create_task(hold(release))
        await asyncio.sleep(0.01)
        async with ai.comm.send:
            pass
        dftrace.finalize()
        release.set()
        await task

    s = dftrace.initialize(log_file=str(tmp_path / "t"), compression="none", inherit=False)
    asyncio.run(main())
    assert_valid(s.paths)
    events = testing.read_events(s.path)
    assert [e["name"] for e in spans(events)] == ["send"]
    (late,) = meta(events, "dropped")
    assert late["args"]["count"] == 1 and late["args"]["reason"] == "late"


_TWICE_C = r"""
#include <pthread.h>
typedef void (*cb_t)(int);
static void *run(void *arg) {
    cb_t cb = (cb_t)arg;
    cb(1); /* a thread state is made for the call and deleted after it ... */
    cb(2); /* ... and a new one made for this call, on the same OS thread */
    return 0;
}
int run_twice(cb_t cb) {
    pthread_t t;
    if (pthread_create(&t, 0, run, (void *)cb))
        return -1;
    return pthread_join(t, 0);
}
"""

_TWICE_PY = """
import ctypes, json, sys, threading
import dftrace
from dftrace import ai

dftrace.initialize(log_file=sys.argv[2], inherit=False)
lib = ctypes.CDLL(sys.argv[1])

@ai.compute.forward
def forward():
    pass

seen = []

def call(k):
    for _ in range(3):
        with ai.pipeline.epoch:
            forward()
    ai.device.transfer.start().stop()
    for _ in ai.dataloader.fetch.iter(range(2)):
        pass
    seen.append(threading.get_native_id())

callback = ctypes.CFUNCTYPE(None, ctypes.c_int)(call)
assert lib.run_twice(callback) == 0
dftrace.finalize()
print(json.dumps(seen))
"""


def test_thread_state_made_again_on_the_same_os_thread(tmp_path):
    """A library thread that calls into Python twice gets a new thread state each
    time (ctypes callbacks, like pybind11's, drop it after the call): the second
    call's spans nest on their own stack, not on the first call's freed one."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the library thread")
    src, lib = tmp_path / "twice.c", tmp_path / "twice.so"
    src.write_text(_TWICE_C)
    subprocess.run([cc, "-shared", "-fPIC", "-pthread", "-o", str(lib), str(src)], check=True)
    out = run(["-c", _TWICE_PY, str(lib), str(tmp_path / "t")])
    assert out.returncode == 0, out.stderr[-3000:]
    (tid1, tid2) = json.loads(out.stdout)
    assert tid1 == tid2  # the same OS thread both times
    paths = files(tmp_path)
    assert_valid(paths)
    events = [e for p in paths for e in testing.read_events(p)]
    names = Counter(e["name"] for e in spans(events) if e["tid"] == tid1)
    assert names == {"epoch": 6, "forward": 6, "transfer": 2, "fetch.iter": 4, "fetch.block": 4, "fetch.end": 2}
    epochs = {e["id"]: e for e in spans(events, "epoch")}
    for e in spans(events, "forward"):
        assert epochs[e["args"]["p_idx"]]["tid"] == tid1 and e["args"]["level"] == 2
