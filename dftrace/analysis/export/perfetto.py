"""Perfetto's own trace format (``.pftrace``): protobuf TracePackets of TrackEvents,
encoded by hand (no protobuf library), a batch of events at a time with numpy.

What a file holds:

- a track per process (its ProcessDescriptor named ``rank R · host``, with the
  process's pid and command line) and per thread (ThreadDescriptor, with the thread's
  name); processes are ranked in the order of the trace's processes table, which is
  rank order (``sibling_order_rank``, honoured where the root track asks for an
  explicit process order);
- complete events as slices (a ``TYPE_SLICE_BEGIN`` and a ``TYPE_SLICE_END`` packet),
  instant events as instants, ``B``/``E`` events as the begins and ends they are;
  their names and categories interned (InternedData, on one packet sequence whose
  first packet clears its incremental state), their args as debug annotations under
  interned names (``hhash``, ``level`` and ``p_idx`` left out: the track and the
  nesting say them);
- counter events (``ph: "C"``) as counter tracks of their process, one per name and
  arg (``memory rss_bytes``), as Perfetto names those of Chrome JSON;
- flows linking the calls of one collective across ranks: communication spans with a
  sequence number, matched by their process group and ``seq`` as the straggler
  analysis matches them (``answers.stragglers.match_collectives``), their ``.done``
  completions left out.

Timestamps are deltas from the packet before, in microseconds, on a sequence-scoped
incremental clock (a ClockSnapshot relates it to the trace's clock): 1 to 3 bytes a
packet where an absolute timestamp in nanoseconds takes 9.

Perfetto sorts packets by timestamp and keeps the file's order among packets of the
same timestamp, and a thread's slices nest by the order of their begins and ends: a
parent and its first child that begin in the same microsecond must come in that
order in the file, and so must a slice's end and the begin of the next. Trace files
hold events in the order their spans ended (a child before its parent), so the
writer sorts: each batch of events is encoded into its packets in order and spilled
to a run file in a folder beside the output; once every event is read, the track
descriptors and the sequence's first packet (clock, interned names) are written,
then the runs merged in time order, a block of each at a time. Memory is bounded by
a batch's packets and the merge's blocks, whatever the number of events.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import polars as pl

from ... import format as fmt
from ..read.schema import EVENT_COLUMNS
from ..read.sources import PERFETTO_SUFFIXES
from ..read.trace import TraceTable
from .protobuf import (FIXED64, LEN, VARINT, Bytes, Const, Field, Fixed64, Message, Rows, Varint, int_field, layout,
                       message, tag, text_rows)
from .sorted_runs import Packets, merged, write_run
from .tables import FORMATS, assign_pids, output_format

#: The format's name (``--to perfetto``) and the file suffixes that ask for it.
PERFETTO = "perfetto"
SUFFIXES = PERFETTO_SUFFIXES
#: Every output format by name: Perfetto's and those of :data:`tables.FORMATS`.
FORMAT_NAMES = (*sorted(set(FORMATS.values())), PERFETTO)

#: Events encoded at a time, each batch a run (its working arrays are some 40 bytes
#: a packet, two packets a slice).
_ENCODE_ROWS = 65_536
#: Events of a loaded table handed to the encoder at a time.
_FRAME_ROWS = 1_000_000
#: Names, categories and arg keys interned at most; later ones are written in full.
_MAX_INTERNED = 65_536
#: Args the track and the nesting already say.
_SKIPPED_ARGS = frozenset({fmt.ARG_HOSTNAME_HASH, fmt.ARG_LEVEL, fmt.ARG_PARENT})
#: Args that are columns of the events table: an event whose args hold these (as the
#: column's type) and the skipped ones alone needs no JSON decoding, its columns say them.
_ARG_COLUMNS = ("epoch", "step", "count", "seq", "group", "incomplete")

# Field numbers of the schema (protos/perfetto/trace/perfetto_trace.proto).
_TRACE_PACKET = tag(1, LEN)  # Trace.packet
_PACKET_TIMESTAMP = tag(8, VARINT)
_PACKET_TRACK_EVENT = tag(11, LEN)
#: What every event packet ends with: trusted_packet_sequence_id (10) = 1 and
#: sequence_flags (13) = SEQ_NEEDS_INCREMENTAL_STATE.
_SEQUENCE = 1
_ON_SEQUENCE = int_field(10, _SEQUENCE) + int_field(13, 2)
_SEQ_INCREMENTAL_STATE_CLEARED = 1
#: A sequence-scoped clock (ids 64-127) counting microseconds, each packet's timestamp
#: a delta from the one before; and the trace's clock, BUILTIN_CLOCK_BOOTTIME.
_DELTA_CLOCK, _TRACE_CLOCK = 64, 6
# TrackEvent
_EVENT_TYPE = tag(9, VARINT)
_EVENT_TRACK = tag(11, VARINT)
_EVENT_NAME_IID = tag(10, VARINT)
_EVENT_NAME = tag(23, LEN)
_EVENT_CATEGORY_IID = tag(3, VARINT)
_EVENT_CATEGORY = tag(22, LEN)
_EVENT_ANNOTATION = tag(4, LEN)
_EVENT_FLOW = tag(47, FIXED64)
_EVENT_COUNTER = tag(30, VARINT)
_EVENT_DOUBLE_COUNTER = tag(44, FIXED64)
_SLICE_BEGIN, _SLICE_END, _INSTANT, _COUNTER = 1, 2, 3, 4
# DebugAnnotation
_ANNOTATION_NAME_IID = tag(1, VARINT)
_ANNOTATION_NAME = tag(10, LEN)
_ANNOTATION_BOOL = tag(2, VARINT)
_ANNOTATION_UINT = tag(3, VARINT)
_ANNOTATION_INT = tag(4, VARINT)
_ANNOTATION_DOUBLE = tag(5, FIXED64)
_ANNOTATION_STRING = tag(6, LEN)


# --- what the encoder keeps across frames ----------------------------------------------


class _Interned:
    """Strings numbered from 1 as they first appear, up to ``_MAX_INTERNED`` of them."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def iids(self, values: pl.Series) -> np.ndarray:
        """Each value's iid; 0 for null and for strings past the limit."""
        for value in values.drop_nulls().unique(maintain_order=True).to_list():
            if value not in self.ids and len(self.ids) < _MAX_INTERNED:
                self.ids[value] = len(self.ids) + 1
        return values.replace_strict(list(self.ids), list(self.ids.values()), default=0,
                                     return_dtype=pl.Int64).fill_null(0).to_numpy()

    def iid(self, value: str) -> int:
        """``value``'s iid; 0 past the limit."""
        if value not in self.ids and len(self.ids) < _MAX_INTERNED:
            self.ids[value] = len(self.ids) + 1
        return self.ids.get(value, 0)

    def entries(self, number: int) -> bytes:
        """The InternedData field ``number``: one (iid, name) message per string."""
        return b"".join(message(number, int_field(1, iid) + message(2, name)) for name, iid in self.ids.items())


