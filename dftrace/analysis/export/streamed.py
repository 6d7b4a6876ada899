"""``dftrace convert`` and ``dftrace merge`` without holding the events: two passes
over the input files, one piece of decoded lines at a time.

The first pass reads what the output's head needs (metadata records, the processes
each piece's events belong to, their first times, and for ``merge --steps`` the
extents of each step) and keeps no event. The second reads the pieces again and
writes their events out: ``convert`` in input order; ``merge`` sorts each piece by
time into a temporary Parquet file per process beside the output, then writes each
process's events in time order, a k-way merge of its pieces that holds one batch of
each. Memory is bounded by a piece (``_PIECE_BYTES`` of decoded text) and
the number of pieces, whatever the number of events.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from ... import format as fmt
from ..read.decode import iter_partition_pieces, joined_pieces
from ..read.partition_data import PartitionData
from .tables import (
    MergeFilter,
    assign_pids,
    _clock_offsets,
    _describe,
    _event_lines,
    _merged_meta,
    _meta_lines,
    _open_lines,
    _remap,
    in_windows,
    kept_step_windows,
)
from .perfetto import PERFETTO, output_kind, write_perfetto
from ..read.parquet import parquet_document
from ..read.schema import EVENT_COLUMNS, HOST_KEY
from ..read.sources import DEFAULT_PARTITION_BYTES, PathsLike, expand_paths, plan_partitions
from ..reduce.step_numbers import regrouped_step_rows
from ..reduce.steps import container_rows, model_steps, step_rows
from ..read.trace import (
    TraceTable,
    file_reports,
    meta_frame,
    process_mapping,
    processes_frame,
    require_content,
    resolve_parts,
    threads_frame,
)

#: Rows per batch read back from a process's sorted pieces.
_BATCH = 50_000
#: Rows the k-way merge of a process's pieces holds, over all its pieces together.
_MERGE_ROWS = 100_000
#: The merge's time of an event without one: before every other, as polars sorts.
_NO_TIME = np.iinfo(np.int64).min
#: Decoded text read at a time: each reading thread holds a piece's events with their
#: args text (several times the piece) while the next piece is inflated. 4 MiB keeps a
#: 10M-event convert to Perfetto's format at 270 MB (64 MiB pieces: 950 MB) at the
#: same CPU time.
_PIECE_BYTES = 4 << 20
#: Columns the first pass decodes.
_SCAN_COLUMNS = ("pid", "ts", "dur", "ph", "cat", "name", "epoch", "step")
_ORDER = list(EVENT_COLUMNS)


@dataclass
class _Scanned:
    """What the first pass learned of one partition (its events dropped)."""

    part: PartitionData
    keys: list[tuple[int, str]]
    events: int = 0
    #: (pid, host key) -> the time of its first event.
    first_ts: dict[tuple[int, str], int] = field(default_factory=dict)
    #: Step extents and pipeline spans by (pid, host key), for ``merge --steps``.
    steps: list[pl.DataFrame] = field(default_factory=list)
    containers: list[pl.DataFrame] = field(default_factory=list)


def _scan(partition: Any, with_steps: bool) -> _Scanned:
    pieces, first_ts, steps, containers, events = [], {}, [], [], 0
    for piece in iter_partition_pieces(partition, _SCAN_COLUMNS, piece_bytes=_PIECE_BYTES):
        frame = piece.events.with_columns(pl.col("pid").fill_null(0))
        events += frame.height
        if frame.height:
            for pid, key, ts in frame.group_by("pid", HOST_KEY).agg(pl.col("ts").min()).iter_rows():
                old = first_ts.get((pid, key))
                first_ts[(pid, key)] = ts if old is None or (ts is not None and ts < old) else old
            if with_steps:
                spans = frame.filter((pl.col("ph") == fmt.PH_COMPLETE) & pl.col("ts").is_not_null()
                                     & pl.col("dur").is_not_null()).with_columns(
                    (pl.col("ts") + pl.col("dur")).alias("end"))
                steps.append(step_rows(spans, ["pid", HOST_KEY]))
                containers.append(container_rows(spans, ["pid", HOST_KEY]))
        piece.events, piece.activity = frame.clear(), None
        pieces.append(piece)
    part = joined_pieces(pieces)
    return _Scanned(part, [(int(pid), str(key)) for pid, key in first_ts], events, first_ts, steps, containers)


class _Inputs:
    """The input files after the first pass: their resolved processes and metadata."""

    def __init__(self, paths: PathsLike, output: str | os.PathLike[str], *, executor: Any = None,
                 partition_bytes: int = DEFAULT_PARTITION_BYTES, progress: bool | None = None,
                 with_steps: bool = False):
        from functools import partial

        from ..runtime.executor import default_executor

        from ..reduce.index import without_copies

        #: The files left out, holding the same events as another (as the summary does).
        files, self.copies = without_copies(_inputs_but(paths, output), executor, progress)
        plan = plan_partitions(files, partition_bytes)
        self.scans: list[_Scanned] = default_executor(executor).map(
            partial(_scan, with_steps=with_steps), plan, progress=progress, desc="reading")
        parts = [s.part for s in self.scans]
        self.events = sum(s.events for s in self.scans)
        require_content(parts, self.events)
        self.resolution = resolve_parts(parts, [s.keys for s in self.scans])
        self.header = TraceTable(
            events=pl.DataFrame(schema=EVENT_COLUMNS), processes=processes_frame(self.resolution),
            threads=threads_frame(self.resolution), meta=meta_frame(self.resolution),
            files=file_reports(parts, [s.events for s in self.scans]),
        )

    def process_of(self, scan: _Scanned, key: tuple[int, str]) -> int:
        return self.resolution.process_of(scan.part.partition.path, *key)

    def frames(self, with_process: bool = False) -> Iterator[pl.DataFrame]:
        """Second pass: each piece's events, with host and rank (and with
        ``with_process`` the process's index as ``_order``), in input order."""
        order = [*_ORDER, "_order"] if with_process else _ORDER
        for scan in self.scans:
            if not scan.events:
                continue
            mapping = process_mapping(scan.part.partition.path, scan.keys, self.resolution)
            for piece in iter_partition_pieces(scan.part.partition, None, piece_bytes=_PIECE_BYTES):
                if piece.events.height:
                    events = piece.events.with_columns(pl.col("pid").fill_null(0))
                    yield events.join(mapping, on=["pid", HOST_KEY], how="left",
                                      maintain_order="left").drop(HOST_KEY).select(order)


