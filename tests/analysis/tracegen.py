"""Writing dftrace-format trace files with known contents, for the analysis tests.

Follows the writer's contract (docs/format.md and the core's file layout): one file per
process, ``[`` first, metadata first, one JSON object per line, each flush its own
zstd frame / gzip member, ``]`` only after a clean finalize. Durations are fixed
per name so tests can assert exact counts, totals and percentiles.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import zstandard

T0_US = 1_795_331_512_000_000
HHASH = {"node0": "6882804a826580cd", "node1": "1a2b3c4d5e6f7081"}

#: Fixed durations (µs) of the spans one training step writes on the main thread.
FETCH_ITER_US = 40
TRANSFER_US = 10
FORWARD_US = 100
BACKWARD_US = 200
ALL_REDUCE_US = 50
OPTIMIZER_US = 20
GAP_US = 5
CHECKPOINT_US = 300
#: Preprocessing on the loader thread, overlapping the step's compute.
PREPROCESS_US = 150


def step_us(extra: int = 0) -> int:
    """Length of one step's ``fetch.block`` (the loop body) with ``extra`` µs of slowness."""
    return TRANSFER_US + FORWARD_US + BACKWARD_US + extra + ALL_REDUCE_US + OPTIMIZER_US + 5 * GAP_US


@dataclass
class Process:
    """One traced process and the events it will write."""

    pid: int
    host: str = "node0"
    rank: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    next_id: int = 1
    #: Clock anchor (wall_ns, mono_ns) written to the metadata.
    anchor: tuple[int, int] = (T0_US * 1000 - 1_000_000, 5_000_000_000)
    #: The script named in the process info.
    cmdline: str = "train.py"
    #: The parent process's pid in the process info (a DataLoader worker's rank process).
    ppid: int | None = None

    @property
    def hhash(self) -> str:
        return HHASH.get(self.host, "00000000" + self.host.encode().hex()[:8])

    def span(self, name: str, cat: str, ts: int, dur: int, tid: int | None = None,
             level: int = 1, parent: int = 0, **args: Any) -> int:
        """Append a complete event; return its id."""
        event_id = self.next_id
        self.next_id += 1
        self.events.append(
            {"id": event_id, "name": name, "cat": cat, "pid": self.pid,
             "tid": self.pid if tid is None else tid, "ts": ts, "dur": dur, "ph": "X",
             "args": {"hhash": self.hhash, "level": level, "p_idx": parent, **args}}
        )
        return event_id

    def metadata(self) -> list[dict[str, Any]]:
        label = f"{self.host} · pid {self.pid}"
        if self.rank is not None:
            label = f"rank {self.rank} · {label}"
        main, loader = self.pid, self.pid + 1
        meta = [
            ("process_name", "", main, {"name": label}),
            ("process_sort_index", "", main, {"sort_index": self.rank if self.rank is not None else 0}),
            ("thread_name", "", main, {"name": "MainThread"}),
            ("thread_name", "", loader, {"name": "loader"}),
            ("HH", "dftrace", main, {"name": self.host, "value": self.hhash}),
            ("clock_anchor", "dftrace", main, {"wall_ns": self.anchor[0], "mono_ns": self.anchor[1]}),
            ("PR", "dftrace", main, {"cmdline": ["python", self.cmdline], "cwd": "/home/me/project", "python": "3.11",
                                     "hostname": self.host, "rank": self.rank, "local_rank": self.rank,
                                     **({"ppid": self.ppid} if self.ppid is not None else {})}),
        ]
        return [
            {"name": name, **({"cat": cat} if cat else {}), "pid": self.pid, "tid": tid,
             "ph": "M", "args": args}
            for name, cat, tid, args in meta
        ]