@dataclass
class _Process:
    """A process as the events name it (host, pid) and as Perfetto will (its unique pid, its track)."""

    host: str
    pid: int  # as the events have it
    perfetto_pid: int
    rank: int | None
    cmdline: list[str]
    uuid: int


class _Tracks:
    """The trace's tracks: a uuid per process, thread and counter, numbered from 1 as
    they are met (processes first, in the processes table's order: rank order)."""

    def __init__(self, trace: TraceTable):
        self.next_uuid = 1
        self.processes: list[_Process] = []
        self.process_index: dict[tuple[str, int], int] = {}
        unique_pid = assign_pids(trace.processes)
        for row in trace.processes.iter_rows(named=True):
            info = orjson.loads(row["info"]) if row.get("info") else {}
            cmdline = info.get("cmdline") if isinstance(info, dict) else None
            self._add_process(row["host"] or "", row["pid"], unique_pid[(row["host"], row["pid"])], row["rank"],
                              [str(c) for c in cmdline] if isinstance(cmdline, list) else [])
        self.names = {(h or "", p, t): n for h, p, t, n in trace.threads.select(
            "host", "pid", "tid", "name").iter_rows() if n}
        #: (process index, Perfetto's tid) -> uuid, and the thread's name if it has one.
        self.threads: dict[tuple[int, int], int] = {}
        self.thread_names: dict[tuple[int, int], str] = {}
        #: (process index, series name) -> uuid.
        self.counters: dict[tuple[int, str], int] = {}

    def _new_uuid(self) -> int:
        self.next_uuid += 1
        return self.next_uuid - 1

    def _add_process(self, host: str, pid: int, perfetto_pid: int, rank: int | None, cmdline: list[str]) -> None:
        self.process_index[(host, pid)] = len(self.processes)
        self.processes.append(_Process(host, pid, perfetto_pid, rank, cmdline, self._new_uuid()))

    def of_processes(self, frame: pl.DataFrame) -> pl.DataFrame:
        """``frame`` with ``_proc`` (the process's index) and ``_pid``/``_tid`` (Perfetto's
        pid and tid: a process's pid is made unique across hosts, its main thread's with it)."""
        frame = frame.with_columns(pl.col("host").fill_null(""), pl.col("pid").fill_null(0))
        for host, pid in frame.select("host", "pid").unique(maintain_order=True).iter_rows():
            if (host, pid) not in self.process_index:
                used = {p.perfetto_pid for p in self.processes}
                free = pid if 0 <= pid <= fmt.UINT32_MAX and pid not in used else max(used, default=0) + 1
                self._add_process(host, pid, free, None, [])
        keys = pl.DataFrame(
            {"host": [p.host for p in self.processes], "pid": [p.pid for p in self.processes],
             "_proc": list(range(len(self.processes))), "_pid": [p.perfetto_pid for p in self.processes]},
            schema={"host": pl.String, "pid": pl.Int64, "_proc": pl.Int64, "_pid": pl.Int64})
        return frame.join(keys, on=["host", "pid"], how="left", maintain_order="left").with_columns(
            pl.when(pl.col("tid").is_null() | (pl.col("tid") == pl.col("pid"))).then(pl.col("_pid"))
            .otherwise(pl.col("tid")).alias("_tid"))

    def thread_uuids(self, frame: pl.DataFrame) -> np.ndarray:
        """The thread track of each row of ``frame`` (with ``_proc`` and ``_tid``)."""
        for proc, tid, recorded in frame.select("_proc", "_tid", "tid").unique(maintain_order=True).iter_rows():
            if (proc, tid) not in self.threads:
                self.threads[(proc, tid)] = self._new_uuid()
                process = self.processes[proc]
                name = self.names.get((process.host, process.pid, process.pid if recorded is None else recorded))
                if name:
                    self.thread_names[(proc, tid)] = name
        return _lookup(frame, ["_proc", "_tid"], self.threads)

    def counter_uuids(self, frame: pl.DataFrame, key: str) -> np.ndarray:
        """The counter track of ``key`` of each row's counter event: one per process,
        event name and key."""
        named = frame.select("_proc", pl.col("name").fill_null("").alias("_series"))
        wanted = {}
        for proc, name in named.unique(maintain_order=True).iter_rows():
            series = f"{name} {key}" if name else key
            if (proc, series) not in self.counters:
                self.counters[(proc, series)] = self._new_uuid()
            wanted[(proc, name)] = self.counters[(proc, series)]
        return _lookup(named, ["_proc", "_series"], wanted)

    def descriptors(self) -> bytes:
        """The TrackDescriptor packets of every track: the root track (uuid 0) asking for
        the processes' explicit order, then processes, threads and counters."""
        # TrackDescriptor: uuid 1, name 2, process 3, thread 4, parent_uuid 5, counter 8,
        # sibling_order_rank 12, process_ordering 19 (PROCESS_ORDERING_EXPLICIT = 1).
        # ProcessDescriptor: pid 1, cmdline 2, process_name 6. ThreadDescriptor: pid 1,
        # tid 2, thread_name 5.
        packets = [message(60, int_field(1, 0) + int_field(19, 1))]
        for order, proc in enumerate(self.processes):
            label = " · ".join(part for part in (None if proc.rank is None else f"rank {proc.rank}", proc.host) if part)
            process = int_field(1, proc.perfetto_pid) + b"".join(message(2, arg) for arg in proc.cmdline)
            if label:
                process += message(6, label)
            packets.append(message(60, int_field(1, proc.uuid) + message(3, process) + int_field(12, order)))
        for (index, tid), uuid in self.threads.items():
            thread = int_field(1, self.processes[index].perfetto_pid) + int_field(2, tid)
            if (index, tid) in self.thread_names:
                thread += message(5, self.thread_names[(index, tid)])
            packets.append(message(60, int_field(1, uuid) + int_field(5, self.processes[index].uuid) + message(4, thread)))
        for (index, series), uuid in self.counters.items():
            packets.append(message(60, int_field(1, uuid) + int_field(5, self.processes[index].uuid) + message(2, series)
                                    + message(8, b"")))
        return b"".join(message(1, packet) for packet in packets)