def _inputs_but(paths: PathsLike, output: str | os.PathLike[str]) -> list[str]:
    """The files ``paths`` names, but ``output``: a file the command writes in a folder
    it reads (a second run would read the first one's output as a trace). Raises
    ValueError where ``output`` is named as an input: writing it would destroy it."""
    target = os.path.realpath(output)
    named = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if any(os.path.realpath(path) == target for path in named):
        raise ValueError(f"{os.fspath(output)} is both an input and the output: write to another file")
    files = [path for path in expand_paths(named) if os.path.realpath(path) != target]
    if not files:
        raise FileNotFoundError(f"no trace files found at {', '.join(map(os.fspath, named))} but the output")
    return files


# --- convert ---------------------------------------------------------------------------


def convert(paths: PathsLike, output: str | os.PathLike[str], *, to: str | None = None, **options: Any) -> Written:
    """Write every event of ``paths`` to ``output`` (format ``to``, else by its suffix,
    as :func:`write_trace`; ``.pftrace``: Perfetto's) piece by piece, in input order
    (Perfetto's format: in time order, as it wants)."""
    kind = output_kind(output, to)
    inputs = _Inputs(paths, output, **options)
    first: dict[int, int] = {}
    for scan in inputs.scans:
        for (pid, _), ts in scan.first_ts.items():
            if ts is not None:
                first[pid] = min(ts, first.get(pid, ts))
    frames = inputs.frames()
    left_out = _write(inputs.header, output, kind, first, frames)
    return Written(inputs.header, inputs.events - sum(left_out.values()), left_out, inputs.copies)