def training_process(pid: int, *, rank: int | None = 0, host: str = "node0", epochs: int = 2,
                     steps: int = 4, slow: dict[tuple[int, int], int] | None = None,
                     t0: int = T0_US) -> Process:
    """A process that trains ``epochs`` x ``steps`` steps with a loader thread.

    Per step on the main thread: ``fetch.iter`` then a ``fetch.block`` holding
    transfer, forward, backward, all_reduce and the optimizer ``step``; a
    ``preprocess`` span on the loader thread (tid pid+1) overlaps the forward
    pass. ``slow[(epoch, step)]`` adds µs to that step's backward pass. Each
    epoch ends with a checkpoint ``save``.
    """
    proc = Process(pid, host, rank)
    slow = slow or {}
    t = t0
    for epoch in range(epochs):
        epoch_start = t
        children: list[tuple] = []
        for step in range(steps):
            extra = slow.get((epoch, step), 0)
            count = step + 1
            children.append(("fetch.iter", "dataloader", t, FETCH_ITER_US, {"epoch": epoch, "count": count}, []))
            t += FETCH_ITER_US
            block_start = t
            inner = []
            for name, cat, dur in (("transfer", "device", TRANSFER_US), ("forward", "compute", FORWARD_US),
                                   ("backward", "compute", BACKWARD_US + extra),
                                   ("all_reduce", "comm", ALL_REDUCE_US), ("step", "compute", OPTIMIZER_US)):
                args = {"epoch": epoch, "step": step}
                if cat == "comm":
                    args.update(group="0", seq=epoch * steps + step + 1)
                inner.append((name, cat, t, dur, args, []))
                if name == "forward":
                    proc.span("preprocess", "data", t, PREPROCESS_US, tid=pid + 1, epoch=epoch)
                t += dur + GAP_US
            children.append(("fetch.block", "dataloader", block_start, t - block_start,
                             {"epoch": epoch, "count": count}, inner))
        children.append(("save", "checkpoint", t, CHECKPOINT_US, {"epoch": epoch}, []))
        t += CHECKPOINT_US
        _emit(proc, ("epoch", "pipeline", epoch_start, t - epoch_start, {"epoch": epoch}, children), 1, 0)
        t += GAP_US
    return proc


def _emit(proc: Process, node: tuple, level: int, parent: int) -> None:
    """Write a span tree children first, as a writer that emits spans as they end does."""
    name, cat, ts, dur, args, children = node
    # Reserve the id at the start of the span, like a real recorder.
    span_id = proc.next_id
    proc.next_id += 1
    for child in children:
        _emit(proc, child, level + 1, span_id)
    proc.events.append(
        {"id": span_id, "name": name, "cat": cat, "pid": proc.pid, "tid": proc.pid, "ts": ts,
         "dur": dur, "ph": "X", "args": {"hhash": proc.hhash, "level": level, "p_idx": parent, **args}}
    )