def _lookup(frame: pl.DataFrame, columns: list[str], table: dict[tuple[Any, ...], int]) -> np.ndarray:
    keys = pl.DataFrame([list(k) for k in table], schema=[(c, frame.schema[c]) for c in columns], orient="row")
    keys = keys.with_columns(pl.Series("_uuid", list(table.values()), dtype=pl.Int64))
    return frame.select(columns).join(keys, on=columns, how="left", maintain_order="left")["_uuid"].to_numpy()


# --- events into packets -----------------------------------------------------------------


_END_KEY = np.iinfo(np.int64).min
_LEVELS = (1 << 21) - 1


@dataclass
class PerfettoWritten:
    """What :func:`write_perfetto` wrote: slices (complete events, and begins), instant
    events, counter values, calls linked by flows, and events left out by phase (those
    of no phase Perfetto's track events have, and timed events without a valid time)."""

    slices: int = 0
    instants: int = 0
    counter_values: int = 0
    flow_calls: int = 0
    left_out: dict[str, int] = field(default_factory=dict)


class _Encoder:
    """Events into their packets; keeps the tracks, the interned strings and counts."""

    def __init__(self, trace: TraceTable):
        self.tracks = _Tracks(trace)
        self.names, self.categories, self.arg_names = _Interned(), _Interned(), _Interned()
        self.groups: dict[str, int] = {}
        self.events = 0
        self.first_ts: int | None = None
        self.written = PerfettoWritten()

    def encode(self, frame: pl.DataFrame) -> Iterator[Packets]:
        """The packets of ``frame``'s events, ``_ENCODE_ROWS`` events at a time, each
        batch's in order."""
        missing = [pl.lit(None, dtype).alias(c) for c, dtype in EVENT_COLUMNS.items() if c not in frame.columns]
        for batch in frame.iter_slices(_ENCODE_ROWS):
            batch = batch.with_columns(*missing, pl.Series("_seq", np.arange(self.events, self.events + batch.height)))
            self.events += batch.height
            timed = pl.col("ts").is_not_null() & (pl.col("ts") >= 0)
            complete = (pl.col("ph") == fmt.PH_COMPLETE) & pl.col("dur").is_not_null() & (pl.col("dur") >= 0)
            wanted = (timed & (complete | pl.col("ph").is_in(["i", "I", "B", "E", fmt.PH_COUNTER]))).fill_null(False)
            self._count_left_out(batch.filter(~wanted))
            batch = self.tracks.of_processes(batch.filter(wanted))
            if not batch.height:
                continue
            low = int(batch["ts"].min())  # type: ignore[arg-type]
            self.first_ts = low if self.first_ts is None else min(self.first_ts, low)
            marks = batch.filter(pl.col("ph") != fmt.PH_COUNTER)
            if marks.height:
                yield self._marks(marks)
            counters = batch.filter(pl.col("ph") == fmt.PH_COUNTER)
            if counters.height:
                yield from self._counters(counters)

    def _count_left_out(self, frame: pl.DataFrame) -> None:
        for ph, n in frame.group_by("ph").len().iter_rows():
            key = "none" if ph is None else str(ph)
            self.written.left_out[key] = self.written.left_out.get(key, 0) + n

    def _marks(self, frame: pl.DataFrame) -> Packets:
        """Slices, instants, begins and ends on their threads' tracks, in order: a
        packet for each event that opens (all but ``E``), then one for each that ends
        (complete events, at their end, and ``E``), sorted."""
        ph = frame["ph"]
        is_complete = (ph == fmt.PH_COMPLETE).to_numpy()
        is_end = (ph == "E").to_numpy()
        opens, closes = ~is_end, is_complete | is_end
        n_open, n = int(opens.sum()), int(opens.sum() + closes.sum())
        tracks = self.tracks.thread_uuids(frame)
        ts = frame["ts"].to_numpy()
        dur = frame["dur"].fill_null(0).to_numpy()
        tie = (np.clip(frame["level"].fill_null(0).to_numpy(), 0, _LEVELS).astype(np.int64) << 42
               | frame["_seq"].to_numpy() << 1)
        zero = (is_complete & (dur == 0))[closes]
        at = np.concatenate([ts[opens], np.where(is_complete, ts + dur, ts)[closes]])
        first = np.concatenate([np.where(is_complete, -dur, 0)[opens], np.where(zero, 0, _END_KEY)])
        then = np.concatenate([tie[opens], np.where(zero, tie[closes] | 1, tie[closes])])
        order = np.lexsort((then, first, at))
        opening = order < n_open  # each packet in order: an open's (else an end's)
        opener = np.minimum(order, n_open - 1)  # the open's row among the opened events
        opened = frame.filter(pl.Series(opens))
        kinds = np.where((is_complete | (ph == "B").to_numpy())[opens], _SLICE_BEGIN, _INSTANT)
        self.written.slices += int((kinds == _SLICE_BEGIN).sum())
        self.written.instants += n_open - int((kinds == _SLICE_BEGIN).sum())

        def of_opens(values: np.ndarray, fill: Any = 0) -> np.ndarray:
            """Values of the opened events (one each) as values of the packets in order."""
            return np.where(opening, values[opener], fill) if n_open else np.full(n, fill)

        def present(mask: np.ndarray) -> np.ndarray:
            return of_opens(mask, False).astype(bool)

        fields: list[Field] = [
            Varint(_EVENT_TYPE, of_opens(kinds, _SLICE_END)),
            Varint(_EVENT_TRACK, np.concatenate([tracks[opens], tracks[closes]])[order]),
        ]
        if n_open:
            fields += self._interned(opened["name"], self.names, _EVENT_NAME_IID, _EVENT_NAME, of_opens, present)
            fields += self._interned(opened["cat"], self.categories, _EVENT_CATEGORY_IID, _EVENT_CATEGORY,
                                     of_opens, present)
            fields += self._annotations(opened, of_opens, present)
            fields += self._flows(opened, of_opens, present)
        return Packets(at[order], first[order], then[order], _bodies(fields, n))

    @staticmethod
    def _interned(values: pl.Series, interned: _Interned, iid_tag: bytes, text_tag: bytes,
                  of_opens: Any, present: Any) -> list[Field]:
        """The iid of each value, or the value itself past the interning limit; nothing for null."""
        iids = interned.iids(values)
        fields: list[Field] = [Varint(iid_tag, of_opens(iids), present(iids > 0))]
        in_full = (iids == 0) & values.is_not_null().to_numpy()
        if in_full.any():
            fields.append(Bytes(text_tag, text_rows(values), of_opens(np.arange(len(values))), present(in_full)))
        return fields

    def _annotations(self, frame: pl.DataFrame, of_opens: Any, present: Any) -> list[Field]:
        """Each event's args (but ``_SKIPPED_ARGS``) as debug annotations: from the
        columns where the args hold no other key, else from the args' JSON."""
        n = frame.height
        decode = _other_args(frame)
        columns = frame.select(_ARG_COLUMNS).filter(pl.Series(~decode)) if (~decode).any() else None
        fields: list[Field] = []
        for source, rows in ((columns, ~decode), (_decoded_args(frame.filter(pl.Series(decode))), decode)):
            for key in source.columns if source is not None else []:
                column = source[key]
                if key in _SKIPPED_ARGS or column.null_count() == len(column):
                    continue
                has = np.zeros(n, bool)
                has[np.flatnonzero(rows)[column.is_not_null().to_numpy()]] = True
                value = _annotation_value(column.drop_nulls(), has, of_opens, present)
                if value is None:
                    continue
                iid, where = self.arg_names.iid(key), present(has)
                name = (Varint(_ANNOTATION_NAME_IID, np.full(len(where), iid), where) if iid else
                        Bytes(_ANNOTATION_NAME, text_rows(pl.Series([key])), np.zeros(len(where), np.int64), where))
                fields.append(Message(_EVENT_ANNOTATION, [name, value], where))
        return fields

    def _flows(self, frame: pl.DataFrame, of_opens: Any, present: Any) -> list[Field]:
        """A flow id on each call of a collective: one per (process group, seq)."""
        calls = ((pl.col("ph") == fmt.PH_COMPLETE) & (pl.col("cat") == fmt.CAT_COMM) & pl.col("seq").is_not_null()
                 & ~pl.col("name").fill_null("").str.ends_with(fmt.DONE_SUFFIX))
        mask = frame.select(calls.fill_null(False)).to_series().to_numpy()
        if not mask.any():
            return []
        groups = frame["group"].fill_null("")
        for group in groups.filter(pl.Series(mask)).unique(maintain_order=True).to_list():
            self.groups.setdefault(group, len(self.groups) + 1)
        number = groups.replace_strict(list(self.groups), list(self.groups.values()), default=0,
                                       return_dtype=pl.Int64).to_numpy().astype(np.uint64)
        seq = frame["seq"].fill_null(0).to_numpy().astype(np.uint64) & np.uint64((1 << 40) - 1)
        self.written.flow_calls += int(mask.sum())
        return [Fixed64(_EVENT_FLOW, of_opens(number << np.uint64(40) | seq), present(mask))]

    def _counters(self, frame: pl.DataFrame) -> Iterator[Packets]:
        """A counter packet per numeric arg of each counter event, on the track of its
        process, name and arg; a batch of packets (in order) per arg."""
        args = _decoded_args(frame)
        for key in args.columns if args is not None else []:
            column = args[key]
            has = column.is_not_null().to_numpy()
            if not (column.dtype.is_numeric() or column.dtype == pl.Boolean) or not has.any():
                continue
            rows = frame.filter(pl.Series(has))
            values = column.filter(pl.Series(has))
            order = np.argsort(rows["ts"].to_numpy(), kind="stable")
            n = rows.height
            value: Field = (Fixed64(_EVENT_DOUBLE_COUNTER, values.to_numpy()[order], np.ones(n, bool))
                             if values.dtype.is_float() else
                             Varint(_EVENT_COUNTER, values.cast(pl.Int64).to_numpy()[order]))
            fields = [Varint(_EVENT_TYPE, np.full(n, _COUNTER)),
                      Varint(_EVENT_TRACK, self.tracks.counter_uuids(rows, key)[order]), value]
            self.written.counter_values += n
            yield Packets(rows["ts"].to_numpy()[order], np.zeros(n, np.int64), rows["_seq"].to_numpy()[order] << 1,
                           _bodies(fields, n))

    def header(self) -> bytes:
        """The track descriptors, then the sequence's first packet: it clears the
        incremental state, sets the delta clock (at the first event's time) as the
        packets' default and holds every interned string."""
        base = self.first_ts or 0
        clocks = (message(1, int_field(1, _DELTA_CLOCK) + int_field(2, base) + int_field(3, 1) + int_field(4, 1000))
                  + message(1, int_field(1, _TRACE_CLOCK) + int_field(2, base * 1000)))
        interned = self.categories.entries(1) + self.names.entries(2) + self.arg_names.entries(3)
        start = (int_field(10, _SEQUENCE) + int_field(13, _SEQ_INCREMENTAL_STATE_CLEARED) + int_field(87, 1) + message(6, clocks)
                 + message(59, int_field(58, _DELTA_CLOCK)) + message(12, interned))
        return self.tracks.descriptors() + message(1, start)