@dataclass
class Written:
    """What was written: the output's processes, threads, metadata and the inputs'
    file reports (``trace``, its events table empty), and how many events."""

    trace: TraceTable
    events: int
    #: Events the format has no place for, by phase (Perfetto's: see ``perfetto``).
    left_out: dict[str, int] = field(default_factory=dict)
    #: The input files left out, holding the same events as another (``path``, ``same_as``).
    copies: list[dict[str, str]] = field(default_factory=list)


def _write(header: TraceTable, output: str | os.PathLike[str], kind: str, first_ts: dict[int, int],
           frames: Iterator[pl.DataFrame]) -> dict[str, int]:
    """Write ``frames`` to ``output`` as ``kind``; return the events left out by phase."""
    if kind == PERFETTO:
        return write_perfetto(header, output, frames).left_out
    if kind == "parquet":
        _write_parquet(header, output, frames)
        return {}
    with _open_lines(output, kind) as (write, separator):
        write(_meta_lines(header, first_ts))
        write(lines for frame in frames for lines in _event_lines(frame, separator))
    return {}


def _write_parquet(header: TraceTable, output: str | os.PathLike[str], frames: Iterator[pl.DataFrame]) -> None:
    """Each frame to a temporary Parquet file beside ``output``, then all of them into
    ``output`` by polars' streaming engine, with dftrace's key-value document."""
    folder = tempfile.mkdtemp(prefix=".dftrace-", dir=os.path.dirname(os.path.abspath(output)))
    try:
        files = []
        for frame in frames:
            files.append(os.path.join(folder, f"{len(files)}.parquet"))
            frame.write_parquet(files[-1])
        if not files:
            files.append(os.path.join(folder, "0.parquet"))
            pl.DataFrame(schema=EVENT_COLUMNS).write_parquet(files[-1])
        pl.scan_parquet(files).sink_parquet(output, metadata=parquet_document(header))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- merge -----------------------------------------------------------------------------


def merge_files(paths: PathsLike, output: str | os.PathLike[str], keep: MergeFilter | None = None, *,
                align_clocks: bool = True, to: str | None = None, **options: Any) -> Written:
    """:func:`dftrace.analysis.merge` of ``paths`` written to ``output`` (format ``to``,
    else by its suffix), streamed: processes in rank order, each process's events in
    time order. Raises ValueError when a filter keeps no event."""
    keep = keep or MergeFilter()
    kind = output_kind(output, to)
    inputs = _Inputs(paths, output, with_steps=keep.steps is not None, **options)
    procs = inputs.header.processes
    new_pid = assign_pids(procs)
    offsets = _clock_offsets(procs) if align_clocks else {}
    keys = list(zip(procs["host"], procs["pid"]))
    shift = [offsets.get(k, 0) for k in keys]
    origin = min((ts + shift[inputs.process_of(scan, key)] for scan in inputs.scans
                  for key, ts in scan.first_ts.items() if ts is not None), default=0)
    windows = _step_windows(inputs, keep, shift) if keep.steps is not None else None
    folder = tempfile.mkdtemp(prefix=".dftrace-", dir=os.path.dirname(os.path.abspath(output)))
    try:
        pieces: dict[int, list[str]] = {}
        first_ts: dict[int, int] = {}
        kept = 0
        for frame in inputs.frames(with_process=True):
            frame = frame.with_columns(
                pl.col("ts") + pl.col("_order").replace_strict(list(range(len(shift))), shift,
                                                              return_dtype=pl.Int64))
            frame = _filtered(frame, keep, origin, windows)
            if not frame.height:
                continue
            kept += frame.height
            frame = frame.with_columns(pl.col("_order").replace_strict(
                list(range(len(keys))), [new_pid[k] for k in keys], return_dtype=pl.Int64).alias("pid"))
            for (index,), part in frame.sort("ts", maintain_order=True).partition_by(
                    "_order", as_dict=True, include_key=False).items():
                files = pieces.setdefault(index, [])
                files.append(os.path.join(folder, f"{index}-{len(files)}.parquet"))
                part.write_parquet(files[-1], row_group_size=8192)
                ts = part.get_column("ts").min()
                pid = new_pid[keys[index]]
                if ts is not None:
                    first_ts[pid] = min(ts, first_ts.get(pid, ts))
        if not kept and inputs.events and keep != MergeFilter():
            raise ValueError(f"no events match {_describe(keep)}"
                             + (f": {_step_numbers(inputs)}" if keep.steps is not None else ""))
        header = TraceTable(
            events=inputs.header.events,
            processes=procs.with_columns(pl.Series("pid", [new_pid[k] for k in keys], dtype=pl.Int64)),
            threads=_remap(inputs.header.threads, new_pid),
            meta=_merged_meta(inputs.header, new_pid, offsets),
            files=inputs.header.files,
        )
        frames = (batch for index in sorted(pieces) for batch in _in_time_order(pieces[index]))
        left_out = _write(header, output, kind, first_ts, frames)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return Written(header, kept - sum(left_out.values()), left_out, inputs.copies)


