"""Following a running job's trace files, the state of ``dftrace watch``.

Each file is followed from where the last look stopped. The writer appends whole
units (a zstd frame, a gzip member, or lines of a plain file), so a follower keeps
the offset of the last complete unit and, for compressed files, the decoder of the
unit being written: a look feeds it only the bytes added since, and a unit that is
not complete yet waits for the next look. Each newly completed byte range is one
:class:`~dftrace.analysis.read.sources.Partition` (see ``partition_ends``: a few
hundred KiB each, but for what a first look at a long file reads long before its
end), reduced to a partial by the same function every summary uses.

A refresh costs what was added since the last one, not what was read before it.
The live view shows each rank's last ``window`` steps and the one it is in, so the
watcher holds the partials of those steps and of what came after them; the steps
before are counted, and the partials that hold nothing later (all their events
ended before the first step shown) are let go, keeping only their tables with a
row a name, process or epoch (``keyed_only``: counts, durations, extents, metadata).
The partials held combine into an ordinary :class:`Summary` of the steps shown
(its straggler is the one of those steps), and of everything read for the counts,
durations and extents.

A file is closed when its writer's closing ``]`` was read; one whose last bytes are
an unfinished unit is cut off (a writer killed mid-flush); one whose writer is gone
and whose units are whole, without the ``]``, is unfinished (a writer killed between
flushes); one that has not grown for ``stale_s`` seconds is stalled.

Damage does not end the watch. Garbage in a plain file is broken lines, as in any
summary. Bytes of a compressed file that do not decode (garbage, a unit left half
written) are skipped up to the next unit's magic bytes, whenever that comes: they
are a partition of their own, read as the summary reads them (at least one broken
line, counted), and the units after them are followed as before.
"""

from __future__ import annotations

import bisect
import os
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

import polars as pl

from ... import format as fmt
from ..reduce.aggregate import aggregate_partitions, fold_partials
from ..reduce.combine import combine
from ..reduce.partial import Partial, keyed_only
from ..answers.io import io_rates
from ..read.sources import Partition, expand_paths
from ..answers.steps import UnitSteps, nearest_rank, steps_of
from ..answers.summary import Summary, build_summary


OPEN, STALLED, CUT_OFF, UNFINISHED, CLOSED = "open", "stalled", "cut off", "unfinished", "closed"

#: Bytes read from a file per system call while catching up.
_READ_BYTES = 1 << 20


#: A follower folds neighbouring partials while it holds more than this many, so
#: combining handles a few partials per file however often it was looked at.
_MAX_PARTIALS = 8


#: Decoded bytes of a partition (about: cut at the next unit's end): the steps a
#: refresh shows are held with the partitions they are in, so these are small.
_PARTITION_DECODED = 256 << 10


#: Where a look reads more than this (a first look at a long file), only its last
#: this many bytes are cut that finely, and the rest every ``_CATCH_UP_DECODED``:
#: it holds steps long done, let go after the first refresh.
_TAIL_DECODED = 4 << 20


_CATCH_UP_DECODED = 32 << 20


#: rank_steps rows kept per refresh: the live view needs each rank's recent steps.
_RANK_STEPS = 1_000_000