def _bodies(event: list[Field], n: int) -> Rows:
    """TrackEvents (their fields) as the bodies of their packets on the sequence (the
    timestamp comes last, when the packets are merged)."""
    return layout([Message(_PACKET_TRACK_EVENT, event), Const(_ON_SEQUENCE, n)], n)


def _other_args(frame: pl.DataFrame) -> np.ndarray:
    """Which events' args hold a key that is neither skipped nor a column (or one that is,
    in a type its column does not take): the keys in the text (a ``":`` each) are
    more than those the columns and skipped keys account for."""
    if "args" not in frame.columns or frame["args"].null_count() == frame.height:
        return np.zeros(frame.height, bool)
    args = pl.col("args")
    keys = args.str.count_matches('":', literal=True)
    known = pl.sum_horizontal(*(args.str.count_matches(f'"{key}":', literal=True) for key in sorted(_SKIPPED_ARGS)),
                              *(pl.col(c).is_not_null() for c in _ARG_COLUMNS))
    return frame.select((keys != known).fill_null(False)).to_series().to_numpy()


def _decoded_args(frame: pl.DataFrame) -> pl.DataFrame | None:
    """The events' args, a column per key (JSON values of mixed types as text); None
    when no event has args."""
    if "args" not in frame.columns or frame["args"].null_count() == frame.height:
        return None
    try:
        decoded = frame["args"].str.json_decode(infer_schema_length=None)
    except pl.exceptions.PolarsError:  # not one JSON object per event: the text as it is
        return pl.DataFrame({"args": frame["args"]})
    if not isinstance(decoded.dtype, pl.Struct):
        return pl.DataFrame({"args": frame["args"]})
    return decoded.struct.unnest()