def _filtered(frame: pl.DataFrame, keep: MergeFilter, origin: int, windows: pl.DataFrame | None) -> pl.DataFrame:
    end = pl.col("ts") + pl.col("dur").fill_null(0)
    if keep.categories is not None:
        frame = frame.filter(pl.col("cat").is_in(list(keep.categories)))
    if keep.start_s is not None:
        frame = frame.filter(end >= origin + round(keep.start_s * 1e6))
    if keep.end_s is not None:
        frame = frame.filter(pl.col("ts") <= origin + round(keep.end_s * 1e6))
    if windows is not None:
        frame = in_windows(frame, windows, "_order", end)
    return frame


def _step_windows(inputs: _Inputs, keep: MergeFilter, shift: list[int]) -> pl.DataFrame:
    """_order, _from, _to: per process and epoch, the time of the kept steps of its rank
    (or of the process, without a rank), by the step model, on the aligned clocks."""
    first, last = keep.steps  # type: ignore[misc]
    rows, containers = [], []
    for scan in inputs.scans:
        for frames, out in ((scan.steps, rows), (scan.containers, containers)):
            for frame in frames:
                if frame.height:
                    proc = [inputs.process_of(scan, (int(p), k)) for p, k in zip(frame["pid"], frame[HOST_KEY])]
                    out.append(frame.drop("pid", HOST_KEY).with_columns(
                        pl.Series("proc", proc, dtype=pl.Int32)).with_columns(
                        pl.col("start") + pl.col("proc").replace_strict(list(range(len(shift))), shift,
                                                                         return_dtype=pl.Int64),
                        pl.col("end") + pl.col("proc").replace_strict(list(range(len(shift))), shift,
                                                                       return_dtype=pl.Int64)))
    if not rows:
        return pl.DataFrame(schema={"_order": pl.Int64, "_from": pl.Int64, "_to": pl.Int64})
    # A row a key of each piece, grouped again where pieces share steps, as the summary's
    # (fetches and steps numbered without an epoch stay rows of their own).
    step_table = regrouped_step_rows(pl.concat(rows, how="diagonal_relaxed"), [frame.height for frame in rows],
                                     ["proc"]).collect()
    container_table = (pl.concat(containers, how="diagonal_relaxed") if containers
                       else pl.DataFrame(schema={"proc": pl.Int32, "name": pl.String, "start": pl.Int64,
                                                 "end": pl.Int64, "after_work": pl.Boolean}))
    container_table = container_table.select("proc", "name", "start", "end", "after_work")
    steps = model_steps(step_table, container_table)
    procs = inputs.header.processes
    units = [str(r) if r is not None else f"{h}:{p}" for h, p, r in procs.select("host", "pid", "rank").iter_rows()]
    unit_of = pl.DataFrame({"proc": list(range(len(units))), "_unit": units},
                           schema={"proc": pl.Int32, "_unit": pl.String})
    per_unit = kept_step_windows(steps, unit_of, first, last, keep.epoch, container_table)
    return (unit_of.join(per_unit, on="_unit").select(pl.col("proc").cast(pl.Int64).alias("_order"), "_from", "_to"))


