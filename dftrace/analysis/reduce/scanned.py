"""The reduction of a piece read by the C scanner, straight from its columns: the same
tables as ``aggregate``'s table path gives (tests/analysis/test_scanned_reduction.py
holds them equal), each text's tests made once per distinct value and the groups
found by the C kernel, without making a table of the piece's events."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from ... import format as fmt
from ..runtime import kernels
from .busy import mask_times, painted_spans, tied_order, union_intervals
from ..read.partition_data import PartitionData, ScannedPiece, number_series, text_passes, text_series
from .io_tables import IO_CATS, io_tables, thread_cover
from ..read.schema import HOST_KEY
from .sketch import EXACT_BELOW_US, bins_of
from .step_numbers import WORK_CATS, epoch_span_keys
from .data_waits import PASS_END, is_fetch
from .steps import PROFILER_STEP_PREFIX

from .partial import (EMPTY_TABLES, GROUP_CATS, IO_TABLES, PARTIAL_TABLES, ROW_KEY, TRACER_CATS, Partial, as_stored,
                      stored_table)


def aggregate_scanned(data: PartitionData, piece: ScannedPiece, with_overlap: bool,
                       work_per_step: bool = False) -> Partial | None:
    """``aggregate`` of a piece from the columns the C scanner read, without making a
    table of its events: each text's tests are made once per distinct value, and the
    groups are found by the C kernel. The same tables as ``aggregate``'s (held so by
    tests/analysis/test_scanned_reduction.py); None where the piece needs the table
    (events of several processes, nesting edges the sweep leaves to the query, a level
    beyond 32 bits). Spans of a thread with the same times are taken in the order the
    table's path sorts them (``tied_order``)."""
    kept = piece.kept
    ph_values, ph_index = piece.ph
    counts = np.bincount(ph_index[kept], minlength=len(ph_values))
    phases = pl.DataFrame({"ph": [v for v, c in zip(ph_values, counts.tolist()) if c], "n": counts[counts > 0]},
                          schema={"ph": pl.String, "n": pl.Int64})
    pid_values, pid_valid = piece.numbers["pid"]
    pids = np.where(pid_valid, pid_values, 0)[kept]
    if pids.size and (pids != pids[0]).any():
        return None
    level_values, level_valid = piece.numbers["level"]
    if (level_valid & ((level_values < -(2**31)) | (level_values >= 2**31))).any():
        return None  # the table's Int32 cast refuses it
    source = PartitionData(data.partition, data.events.clear(), meta=data.meta, n_lines=data.n_lines,
                           broken=data.broken, broken_count=data.broken_count, cut_off=data.cut_off,
                           closed=data.closed, activity=data.activity)
    keys = [(int(pids[0]), "")] if pids.size else []
    cat_values, cat_all = piece.texts["cat"]
    is_x = np.array([v == fmt.PH_COMPLETE for v in ph_values], dtype=np.bool_)
    counted_cat = np.array([v is not None and v not in TRACER_CATS and v not in IO_CATS for v in cat_values],
                           dtype=np.bool_)
    timed = kept & is_x[ph_index] & piece.numbers["ts"][1] & piece.numbers["dur"][1]
    rows = np.flatnonzero(timed & counted_cat[cat_all])
    io_cat = np.array([v in IO_CATS for v in cat_values], dtype=np.bool_)
    io = _io_of_scanned(piece, np.flatnonzero(timed & io_cat[cat_all]), keys)
    if not rows.size:
        empty = {kind: EMPTY_TABLES[kind] for kind in PARTIAL_TABLES if kind not in IO_TABLES}
        return Partial(source, keys, phases=phases, **empty, **io, io_cover=EMPTY_TABLES["io_cover"])
    span = _ScannedSpans(piece, rows)
    tid_values, tid_ok = span.take("tid")
    tid = np.where(tid_ok, tid_values, 0)
    level, level_ok = span.take("level")
    block = span.name_is(lambda v: v.endswith(fmt.LOOP_BODY_SUFFIXES))
    group = np.where(block, -1, np.array([GROUP_CATS.get(v, -1) for v in cat_values], dtype=np.int8)[span.cat])
    columns = (tid, span.ts, span.end, np.where(level_ok, level, 0), level_ok.view(np.uint8), group.astype(np.int8))
    painting = painted_spans(*columns)
    if painting is None:  # spans of a thread with the same times: in the order the table's path takes them
        painting = painted_spans(*columns, order=tied_order(tid, span.ts, span.end))
    if painting is None or painting.orphan is None or painting.opener is None:
        return None
    intervals = union_intervals(painting.intervals, [])
    masks = mask_times(intervals) if with_overlap else np.zeros(1, dtype=np.int64)
    pipeline = span.cat_is(lambda v: v == fmt.CAT_PIPELINE)
    epoch, epoch_ok = span.take("epoch")
    step, step_ok = span.take("step")
    count, count_ok = span.take("count")
    seq, seq_ok = span.take("seq")
    incomplete, incomplete_ok = span.take("incomplete")
    done = span.name_is(lambda v: v.endswith(fmt.DONE_SUFFIX))
    between_steps = span.cat_is(lambda v: v == fmt.CAT_CHECKPOINT) & ~step_ok  # see ``steps.container_rows``
    fetch = is_fetch(lambda cat: span.cat_is(lambda v: v == cat),
                     lambda names: span.name_is(lambda v: v in names))
    apart = fetch | (step_ok & ~epoch_ok)  # a row of its own: see ``rows_apart``
    edge = {"tid": tid, "level": (level, level_ok), "start": span.ts, "end": span.end}
    name_values = piece.texts["name"][0]
    group_values, group_index = piece.texts["group"]
    is_epoch = pipeline & span.name_is(lambda v: v in fmt.EPOCH_NAMES)
    span_epoch = np.zeros(rows.size, dtype=np.int64)
    span_epoch[is_epoch] = epoch_span_keys(span.ts[is_epoch], count[is_epoch], count_ok[is_epoch],
                                           epoch[is_epoch], epoch_ok[is_epoch])
    # With work_per_step, each step's work is one row: compute, without a name (see ``work_merged``).
    cat_texts, step_cat, name_texts, step_name = cat_values, span.cat, name_values, span.name
    if work_per_step:
        merged = (span.cat_is(lambda v: v in WORK_CATS) & ~apart
                  & ~span.name_is(lambda v: v.startswith(PROFILER_STEP_PREFIX)))
        cat_texts, step_cat = [*cat_values, fmt.CAT_COMPUTE], np.where(merged, len(cat_values), span.cat)
        name_texts, step_name = [*name_values, None], np.where(merged, len(name_values), span.name)
    columns = {
        "steps": span.extents([epoch_ok, np.where(epoch_ok, epoch, 0), step_ok, np.where(step_ok, step, 0), step_cat,
                               step_name, np.where(apart, span.ts, 0)],
                              (step_ok | fetch) & ~pipeline & ~block & ~done,
                              {"epoch": (epoch, epoch_ok), "step": (step, step_ok), "cat": (cat_texts, step_cat),
                               "name": (name_texts, step_name)}),
        "containers": span.select((pipeline & ((~block & ~span.name_is(lambda v: v.endswith(fmt.ITER_SUFFIX)))
                                               | span.name_is(lambda v: v in fmt.EPOCH_NAMES))) | between_steps
                                  | (span.cat_is(lambda v: v == fmt.CAT_DATALOADER)
                                     & span.name_is(lambda v: v == PASS_END)),
                                  {"name": span.name, "start": span.ts, "end": span.end, "after_work": between_steps}),
        "collectives": span.select(span.cat_is(lambda v: v == fmt.CAT_COMM) & seq_ok, {
            "name": ([None if v is None else v.removesuffix(fmt.DONE_SUFFIX) for v in name_values], span.name),
            "group": (["" if v is None else v for v in group_values], group_index[rows]),
            "seq": seq, "ts": span.ts, "dur": span.dur, "done": done}),
        "epochs": span.extents([epoch], epoch_ok, {"epoch": epoch}),
        "epoch_spans": span.extents([span_epoch], is_epoch, {"epoch": span_epoch}),
        "extents": {"start": [int(span.ts.min())], "end": [int(span.end.max())], "n": [rows.size],
                    "incomplete": [int((incomplete_ok & (incomplete != 0)).sum())]},
        "self_times": span.extents([span.cat, span.name], np.ones(rows.size, dtype=np.bool_),
                                   {"cat": span.cat, "name": span.name}, sums=("us", painting.self_us)),
        "orphans": span.select(painting.orphan, edge),
        "openers": span.select(painting.opener, {**edge, "cat": span.cat, "name": span.name}),
        "intervals": {name: intervals.get_column(name) for name in intervals.columns},
        "overlap": {"mask": np.flatnonzero(masks), "us": masks[masks > 0]},
        "durations": span.bins(),
    }
    # The piece is one process's: its threads' busy time is unioned by thread, and
    # takes the process's key after.
    columns["io_cover"] = thread_cover(tid, group.astype(np.int8), span.ts, span.end)
    pid = keys[0][0]
    return Partial(source, keys, phases=phases, **{kind: stored_table(kind, pid, table) for kind, table in columns.items()},
                   **io)


