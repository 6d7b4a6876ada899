"""Packets put in order a batch at a time and spilled to run files, then merged back
in time order, a block of each run at a time: a sort whose memory is a batch and the
merge's blocks, whatever the number of packets."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .protobuf import Rows, sized

#: Packets the merge holds, over all runs together (at least MIN_BLOCK a run), and
#: hands on at a time.
MERGE_ROWS = 262_144
MIN_BLOCK = 1_024
WRITE_ROWS = 65_536


@dataclass
class Packets:
    """Packets without their timestamps, in order, and the keys that ordered them:
    time, then (at one time) ends before begins, longer slices first, outer levels
    first, then the event's number; a zero-length slice's end right after its begin."""

    ts: np.ndarray
    #: INT64_MIN for an end, else minus the slice's length (0 for other packets).
    order: np.ndarray
    #: level << 42 | event number << 1 | (1 for the end of a zero-length slice).
    tie: np.ndarray
    bodies: Rows

    def __len__(self) -> int:
        return len(self.ts)



RUN_KEYS = np.dtype([("ts", "<i8"), ("order", "<i8"), ("tie", "<i8"), ("size", "<i4")])


@dataclass
class Run:
    """A file of packets in order: their keys, then their bodies."""

    path: str
    rows: int


def write_run(path: str, packets: Packets) -> Run:
    keys = np.empty(len(packets), RUN_KEYS)
    keys["ts"], keys["order"], keys["tie"] = packets.ts, packets.order, packets.tie
    keys["size"] = packets.bodies.lengths
    with open(path, "wb") as fh:
        fh.write(keys.tobytes())
        fh.write(packets.bodies.data.tobytes())
    return Run(path, len(packets))


class _Cursor:
    """A run read a block at a time: the rows read and not yet merged."""

    def __init__(self, run: Run):
        self.run = run
        self.next_row = 0  # the first row not read yet
        self.next_body = 0
        self.keys = np.empty(0, RUN_KEYS)
        self.bodies = sized(np.empty(0, np.uint8), np.zeros(0, np.int64))
        self.at = 0  # the first row read and not yet merged

    @property
    def waiting(self) -> int:
        return len(self.keys) - self.at

    @property
    def done_reading(self) -> bool:
        return self.next_row == self.run.rows

    def read(self, rows: int) -> None:
        """Append the next ``rows`` rows of the run to the rows waiting."""
        count = min(rows, self.run.rows - self.next_row)
        with open(self.run.path, "rb") as fh:
            fh.seek(self.next_row * RUN_KEYS.itemsize)
            keys = np.frombuffer(fh.read(count * RUN_KEYS.itemsize), RUN_KEYS)
            size = int(keys["size"].sum())
            fh.seek(self.run.rows * RUN_KEYS.itemsize + self.next_body)
            data = np.frombuffer(fh.read(size), np.uint8)
        self.next_row += count
        self.next_body += size
        kept = self.bodies.offsets[self.at]
        self.keys = np.concatenate([self.keys[self.at:], keys])
        self.bodies = sized(np.concatenate([self.bodies.data[kept:], data]), self.keys["size"].astype(np.int64))
        self.at = 0

    def take_before(self, ts: int | None) -> tuple[np.ndarray, np.ndarray]:
        """The waiting rows earlier than ``ts`` (all of them for None): keys and bodies."""
        stop = len(self.keys) if ts is None else self.at + int(np.searchsorted(self.keys["ts"][self.at:], ts))
        keys = self.keys[self.at:stop]
        data = self.bodies.data[self.bodies.offsets[self.at]:self.bodies.offsets[stop]]
        self.at = stop
        return keys, data


def merged(runs: list[Run]) -> Iterator[tuple[np.ndarray, Rows, np.ndarray]]:
    """The packets of ``runs`` in order, in batches of about ``WRITE_ROWS``:
    (timestamps, bodies, the order of the bodies' rows).

    Each round takes from every run the rows earlier than the least last-read time of
    the runs with rows left to read: no row not yet read can come before them, and
    rows at that time wait for the next round (if every row waiting is at it, the runs
    stopped at it read on). A round's rows are all later than the round's before, so
    the rows of several rounds are put in order together."""
    if not runs:
        return
    block = max(MIN_BLOCK, MERGE_ROWS // len(runs))
    cursors = [_Cursor(run) for run in runs]
    never = np.iinfo(np.int64).max
    first = np.full(len(cursors), never)  # each run's first waiting time (never: none waiting)
    last = np.full(len(cursors), never)  # each run's last time read (never: all read)

    def read(i: int) -> None:
        cursor = cursors[i]
        cursor.read(block)
        first[i] = cursor.keys["ts"][cursor.at]
        last[i] = never if cursor.done_reading else cursor.keys["ts"][-1]

    for i in range(len(cursors)):
        read(i)
    taken: list[tuple[np.ndarray, np.ndarray]] = []
    while True:
        bound = int(last.min())
        if bound == never and first.min() == never:
            break
        within = np.flatnonzero(first < bound)
        if not len(within):  # every run with rows earlier than the others waits at the bound
            for i in np.flatnonzero(last == bound):
                read(i)
            continue
        for i in within:
            cursor = cursors[i]
            taken.append(cursor.take_before(None if bound == never else bound))
            if cursor.waiting:
                first[i] = cursor.keys["ts"][cursor.at]
            elif not cursor.done_reading:
                read(i)
            else:
                first[i] = never
        if sum(len(k) for k, _ in taken) >= WRITE_ROWS:
            yield _in_order(taken)
            taken = []
    if taken:
        yield _in_order(taken)


def _in_order(taken: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, Rows, np.ndarray]:
    keys = np.concatenate([k for k, _ in taken])
    bodies = sized(np.concatenate([d for _, d in taken]), keys["size"].astype(np.int64))
    order = np.lexsort((keys["tie"], keys["order"], keys["ts"]))
    return keys["ts"][order], bodies, order