def _annotation_value(values: pl.Series, has: np.ndarray, of_opens: Any, present: Any) -> Field | None:
    """The DebugAnnotation value field of each event that ``has`` one (``values``, one
    each, in order), as a field of the packets."""
    dtype = values.dtype
    if dtype == pl.Null:
        return None
    spread = np.flatnonzero(has)
    if dtype == pl.Boolean or dtype.is_integer() or dtype.is_float():
        if dtype.is_float():
            full = np.zeros(len(has), np.float64)
            full[spread] = values.cast(pl.Float64).to_numpy()
            return Fixed64(_ANNOTATION_DOUBLE, of_opens(full), present(has))
        full = np.zeros(len(has), np.uint64 if dtype == pl.UInt64 else np.int64)
        full[spread] = values.to_numpy() if dtype == pl.UInt64 else values.cast(pl.Int64).to_numpy()
        tag = _ANNOTATION_BOOL if dtype == pl.Boolean else _ANNOTATION_UINT if dtype == pl.UInt64 else _ANNOTATION_INT
        return Varint(tag, of_opens(full), present(has))
    if dtype != pl.String:  # lists and objects: their JSON text
        prefix = len(orjson.dumps({values.name: None})) - len(b"null}")
        values = pl.DataFrame([values]).select(pl.struct(values.name).struct.json_encode()).to_series().str.slice(
            prefix).str.strip_suffix("}")
    index = np.zeros(len(has), np.int64)
    index[spread] = np.arange(len(values))
    return Bytes(_ANNOTATION_STRING, text_rows(values), of_opens(index), present(has))