def _step_numbers(inputs: _Inputs) -> str:
    """What steps and epochs the inputs carry, for a message about a filter."""
    frames = [f for scan in inputs.scans for f in scan.steps if f.height]
    if not frames:
        return "the trace has no step numbers"
    table = pl.concat(frames, how="diagonal_relaxed")
    steps = table.get_column("step")
    epochs = sorted(table.get_column("epoch").drop_nulls().unique().to_list())
    where = f"epochs {epochs[0]}..{epochs[-1]}" if epochs else "no epoch numbers"
    return f"the trace has steps {steps.min()}..{steps.max()} and {where}"


class _Piece:
    """One process's piece (sorted by time) read a block at a time: the rows read and
    not handed on yet, and their times as the merge orders them (no time: first, as
    polars sorts)."""

    def __init__(self, path: str, block: int):
        self.blocks = _batches(path, block)
        self.rows = pl.DataFrame()
        self.keys = np.empty(0, np.int64)
        self.done = False
        self._fill()

    def _fill(self) -> None:
        while not self.done and not len(self.keys):
            rows = next(self.blocks, None)
            if rows is None:
                self.done = True
                return
            self.rows = rows
            self.keys = rows.get_column("ts").fill_null(_NO_TIME).to_numpy()

    def take_before(self, t: int, at: bool = False) -> pl.DataFrame:
        """Hand on the rows waiting before time ``t`` (``at``: at it too)."""
        n = int(np.searchsorted(self.keys, t, "right" if at else "left"))
        head = self.rows.slice(0, n)
        self.rows = self.rows.slice(n)
        self.keys = self.keys[n:]
        self._fill()
        return head


def _in_time_order(files: Sequence[str]) -> Iterator[pl.DataFrame]:
    """One process's pieces (each sorted by time) as frames in time order: a k-way
    merge a block at a time, holding one block of each piece. Rows before the least of
    the blocks' last times are all read: they go together, sorted. Equal times keep
    the pieces' order (a piece's rows at one time all go before the next piece's)."""
    if len(files) == 1:
        yield from _batches(files[0])
        return
    pieces = [_Piece(f, max(1, _MERGE_ROWS // len(files))) for f in files]
    while True:
        live = [p for p in pieces if len(p.keys)]
        if not live:
            return
        horizon = int(min(p.keys[-1] for p in live))
        taken = [rows for rows in (p.take_before(horizon) for p in live) if rows.height]
        if taken:
            yield (pl.concat(taken).sort(pl.col("ts").fill_null(_NO_TIME), maintain_order=True)
                   if len(taken) > 1 else taken[0])
            continue
        # Every piece waits at the horizon or later: the rows at it, piece after piece,
        # each piece's all (block after block).
        for p in live:
            while len(p.keys) and p.keys[0] == horizon:
                yield p.take_before(horizon, at=True)


def _batches(path: str, rows: int = _BATCH) -> Iterator[pl.DataFrame]:
    lazy = pl.scan_parquet(path)
    total = lazy.select(pl.len()).collect().item()
    for offset in range(0, total, rows):
        yield lazy.slice(offset, rows).collect()