class FileFollower:
    """One trace file, read a complete unit at a time as it grows."""

    def __init__(self, path: str):
        self.path = path
        #: The units (ranks) whose steps the file held at the last refresh.
        self.units: set[str] = set()
        self._start()

    def _start(self) -> None:
        """Follow the file from its first byte (again, where it was replaced: the steps
        counted of its units are forgotten at the next refresh)."""
        self.restarted = True
        #: End of the last complete unit read (the next partition starts here).
        self.offset = 0
        #: Bytes of the file looked at so far (the unit being written included).
        self.scanned = 0
        #: The partials held whole: those of the steps shown and after (see ``let_go``).
        self.partials: list[Partial] = []
        #: What is kept of the partials let go: their keyed tables, folded into one.
        self.history: Partial | None = None
        self.closed = False
        #: Whether the unit the file ends within was read, the file not growing.
        self.tail_cut = False
        #: The last undecodable bytes met (see the module docstring), if any.
        self.broken: str | None = None
        #: Where undecodable bytes start that no unit has followed yet; None when none.
        self._damaged_at: int | None = None
        #: Where the look for the next unit after them goes on (bytes before: searched).
        self._search_from = 0
        self._decoder: Any = None
        self._decoder_start = 0
        self._magic = b""
        self._factory: Any = None
        self._kind: str | None = None
        self._partitions = 0
        #: Compressed bytes and events decoded by the last look (what it cost).
        self.last_read = (0, 0)

    @property
    def pending(self) -> int:
        """Bytes after the last complete unit: a unit still being written, or cut off."""
        return self.scanned - self.offset

    def poll(self, stale_s: float = 10.0) -> bool:
        """Read what was added since the last call; True when new events were read. A
        compressed file that ends within a unit and will not grow (``done``) has that
        unit read as the summary reads it: its whole lines, the file cut off."""
        self.last_read = (0, 0)
        if self.closed:
            return False
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return False
        if size < self.scanned:  # replaced or truncated: follow the new file from its start
            self._start()
        start = self.offset
        if size > self.scanned:
            self._read([end for end in self._complete_ends(size) if end > self.offset])
        if self._tail_waits(size, stale_s):  # asked once the units before it named their writer
            self._decoder = None
            self.tail_cut = True
            self._read([size])
        return self.offset > start

    def _read(self, ends: list[int]) -> None:
        """Read the partitions from ``offset`` to each of ``ends`` in turn."""
        if not ends:
            return
        start, partitions = self.offset, []
        for end in ends:
            partitions.append(Partition(self.path, self._partitions, self.offset, end))
            self._partitions += 1
            self.offset = end
        # Step rows a name each: a followed file's partials are folded as it grows, and
        # a step's work merged into one row could not be read again (``_merges_work``).
        read = list(aggregate_partitions(partitions, model=False))
        self.last_read = (self.last_read[0] + self.offset - start, self.last_read[1] + sum(p.events for p in read))
        self.partials += read
        self.closed = read[-1].source.closed

    def _tail_waits(self, size: int, stale_s: float) -> bool:
        """Whether the compressed file's ``size`` bytes end within a unit not read, and
        the file will not grow."""
        return (self._kind == "compressed" and not self.tail_cut and self._damaged_at is None
                and self.offset < size and self.done(time.time(), stale_s))

    @property
    def events(self) -> int:
        """Events read from the file so far."""
        return sum(p.events for p in self.all_partials())

    def all_partials(self) -> list[Partial]:
        """What is kept of everything read: ``history`` (if any) and the partials held."""
        return self.partials if self.history is None else [self.history, *self.partials]

    def let_go(self, ended_by: int) -> None:
        """Keep of the partials whose events all ended by ``ended_by`` (µs) only their
        keyed tables, folded into ``history``; the last partial is always held (a file
        holds events in the order they ended on each thread, not across threads: a
        partial may end after the next). Then fold neighbours while it holds more than
        ``_MAX_PARTIALS``."""
        done = [_last_end(p) <= ended_by for p in self.partials[:-1]]
        if any(done):
            gone = [keyed_only(p) for p, ended in zip(self.partials, done) if ended]
            self.partials = [p for p, ended in zip(self.partials, [*done, False]) if not ended]
            folded = gone if self.history is None else [self.history, *gone]
            self.history = fold_partials(folded, overlap=False) if len(folded) > 1 else folded[0]
        while len(self.partials) > _MAX_PARTIALS:
            # The two neighbours holding the fewest events are folded: older partials
            # hold more, and each is let go once its last event ended before the steps
            # shown, where folding all into one would hold every look's events forever.
            events = [p.events for p in self.partials]
            i = min(range(len(events) - 1), key=lambda i: events[i] + events[i + 1])
            self.partials[i:i + 2] = [fold_partials(self.partials[i:i + 2])]

    def _complete_ends(self, size: int) -> list[int]:
        """Scan bytes [scanned, size) and return where the new partitions end (see
        ``partition_ends``), the last at the end of the last complete unit."""
        with open(self.path, "rb") as fh:
            if self._kind is None:
                head = fh.read(4)
                if len(head) < 4:
                    return []
                self._factory = fmt.member_decoder(head)
                self._magic = head
                self._kind = "plain" if self._factory is None else "compressed"
            if self._kind == "plain":
                return self._plain_ends(fh, size)
            return self._compressed_ends(fh, size)

    def _plain_ends(self, fh: Any, size: int) -> list[int]:
        # The unfinished last line is read again next time: it is short.
        fh.seek(self.offset)
        data = fh.read(size - self.offset)
        self.scanned = self.offset + len(data)
        complete = data.rfind(b"\n") + 1
        ends = []
        for at in partition_ends(complete):
            newline = data.find(b"\n", at - 1)  # the line the cut falls in ends the partition
            if newline + 1 < complete and (not ends or self.offset + newline + 1 > ends[-1]):
                ends.append(self.offset + newline + 1)
        return [*ends, self.offset + complete] if complete else []

    def _compressed_ends(self, fh: Any, size: int) -> list[int]:
        # Each unit's end, and the bytes decoded up to it; the ranges of undecodable bytes.
        units: list[tuple[int, int]] = []
        damaged: list[int] = []
        end, decoded = self.offset, 0
        position = self.scanned
        if self._damaged_at is not None:
            position = self._resync(fh, size, damaged, units, decoded)
            end = units[-1][0] if units else end
        fh.seek(position)
        while position < size:
            data = fh.read(min(_READ_BYTES, size - position))
            if not data:
                break
            if self._decoder is None:  # frames are decoded only to find where they end
                self._decoder = fmt.MemberReader(self._magic, piece=_PARTITION_DECODED)
                self._decoder_start = position
            try:
                for out, ended in self._decoder.feed(data):
                    decoded += len(out)
                    if ended:
                        end = self._decoder_start + self._decoder.offset
                        units.append((end, decoded))
            except ValueError as exc:  # not a unit we can read: read on from the next one
                self._damaged_at = end = self._decoder_start + self._decoder.member_start
                self.broken = f"undecodable data at byte {end}: {exc}"
                self._decoder = None
                position = self._resync(fh, size, damaged, units, decoded)
                end = units[-1][0] if units else end
                fh.seek(position)
                continue
            position += len(data)
        self.scanned = position
        if not units:
            return []
        decoded_at = [d for _, d in units]
        ends = [units[min(bisect.bisect_left(decoded_at, at), len(units) - 1)][0]
                for at in partition_ends(units[-1][1])]
        return sorted({*ends, *damaged, units[-1][0]})

    def _resync(self, fh: Any, size: int, damaged: list[int], units: list[tuple[int, int]], decoded: int) -> int:
        """Look for the next unit after the undecodable bytes at ``_damaged_at``: where
        one starts, the damage becomes a partition of its own (its start and end go
        into ``damaged`` and ``units``) and reading goes on there. Returns the
        position to read on from (``size`` while no unit follows yet)."""
        assert self._damaged_at is not None
        magic = self._magic[:3] if self._magic.startswith(b"\x1f\x8b") else self._magic[:4]
        at = max(self._damaged_at + 1, self._search_from)
        fh.seek(at)
        while at < size:
            data = fh.read(min(_READ_BYTES, size - at))
            found = data.find(magic)
            if found >= 0:
                damaged += [self._damaged_at, at + found]
                units.append((at + found, decoded))
                self._damaged_at = None
                return at + found
            if not data or at + len(data) >= size:
                break
            at += len(data) - len(magic) + 1  # a magic split across two reads is found
            fh.seek(at)
        self._search_from = max(at, size - len(magic) + 1)
        return size

    @property
    def writer(self) -> tuple[Any, Any] | None:
        """(pid, hostname) of the process that writes the file, from its metadata."""
        for partial in reversed(self.all_partials()):
            for record in partial.source.meta:
                if record.get("name") == fmt.META_PROCESS_INFO and isinstance(record.get("args"), dict):
                    return record["args"].get("pid", record.get("pid")), record["args"].get("hostname")
        return None

    def done(self, now: float, stale_s: float) -> bool:
        """True when the file will not grow again: closed, its writer gone, or, for a
        file that names no writer (garbage, another tool's), not grown for ``stale_s``
        seconds."""
        if self.closed or self.writer_gone:
            return True
        if self.writer is not None:
            return False
        try:
            return now - os.path.getmtime(self.path) > stale_s
        except OSError:  # removed
            return True

    @property
    def writer_gone(self) -> bool:
        """True when the file is not closed and the process that wrote it, named by
        its metadata, is on this host and no longer runs: the file will not grow
        again (a writer killed before it could finalize)."""
        if self.closed:
            return False
        writer = self.writer
        if writer is None or not isinstance(writer[0], int) or writer[1] != socket.gethostname():
            return False
        try:
            os.kill(writer[0], 0)
        except ProcessLookupError:
            return True
        except OSError:  # alive, another user's
            return False
        return False

    def state(self, now: float, stale_s: float) -> str:
        if self.closed:
            return CLOSED
        if self._damaged_at is not None or self.pending or self.tail_cut:
            return CUT_OFF
        if self.writer_gone:
            return UNFINISHED
        try:
            age = now - os.path.getmtime(self.path)
        except OSError:
            return STALLED
        return STALLED if age > stale_s else OPEN