def _framed(bodies: Rows, order: np.ndarray, deltas: np.ndarray) -> np.ndarray:
    """Packets as fields of the Trace: each body (in ``order``) with its timestamp,
    after its length."""
    n = len(order)
    stamp = Varint(_PACKET_TIMESTAMP, deltas)
    body = Bytes(b"", bodies, order)
    return layout([Const(_TRACE_PACKET, n), Varint(b"", body.lengths + stamp.lengths), body, stamp], n).data


# --- the writer ----------------------------------------------------------------------


def output_kind(path: str | os.PathLike[str], to: str | None = None) -> str:
    """The format to write ``path`` in: ``to`` when given (a name of
    :data:`FORMAT_NAMES`), else the one its suffix asks for."""
    if to is not None:
        if to not in FORMAT_NAMES:
            raise ValueError(f"no output format {to!r}; use one of {', '.join(FORMAT_NAMES)}")
        return to
    name = os.fspath(path)
    if name.endswith(SUFFIXES):
        return PERFETTO
    try:
        return output_format(name)
    except ValueError:
        raise ValueError(f"cannot tell the output format of {name!r}; use one of "
                         f"{', '.join([*FORMATS, *SUFFIXES])}, or --to") from None


def write_perfetto(trace: TraceTable, output: str | os.PathLike[str],
                   frames: Iterable[pl.DataFrame] | None = None) -> PerfettoWritten:
    """Write ``trace`` to ``output`` in Perfetto's protobuf format.

    ``frames`` are the events, a frame at a time (by default ``trace.events``); the
    trace's processes and threads name the tracks. A temporary folder beside
    ``output`` holds the runs of packets while the file is written.
    """
    frames = trace.events.iter_slices(_FRAME_ROWS) if frames is None else frames
    encoder = _Encoder(trace)
    folder = tempfile.mkdtemp(prefix=".dftrace-", dir=os.path.dirname(os.path.abspath(output)))
    try:
        runs = [write_run(os.path.join(folder, f"{index}.run"), packets)
                for index, packets in enumerate(p for frame in frames for p in encoder.encode(frame))]
        with open(output, "wb") as fh:
            fh.write(encoder.header())
            last = encoder.first_ts or 0
            for ts, bodies, order in merged(runs):
                deltas = np.diff(ts, prepend=last)
                last = int(ts[-1])
                fh.write(_framed(bodies, order, deltas).tobytes())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return encoder.written