def _io_of_scanned(piece: ScannedPiece, rows: np.ndarray, keys: list[tuple[int, str]]) -> dict[str, pl.DataFrame]:
    """io_calls and io_totals of the I/O events at ``rows`` of a scanned piece (of one process)."""
    if not rows.size:
        return {"io_calls": EMPTY_TABLES["io_calls"], "io_totals": EMPTY_TABLES["io_totals"]}
    columns = {"pid": np.full(rows.size, keys[0][0], dtype=np.int64), HOST_KEY: [""] * rows.size}
    for name in ("tid", "ts", "dur", "io_ret", "io_calls", "io_size"):
        values, valid = piece.numbers[name]
        columns[name] = number_series(name, values[rows], valid[rows])
    for name in ("name", "io_fhash"):
        values, index = piece.texts[name]
        columns[name] = text_series(name, values, index[rows])
    io_calls, io_totals = io_tables(pl.DataFrame(columns), ROW_KEY)
    return {"io_calls": as_stored("io_calls", io_calls), "io_totals": as_stored("io_totals", io_totals)}


class _ScannedSpans:
    """The spans among a scanned piece's lines (``rows``), column by column; texts as
    their indices among their distinct values (``cat``, ``name``)."""

    def __init__(self, piece: ScannedPiece, rows: np.ndarray):
        self.piece, self.rows = piece, rows
        self.cat = piece.texts["cat"][1][rows]
        self.name = piece.texts["name"][1][rows]
        self.ts = piece.numbers["ts"][0][rows]
        self.dur = piece.numbers["dur"][0][rows]
        self.end = self.ts + self.dur

    def take(self, column: str) -> tuple[np.ndarray, np.ndarray]:
        """(values, valid) of a number column at the spans."""
        values, valid = self.piece.numbers[column]
        return values[self.rows], valid[self.rows]

    def cat_is(self, test: Any) -> np.ndarray:
        return self._each(test, self.piece.texts["cat"][0], self.cat)

    def name_is(self, test: Any) -> np.ndarray:
        return self._each(test, self.piece.texts["name"][0], self.name)

    @staticmethod
    def _each(test: Any, values: list[str | None], index: np.ndarray) -> np.ndarray:
        return text_passes(values, index, lambda value: value is not None and bool(test(value)))

    def select(self, taken: np.ndarray, columns: dict[str, Any]) -> dict[str, Any]:
        """``columns`` (see ``_column``) of the spans ``taken`` marks."""
        at = np.flatnonzero(taken)
        return {name: self._column(name, values, at) for name, values in columns.items()}

    def extents(self, keys: list[np.ndarray], taken: np.ndarray, columns: dict[str, Any], *,
                low: np.ndarray | None = None, high: np.ndarray | None = None,
                sums: tuple[str, np.ndarray] | None = None) -> dict[str, Any]:
        """``columns`` (see ``_column``) of the groups of the spans ``taken`` marks by
        ``keys`` (int arrays), with their least start (or ``low``), greatest end (or
        ``high``) and count, and with ``sums``, (name, values), the sum of those values."""
        stacked = np.empty((self.ts.size, len(keys)), dtype=np.int64)
        for place, key in enumerate(keys):
            stacked[:, place] = key
        at, least, most, n, total = (np.frombuffer(buffer, np.int64) for buffer in kernels.C.extents(
            stacked, len(keys), self.ts if low is None else low, self.end if high is None else high,
            b"" if sums is None else sums[1], np.ascontiguousarray(taken, dtype=np.uint8)))
        found = {name: self._column(name, values, at) for name, values in columns.items()}
        found.update(start=least, end=most, n=n)
        if sums is not None:
            found[sums[0]] = total
        return found

    def _column(self, name: str, values: Any, at: np.ndarray) -> Any:
        """Column ``name`` at the spans ``at`` of ``values``: an array of every span,
        (values, valid) arrays, or (texts, each span's index among them); the spans'
        ``cat`` and ``name`` indices as their texts."""
        if name in ("cat", "name") and values is getattr(self, name):
            return text_series(name, self.piece.texts[name][0], values[at])
        if isinstance(values, tuple) and isinstance(values[0], list):
            return text_series(name, values[0], values[1][at])
        if isinstance(values, tuple):
            data, valid = values[0][at], values[1][at]
            return number_series(name, data, valid)
        return values[at]

    def bins(self) -> dict[str, Any]:
        """The durations' sketch per name (``bins_of``): the exact bins (durations below
        ``EXACT_BELOW_US``, one value each, no spread) grouped in C, the buckets of the
        longer ones by ``bins_of`` itself."""
        exact = self.dur < EXACT_BELOW_US
        found = self.extents([self.cat, self.name, self.dur], exact, {"cat": self.cat, "name": self.name},
                             low=self.dur, high=self.dur, sums=("total", self.dur))
        columns = {"cat": found["cat"], "name": found["name"], "bin": found["start"], "n": found["n"],
                   "total": found["total"], "lo": found["start"], "hi": found["end"],
                   "m2": np.zeros(found["n"].size, dtype=np.float64)}
        if exact.all():
            return columns
        longer = pl.DataFrame({"cat": self.cat[~exact], "name": self.name[~exact], "dur": self.dur[~exact]})
        binned = bins_of(longer.lazy(), ["cat", "name"]).collect(engine="in-memory")
        binned = binned.with_columns(text_series(name, self.piece.texts[name][0], binned.get_column(name).to_numpy())
                                     for name in ("cat", "name"))
        return {name: pl.concat([pl.Series(name, column), binned.get_column(name)]) for name, column in columns.items()}