class Watcher:
    """The files under ``paths`` (searched again at each look) and their followers."""

    def __init__(self, paths: Sequence[str], *, window: int = 50, stale_s: float = 10.0):
        self.paths = list(paths)
        self.window = window
        self.stale_s = stale_s
        self.followers: dict[str, FileFollower] = {}
        #: The summary of the partials held: the steps shown, and the counts,
        #: durations and extents of everything read.
        self._summary: Summary | None = None
        #: Per unit (rank): its steps that started by this time (µs) are counted in
        #: ``_settled`` and no longer shown.
        self._cuts: dict[str, int] = {}
        self._settled: dict[str, int] = {}
        #: What the last look decoded, over all files: only the data added since the
        #: look before (``bytes``: on disk, ``events``: read from them).
        self.last_refresh = {"bytes": 0, "events": 0}

    def poll(self) -> bool:
        """Look for new files and new bytes; True when anything new was read."""
        changed = False
        for path in self._files():
            if path not in self.followers:
                self.followers[path] = FileFollower(path)
                changed = True
        for follower in self.followers.values():
            changed |= follower.poll(self.stale_s)
        self.last_refresh = {"bytes": sum(f.last_read[0] for f in self.followers.values()),
                             "events": sum(f.last_read[1] for f in self.followers.values())}
        if changed or self._summary is None:
            self._refresh()
        return changed

    def _refresh(self) -> None:
        """Summarize the partials held; count the steps no longer shown and let go of
        the partials that hold nothing later than them."""
        for follower in self.followers.values():
            if follower.restarted:  # a new file in place of one whose steps were counted
                for unit in follower.units:
                    self._cuts.pop(unit, None)
                    self._settled.pop(unit, None)
                follower.units, follower.restarted = set(), False
        partials = [p for f in self.followers.values() for p in f.all_partials()]
        if not partials:
            self._summary = None
            return
        combined = combine(partials)
        found = steps_of(combined)
        shown = self._steps_shown(found)
        self._summary = build_summary(combined, rank_steps_limit=_RANK_STEPS, steps=shown)
        units_of = dict(shown.procs.select("proc", "unit").iter_rows())
        stepped = set(shown.process_steps.get_column("proc").unique().to_list())
        procs_in: dict[str, list[int]] = {}
        for i, process in enumerate(combined.resolution.processes):
            for path in process.files:
                procs_in.setdefault(path, []).append(i)
        for follower in self.followers.values():
            # Steps of a process that is no unit's (a helper beside ranks) are not shown.
            units = {units_of[i] for i in procs_in.get(follower.path, []) if i in stepped} - {None}
            follower.units |= units
            if not units:  # no steps here (yet): nothing it holds is shown
                follower.let_go(sys.maxsize)
            else:  # what ended before every step shown (nothing while a unit has no cut)
                follower.let_go(min(self._cuts.get(unit, -sys.maxsize) for unit in units))

    def _steps_shown(self, found: UnitSteps) -> UnitSteps:
        """``found`` with only each unit's last ``window`` steps and the one it is in:
        the steps before are counted in ``_settled`` as the cut moves past them."""
        steps = self._after_cuts(found.process_steps.join(found.procs.select("proc", "unit"), on="proc", how="left"))
        firsts = (steps.filter(pl.col("unit").is_not_null()).group_by("unit", "epoch", "step")
                  .agg(pl.col("start").min()).group_by("unit").agg(pl.col("start").sort()))
        for unit, starts in firsts.iter_rows():
            if len(starts) >= self.window + 2:
                # Kept: the steps after this one (the last window's and the one running).
                self._cuts[unit] = at = starts[-(self.window + 2)]
                self._settled[unit] = self._settled.get(unit, 0) + sum(1 for s in starts if s <= at)
        return UnitSteps(found.procs, found.runs, self._after_cuts(steps).drop("unit"))

    def _after_cuts(self, steps: pl.DataFrame) -> pl.DataFrame:
        """The rows of ``steps`` (with a ``unit``) that started after their unit's cut."""
        if not self._cuts:
            return steps
        cut = pl.col("unit").replace_strict(self._cuts, default=None, return_dtype=pl.Int64)
        return steps.filter(cut.is_null() | (pl.col("start") > cut))

    def _files(self) -> list[str]:
        try:
            found = expand_paths(self.paths)
        except FileNotFoundError:
            return []  # nothing written yet
        return [p for p in found if fmt.is_trace_file(p)]

    @property
    def finished(self) -> bool:
        """True when there are files and none will grow again (see ``FileFollower.done``)."""
        now = time.time()
        return bool(self.followers) and all(f.done(now, self.stale_s) for f in self.followers.values())

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """The live figures as plain data (what ``--once --json`` prints)."""
        now = time.time() if now is None else now
        files = [self._file_row(f, now) for f in self.followers.values()]
        live = any(f["state"] != CLOSED for f in files)
        summary = self._summary
        if summary is None:
            return {"files": files, "ranks": [], "totals": _totals(files, None, []), "straggler": None,
                    "io": None, "last_read": dict(self.last_refresh), "held": self.held}
        ranks = rank_rows(summary, self.window, drop_last=live, settled=self._settled)
        return {
            "files": files,
            "ranks": ranks,
            "totals": _totals(files, summary, ranks),
            "straggler": _straggler(summary),
            "io": io_rates(summary.io),
            "last_read": dict(self.last_refresh),
            "held": self.held,
        }

    @property
    def held(self) -> dict[str, int]:
        """What a refresh summarizes: the events of the partials held whole (the steps
        shown and what came after them), beside the keyed tables of the rest."""
        return {"events": sum(p.events for f in self.followers.values() for p in f.partials)}

    def _file_row(self, follower: FileFollower, now: float) -> dict[str, Any]:
        events = follower.events
        try:
            stat = os.stat(follower.path)
            size, age = stat.st_size, max(0.0, now - stat.st_mtime)
        except OSError:
            size, age = follower.scanned, None
        return {
            "path": follower.path, "state": follower.state(now, self.stale_s), "bytes": size,
            "events": events, "idle_s": round(age, 1) if age is not None else None,
            "pending_bytes": follower.pending, "problem": follower.broken,
        }