def write_process(directory: str | os.PathLike[str], proc: Process, *, compression: str = "zstd",
                  prefix: str = "train", finalize: bool = True, lines_per_frame: int = 16,
                  cut: str | None = None, extra_lines: list[bytes] | None = None) -> Path:
    """Write ``proc`` as ``<prefix>[-rank<R>]-<host>-<pid>.pfw[.zst|.gz]``.

    ``cut="frame"`` chops the file inside its last frame (a crash mid-flush),
    ``cut="line"`` (uncompressed only) in the middle of the last line. A cut or
    ``finalize=False`` file has no closing ``]``. ``extra_lines`` are appended
    raw before the end (for broken-line tests).
    """
    path = trace_path(directory, proc, compression=compression, prefix=prefix)
    blobs = units_of(proc, compression=compression, lines_per_frame=lines_per_frame,
                     finalize=finalize and cut is None, extra_lines=extra_lines)
    data = b"".join(blobs)
    if cut == "frame":
        data = data[: len(data) - len(blobs[-1]) // 2]
    elif cut == "line":
        assert compression == "none"
        data = data.rstrip(b"\n")[:-10]
    path.write_bytes(data)
    return path


def trace_path(directory: str | os.PathLike[str], proc: Process, *, compression: str = "zstd",
               prefix: str = "train") -> Path:
    """Where ``write_process`` writes ``proc``."""
    suffix = {"zstd": ".pfw.zst", "gzip": ".pfw.gz", "none": ".pfw"}[compression]
    rank = f"-rank{proc.rank}" if proc.rank is not None else ""
    return Path(directory) / f"{prefix}{rank}-{proc.host}-{proc.pid}{suffix}"


def units_of(proc: Process, *, compression: str = "zstd", lines_per_frame: int = 16, finalize: bool = True,
             extra_lines: list[bytes] | None = None) -> list[bytes]:
    """``proc``'s trace as the units its writer appends one after the other: zstd
    frames, gzip members or plain lines, ``lines_per_frame`` lines each; the last
    closes the file when ``finalize``."""
    lines = [b"["] + [orjson.dumps(e) for e in proc.metadata() + proc.events]
    lines += extra_lines or []
    if finalize:
        lines.append(b"]")
    frames = [b"\n".join(lines[i:i + lines_per_frame]) + b"\n" for i in range(0, len(lines), lines_per_frame)]
    if compression == "zstd":
        cctx = zstandard.ZstdCompressor()
        return [cctx.compress(f) for f in frames]
    if compression == "gzip":
        return [gzip.compress(f) for f in frames]
    return frames


def write_run(directory: str | os.PathLike[str], ranks: int = 2, *, compression: str = "zstd",
              slow: dict[tuple[int, int, int], int] | None = None, **kwargs: Any) -> list[Path]:
    """Write one training process per rank (pids 1000+rank, hosts alternating node0/node1).

    ``slow[(rank, epoch, step)]`` adds µs to that rank's step.
    """
    slow = slow or {}
    paths = []
    for rank in range(ranks):
        per_rank = {(e, s): us for (r, e, s), us in slow.items() if r == rank}
        proc = training_process(1000 + rank, rank=rank, host=f"node{rank % 2}", slow=per_rank)
        paths.append(write_process(directory, proc, compression=compression, **kwargs))
    return paths


#: Durations (µs) of the collective run's spans (see :func:`collective_run`).
COLL_FETCH_US = 30
COLL_FORWARD_US = 100
COLL_BACKWARD_US = 200
COLL_TRANSFER_US = 40
COLL_OPTIMIZER_US = 20
COLL_EVAL_FORWARD_US = 5_000


def collective_run(ranks: int = 2, *, steps: int = 8, slow_rank: int | None = 1, slow_us: int = 3_000,
                   sticky: str = "start", t0: int = T0_US, evaluate: bool = True,
                   host_offset_us: int = 0, cmdline: str = "train.py", pid: int = 2000) -> list[Process]:
    """Ranks training in lockstep through one blocking all-reduce per step.

    Per step and rank: ``fetch.iter``, ``forward`` (``slow_us`` longer on
    ``slow_rank``), then ``backward`` holding the all-reduce, then the optimizer
    ``step``. Every rank leaves the all-reduce when the last one has arrived plus
    ``COLL_TRANSFER_US``, so the others wait. ``sticky`` says when sticky args are
    taken, as a recorder would: at a span's ``"start"`` or ``"end"``; either way
    the fetch before ``ai.update(step=k)`` carries step k-1. After the loop, an
    evaluation (``pipeline.evaluate``) runs forwards that still carry the last
    step. A ``pipeline.train`` and a ``compute.loop`` span enclose everything.
    Odd ranks are on node1, whose clock is ``host_offset_us`` ahead. Rank r has pid
    ``pid + r``.
    """
    anchor = (t0 * 1000 - 1_000_000, 5_000_000_000)
    procs = [Process(pid + r, host=f"node{r % 2}", rank=r, anchor=anchor, cmdline=cmdline)
             for r in range(ranks)]
    clock = [t0] * ranks
    begin = t0
    for step in range(steps):
        arrivals = []
        for r, p in enumerate(procs):
            t = clock[r]
            prev = step - 1 if step else None
            fetch_args = {"step": prev} if prev is not None else {}
            p.span("fetch.iter", "dataloader", t, COLL_FETCH_US, level=2, **fetch_args)
            t += COLL_FETCH_US
            forward = COLL_FORWARD_US + (slow_us if r == slow_rank else 0)
            p.span("forward", "compute", t, forward, level=2, step=step)
            t += forward
            arrivals.append(t + COLL_BACKWARD_US)
            clock[r] = t
        done = max(arrivals) + COLL_TRANSFER_US
        for r, p in enumerate(procs):
            t = clock[r]
            backward_id = p.next_id
            p.next_id += 1
            arrive = t + COLL_BACKWARD_US
            p.span("all_reduce", "comm", arrive, done - arrive, level=3, parent=backward_id, step=step,
                   group="0", seq=step + 1, op="SUM", bytes=4096, group_size=ranks)
            p.events.append({"id": backward_id, "name": "backward", "cat": "compute", "pid": p.pid, "tid": p.pid,
                             "ts": t, "dur": done - t, "ph": "X",
                             "args": {"hhash": p.hhash, "level": 2, "p_idx": 0, "step": step}})
            p.span("step", "compute", done, COLL_OPTIMIZER_US, level=2, step=step)
            clock[r] = done + COLL_OPTIMIZER_US
    last = steps - 1
    for r, p in enumerate(procs):
        t = clock[r]
        if evaluate:
            p.span("forward", "compute", t + 10, COLL_EVAL_FORWARD_US, level=3, step=last)
            p.span("forward", "compute", t + 20 + COLL_EVAL_FORWARD_US, COLL_EVAL_FORWARD_US, level=3, step=last)
            p.span("evaluate", "pipeline", t, 30 + 2 * COLL_EVAL_FORWARD_US, level=2, step=last)
            clock[r] = t + 30 + 2 * COLL_EVAL_FORWARD_US
        enclosing = {"step": last} if sticky == "end" else {}
        p.span("loop", "compute", begin, clock[r] - begin, level=1, **enclosing)
        p.span("train", "pipeline", begin, clock[r] - begin, level=1, **enclosing)
    if host_offset_us:
        for p in procs:
            if p.host == "node1":
                for e in p.events:
                    e["ts"] += host_offset_us
    return procs


def bucketed_run(directory, steps, slow_steps, slow_us, buckets=3, jitter=None, idle=None):
    """Two ranks training like DDP with ``buckets`` gradient buckets: each bucket's
    all-reduce is launched during backward (a short call) and completes (``.done``,
    on a track of its own) when both ranks have launched it; backward then waits for
    the buckets (``all_reduce.wait``). Rank 1's forward is ``slow_us`` longer in
    ``slow_steps``; ``jitter[(rank, step)]`` adds µs to a rank's forward, and
    ``idle[(rank, step)]`` µs before it in no span (un-annotated code, a sleep)."""
    jitter, idle = jitter or {}, idle or {}
    procs = [Process(2100 + r, host="node0", rank=r) for r in range(2)]
    clock = [T0_US] * 2
    for step in range(steps):
        launches = []
        for r, p in enumerate(procs):
            t = clock[r]
            p.span("fetch.iter", "dataloader", t, 30, level=2, **({"step": step - 1} if step else {}))
            t += 30 + idle.get((r, step), 0)
            forward = 100 + (slow_us if r == 1 and step in slow_steps else 0) + jitter.get((r, step), 0)
            p.span("forward", "compute", t, forward, level=2, step=step)
            t += forward
            launches.append([t + 50 * (b + 1) for b in range(buckets)])
            clock[r] = t
        done = [max(launches[0][b], launches[1][b]) + 40 for b in range(buckets)]
        for r, p in enumerate(procs):
            t = clock[r]
            backward_end = max(done[-1], launches[r][-1] + 10)
            for b in range(buckets):
                p.span("all_reduce", "comm", launches[r][b], 5, level=3, step=step, group="0",
                       seq=step * buckets + b + 1, bucket=b, ddp=True)
                p.span("all_reduce.done", "comm", launches[r][b], done[b] - launches[r][b], level=1,
                       tid=1 << 30, step=step, group="0", seq=step * buckets + b + 1)
            p.span("all_reduce.wait", "comm", launches[r][-1] + 5, backward_end - launches[r][-1] - 5, level=3,
                   step=step)
            p.span("backward", "compute", t, backward_end - t, level=2, step=step)
            p.span("step", "compute", backward_end, 20, level=2, step=step)
            clock[r] = backward_end + 20
    for p in procs:
        write_process(directory, p)
    return directory
