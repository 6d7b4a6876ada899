"""What reading one partition gives (:class:`PartitionData`), what to read of it
(``Wanted``), the C scanner's columns before they are a table (:class:`ScannedPiece`)
with their column helpers, and the notes every reading path makes of broken lines and
metadata records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from ... import format as fmt
from .schema import EVENT_COLUMNS, HOST_KEY
from .sources import Partition

#: Broken lines (number and reason) kept per partition; all are counted.
MAX_BROKEN_KEPT = 100
#: DFTracer's numeric phase codes, as the letters they stand for.
PHASE_CODES = {str(code): letter for code, letter in fmt.DFTRACER_PHASES.items()}


@dataclass
class PartitionData:
    """What one partition holds: events, metadata records and how reading went."""

    partition: Partition
    #: The requested event columns plus ``host_key``: empty for trace files, whose
    #: hosts are resolved per (file, pid) from the metadata; the host itself for
    #: tables that already carry one (Parquet). ``host`` and ``rank`` are filled in
    #: once all partitions' metadata is known.
    events: pl.DataFrame
    #: Metadata events as ``{"pid", "tid", "name", "cat", "args"}`` dicts, in file order.
    meta: list[dict[str, Any]] = field(default_factory=list)
    #: Lines in this partition (to number broken lines across partitions).
    n_lines: int = 0
    #: ``(line number within the partition, reason)`` of the first broken lines.
    broken: list[tuple[int, str]] = field(default_factory=list)
    broken_count: int = 0
    #: Why decoding stopped before the end of the partition, if it did.
    cut_off: str | None = None
    #: Whether the closing ``]`` of a finalized file was seen.
    closed: bool = False
    #: GPU activity, launches and profiler steps of a PyTorch profiler trace, at
    #: nanosecond resolution (``_kineto.activity_schema()`` plus ``host_key``); None
    #: for other traces.
    activity: pl.DataFrame | None = None
    #: The event lines as the C scanner read them, where the reader asked for them
    #: (``iter_partition_pieces``' ``scanned``): ``events`` is then empty.
    scanned: ScannedPiece | None = None

    def note_broken(self, number: int, reason: str) -> None:
        self.broken_count += 1
        if len(self.broken) < MAX_BROKEN_KEPT:
            self.broken.append((number, reason))


#: What to decode: column -> (``"top"`` | ``"args"``, JSON key, type); ``args`` -> None.
Wanted = dict[str, "tuple[str, str, pl.DataType] | None"]


@dataclass
class ScannedPiece:
    """A piece's lines as the C scanner read them, one row a line, not yet a table:
    each text column as its distinct values and each line's index among them (a line
    without one indexes a last value, None; equal values share one index), each other
    column as its values and which of them are valid. ``kept`` marks the event lines
    (not metadata, structure or broken): the rows of ``events()``."""

    texts: dict[str, tuple[list[str | None], np.ndarray]]
    numbers: dict[str, tuple[np.ndarray, np.ndarray]]
    #: The phase of each line, as the texts are held.
    ph: tuple[list[str | None], np.ndarray]
    kept: np.ndarray
    wanted: Wanted

    def events(self) -> pl.DataFrame:
        """The event table ``read_partition`` gives for these lines."""
        keep = pl.Series(self.kept)
        columns = []
        for column, source in self.wanted.items():
            if column in self.texts:
                series = text_series(column, *self.texts[column])
            else:
                series = number_series(column, *self.numbers[column])
            if column == "parent_id":
                series = series.to_frame().select(pl.when(pl.col(column) > 0).then(pl.col(column))).to_series()
            columns.append(series.filter(keep).cast(output_type(column, self.wanted)))
        events = pl.DataFrame(columns, schema={c: output_type(c, self.wanted) for c in self.wanted})
        return events.with_columns(pl.lit("", pl.String).alias(HOST_KEY))


def text_passes(values: list[str | None], index: np.ndarray, test: Any) -> np.ndarray:
    """Whether each row's text ``values[index]`` passes ``test`` (called with each
    distinct value once, None included)."""
    return np.array([test(value) for value in values], dtype=np.bool_)[index]


def text_series(name: str, values: list[str | None], index: np.ndarray) -> pl.Series:
    """The texts ``values[index]``: a scanned text column's, or some rows of it."""
    # Indexed by a Series of polars' own index type: several times quicker than gather().
    return pl.Series(name, values, dtype=pl.String)[pl.Series(index, dtype=pl.UInt32)]


def number_series(name: str, values: np.ndarray, valid: np.ndarray) -> pl.Series:
    """A scanned number column's ``values`` (or some rows of them), null where not ``valid``."""
    return pl.Series(name, values if valid.all() else np.ma.masked_array(values, ~valid))


def output_type(column: str, wanted: Wanted) -> pl.DataType:
    source = wanted[column]
    return EVENT_COLUMNS[column] if column in EVENT_COLUMNS or source is None else source[2]


def note_cut_off(result: PartitionData, reason: str) -> None:
    """Count a cut-off stream once: on its last, cut line if that was broken."""
    if result.broken and result.broken[-1][0] == result.n_lines:
        number, error = result.broken[-1]
        result.broken[-1] = (number, f"{error} ({reason})")
    else:
        result.note_broken(result.n_lines + 1, reason)


def without_name_or_ph(result: PartitionData, no_ph: np.ndarray, is_meta: np.ndarray, no_name: np.ndarray,
                        numbers: Any) -> np.ndarray:
    """Note the events without a ``ph``, and those (other than metadata) without a
    ``name``, as broken lines; return which rows they are. The masks say which rows
    have no ph, are metadata and have no name; ``numbers(mask)`` gives the line
    numbers of the rows of a mask."""
    no_name = ~no_ph & ~is_meta & no_name
    for mask, reason in ((no_ph, "event without ph"), (no_name, "event without name")):
        if mask.any():
            for number in numbers(mask):
                result.note_broken(int(number), reason)
    return no_ph | no_name


def meta_record(result: PartitionData, number: int, text: str) -> dict[str, Any] | None:
    line = fmt.parse_line(text.encode())
    problems = fmt.event_problems(line.event) if line.event is not None else []
    if line.event is None or problems:
        result.note_broken(number, line.error or (problems[0][1] if problems else "not an event"))
        return None
    event = line.event
    args = event.get("args")
    return {
        "pid": event.get("pid"),
        "tid": event.get("tid"),
        "name": event.get("name"),
        "cat": event.get("cat"),
        "args": args if isinstance(args, dict) else {},
    }