def partition_ends(decoded: int) -> list[int]:
    """Where to cut ``decoded`` bytes read by one look into partitions (each cut moved
    on to the next unit's end): every ``_PARTITION_DECODED`` bytes in the last
    ``_TAIL_DECODED``, and every ``_CATCH_UP_DECODED`` before them."""
    tail = max(0, decoded - _TAIL_DECODED)
    coarse = list(range(_CATCH_UP_DECODED, tail, _CATCH_UP_DECODED))
    return [*coarse, *range(tail or _PARTITION_DECODED, decoded, _PARTITION_DECODED)]


def _last_end(partial: Partial) -> int:
    """When the last of ``partial``'s events ended (µs); the least integer without any."""
    end = partial.extents.get_column("end").max() if partial.extents.height else None
    return -sys.maxsize if end is None else int(end)


def rank_rows(summary: Summary, window: int, drop_last: bool, settled: dict[str, int]) -> list[dict[str, Any]]:
    """Per rank: where it is and how its recent steps went (``settled``: steps of each
    rank counted and no longer in ``summary``)."""
    by_rank: dict[str, list[dict[str, Any]]] = {}
    for row in summary.rank_steps:
        by_rank.setdefault(row["rank"], []).append(row)
    stall_of = _stalls(summary)
    out = []
    for rank, rows in by_rank.items():
        rows.sort(key=lambda r: r["start_us"])
        current = rows[-1]
        # While the job runs, a rank's last step is still going: time only finished ones.
        done = rows[:-1] if drop_last and len(rows) > 1 else rows
        recent = done[-window:]
        durations = sorted(r["dur_us"] for r in recent)
        span_us = recent[-1]["start_us"] + recent[-1]["dur_us"] - recent[0]["start_us"] if recent else 0
        out.append({
            "rank": rank,
            "epoch": current["epoch"],
            "step": current["step"],
            "steps": settled.get(rank, 0) + len(rows),
            "steps_per_s": round(len(recent) / (span_us / 1e6), 3) if span_us > 0 else None,
            "step_p50_us": nearest_rank(durations, 0.5),
            "step_p95_us": nearest_rank(durations, 0.95),
            "comm_wait_us_per_step": round(sum(r["wait_us"] for r in recent) / len(recent), 1) if recent else None,
            "stall": stall_of.get(rank),
        })
    return out


def _stalls(summary: Summary) -> dict[str, float | None]:
    """Each rank's data-loader stall in its busiest loader."""
    if not summary.dataloader:
        return {}
    return {r["rank"]: r["stall"] for r in summary.dataloader[0]["ranks"]}


def _straggler(summary: Summary) -> dict[str, Any] | None:
    """The straggler of the steps shown (``steps``: how many steps were compared)."""
    if summary.stragglers and summary.stragglers[0].get("significant"):
        worst = summary.stragglers[0]
        return {"rank": worst["unit"], "caused_wait_us_per_step": worst["caused_wait_us_per_step"],
                "held_steps": worst["held_steps"], "steps": worst.get("steps") or summary.step_count()}
    ranks = summary.imbalance.get("ranks") or []
    slowest = max(ranks, key=lambda r: (r["slowest_count"], r["mean_us"]), default=None)
    if slowest is None or not slowest["slowest_count"]:
        return None
    return {"rank": slowest["rank"], "slowest_steps": slowest["slowest_count"], "mean_step_us": slowest["mean_us"],
            "steps": summary.step_count()}


def _totals(files: list[dict[str, Any]], summary: Summary | None, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    states = {state: sum(1 for f in files if f["state"] == state)
              for state in (OPEN, STALLED, CUT_OFF, UNFINISHED, CLOSED)}
    rates = [r["steps_per_s"] for r in ranks if r["steps_per_s"]]
    o = summary.overview if summary is not None else {}
    return {
        "files": len(files), **{f"files_{k.replace(' ', '_')}": v for k, v in states.items()},
        "processes": o.get("processes", 0), "ranks": o.get("ranks", 0),
        "events": o.get("events", 0), "broken_lines": o.get("broken_lines", 0),
        "dropped_events": o.get("dropped_events", 0),
        "wall_us": o.get("wall_us", 0),
        "steps_per_s": round(min(rates), 3) if rates else None,
    }
