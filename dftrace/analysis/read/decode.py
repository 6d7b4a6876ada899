"""Reading one partition into a table of events plus the metadata records it holds.

This is the function every executor runs on its workers. The fastest path hands the
decoded bytes to the C scanner (``runtime/scan.c``, built with the package), which pulls the
requested fields of every line into column buffers without the GIL; lines it cannot
read are looked at again with orjson (a broken line is reported, anything else sends
the partition down the next path). Without the scanner, or when the full ``args``
text is wanted, the bytes are split into lines and polars parses all events at once;
metadata lines (a handful per file) and any partition polars refuses (a broken line
in the middle, an arg of an unexpected type) are parsed line by line with orjson,
which reports each broken line instead of failing.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np
import orjson
import polars as pl

from ... import format as fmt
from ..runtime import kernels
from . import kineto as _kineto
from .schema import EVENT_COLUMNS, HOST_KEY, RAW_FIELDS, coerce_value
from .parquet import read_parquet_parts
from .partition_data import (MAX_BROKEN_KEPT, PHASE_CODES, PartitionData, ScannedPiece, Wanted, meta_record,
                             note_cut_off, output_type, text_passes, without_name_or_ph)
from .sources import Partition



_T = TypeVar("_T")
#: What ``read_ahead``'s thread hands over when the pieces have ended.
_ENDED: Any = object()


def read_partition(
    partition: Partition,
    columns: Iterable[str] | None = None,
    arg_columns: dict[str, tuple[str, pl.DataType]] | None = None,
) -> PartitionData:
    """Read ``partition`` into :class:`PartitionData` with the given event columns.

    ``columns`` defaults to the whole schema (``dftrace.analysis.EVENT_COLUMNS``);
    asking for fewer (the summary needs eight) skips decoding the rest, which is
    what makes the summary fast. ``arg_columns`` adds columns read from other args:
    column name -> (key in ``args``, type); a value of another type is converted
    where it can be (numbers to text as JSON) and is null otherwise. Never raises
    on bad content.
    """
    wanted = _wanted(columns, arg_columns)
    if partition.is_parquet:
        return _read_parquet(partition, wanted)
    return joined_pieces(list(_pieces(partition, wanted)))


def iter_partition_pieces(partition: Partition, columns: Iterable[str] | None = None, *,
                          piece_bytes: int = fmt.LINE_PIECE_BYTES, inflate_ahead: bool = True,
                          scanned: bool = False,
                          arg_columns: dict[str, tuple[str, pl.DataType]] | None = None) -> Iterator[PartitionData]:
    """``read_partition`` in pieces of whole lines (``fmt.LINE_PIECE_BYTES`` of
    decoded text each), read one after the other: a consumer that reduces each
    piece before asking for the next holds one piece at a time, whatever the
    partition expands to. Line numbers count from each piece's start. The next
    piece is inflated on a thread of its own while this one is scanned, unless
    ``inflate_ahead`` is false (for a consumer that decodes pieces ahead itself). With
    ``scanned``, a piece the C scanner reads comes as its columns (``PartitionData.scanned``).
    ``arg_columns`` as for ``read_partition``."""
    wanted = _wanted(columns, arg_columns)
    if partition.is_parquet:
        yield _read_parquet(partition, wanted)
        return
    yield from _pieces(partition, wanted, piece_bytes, inflate_ahead, scanned)


def read_ahead(pieces: Generator[_T, None, None]) -> Iterator[_T]:
    """``pieces`` with the next one decoded on a thread of its own while the caller
    reduces this one: the inflate, the scanner and polars run without the GIL, so
    decoding and reducing share the CPUs. Two pieces are held at a time, the one
    handed over and the one being decoded. An error decoding a piece is raised where
    that piece is asked for; closing this iterator waits for the piece under way,
    drops it and closes ``pieces``."""

    def decode_next(box: list[Any]) -> None:
        try:
            box.append((next(pieces, _ENDED), None))
        except BaseException as error:  # handed to the caller with the piece it stood for
            box.append((None, error))

    def start() -> tuple[threading.Thread, list[Any]]:
        box: list[Any] = []
        thread = threading.Thread(target=decode_next, args=(box,), name="dftrace-read-ahead", daemon=True)
        thread.start()
        return thread, box

    worker, box = start()
    try:
        while True:
            worker.join()
            piece, error = box.pop()
            if error is not None:
                raise error
            if piece is _ENDED:
                return
            worker, box = start()
            yield piece
            del piece
    finally:
        worker.join()
        box.clear()
        pieces.close()


def _pieces(partition: Partition, wanted: Wanted, piece_bytes: int = fmt.LINE_PIECE_BYTES,
            inflate_ahead: bool = True, scanned: bool = False) -> Iterator[PartitionData]:
    first = True
    lines = fmt.iter_line_pieces(partition.path, partition.start, partition.end, piece_bytes=piece_bytes)
    for piece in read_ahead(lines) if inflate_ahead else lines:
        if first and _kineto.looks_like_document(piece.data[:_kineto.SNIFF_BYTES]):
            del piece
            yield _read_document(partition, wanted)  # one JSON object: read whole
            return
        first = False
        result = PartitionData(partition, _empty(wanted), cut_off=piece.cut_off)
        for number in piece.long_lines:
            result.note_broken(number, f"a line longer than {fmt.MAX_LINE_BYTES >> 20} MiB (not read)")
        holder = [piece.data]
        del piece
        if not holder[0]:
            if result.cut_off is not None:  # a cut with nothing decoded before it is a broken line too
                note_cut_off(result, result.cut_off)
            yield result
        elif kernels.C is not None and "args" not in wanted and _read_scanned(result, holder[0], wanted,
                                                                          scanned=scanned):
            holder.clear()  # the piece's bytes are read: not held while the consumer works
            yield result
        else:
            yield _read_lines(result, holder, wanted)


def _read_document(partition: Partition, wanted: Wanted) -> PartitionData:
    """A PyTorch profiler trace (one JSON document), read whole."""
    decoded = fmt.read_trace_bytes(partition.path, partition.start, partition.end)
    result = PartitionData(partition, _empty(wanted), cut_off=decoded.cut_off)
    _kineto.fill_partition(result, decoded.data, wanted, result.events.schema)
    return result


def joined_pieces(pieces: list[PartitionData]) -> PartitionData:
    """Consecutive pieces of one partition as one (line numbers continued)."""
    if len(pieces) == 1:
        return pieces[0]
    broken: list[tuple[int, str]] = []
    lines = 0
    for p in pieces:
        broken.extend((lines + number, reason) for number, reason in p.broken)
        lines += p.n_lines
    return PartitionData(
        pieces[0].partition, pl.concat([p.events for p in pieces], how="vertical"),
        meta=[record for p in pieces for record in p.meta], n_lines=lines, broken=broken[:MAX_BROKEN_KEPT],
        broken_count=sum(p.broken_count for p in pieces), cut_off=pieces[-1].cut_off,
        closed=any(p.closed for p in pieces),
    )


def _read_lines(result: PartitionData, holder: list[bytes], wanted: Wanted) -> PartitionData:
    """Split the bytes into lines and let polars parse them (see the module docstring).

    ``holder`` holds the only reference to the bytes, dropped once they are split."""
    data = holder.pop()
    ends_with_newline = data.endswith(b"\n")
    # Keep read_lines' chunks: json_decode runs chunks in parallel, and a single
    # rechunked column decodes several times slower.
    try:
        text = pl.read_lines(data, name="text").get_column("text")
    except pl.exceptions.ComputeError:  # bytes that are not UTF-8: those lines are broken
        data = _utf8_lines(result, data)
        text = pl.read_lines(data, name="text").get_column("text")
    del data  # the lines hold their own copy: free the bytes before parsing
    result.n_lines = text.len()
    is_object = text.str.starts_with("{")
    others = (~is_object).arg_true()
    indented = False
    for index, line in zip(others.to_list(), text.gather(others).to_list()):
        indented |= _classify_other(result, index + 1, line)
    if indented:
        # Some writer indents its event lines: strip every line (rare, so the copy
        # is not made for the usual layout).
        text = text.str.strip_chars()
        is_object = text.str.starts_with("{")
        others = (~is_object).arg_true()
    candidates = _Candidates(text.filter(is_object), others.to_numpy())
    last_is_object = not others.len() or others[-1] != result.n_lines - 1
    if candidates.text.len() and last_is_object and not ends_with_newline:
        # A crash can cut the last line; check it alone rather than failing the batch.
        line = fmt.parse_line(candidates.text[-1].encode())
        if line.error is not None:
            result.note_broken(result.n_lines, line.error)
            candidates.text = candidates.text.head(-1)
    if result.cut_off is not None:
        note_cut_off(result, result.cut_off)
    if candidates.text.str.ends_with(",").any():
        candidates.text = candidates.text.str.strip_suffix(",")
    try:
        events, meta_lines = _decode_fast(result, candidates, wanted)
    except (pl.exceptions.PolarsError, _Misread):
        events, meta_lines = _decode_slow(result, candidates, wanted)
    result.meta = [meta_record(result, number, line) for number, line in meta_lines]
    result.meta = [record for record in result.meta if record is not None]
    result.events = events
    result.broken.sort()
    return result


_KIND_INT, _KIND_STR, _KIND_BOOL, _KIND_FLOAT, _KIND_WHOLE, _KIND_PHASE = 0, 1, 2, 3, 4, 5
_LINE_EVENT, _LINE_OTHER, _LINE_UNREAD = 0, 1, 2
_INT64 = (-(2**63), 2**63 - 1)
#: The top-level keys every event line is checked on (``fmt.event_problems``), read
#: whatever the command wants: a line breaks the same rules for every command. The
#: scanner takes the ranges of the rules and leaves a line out of them unread.
_RULED = {"ph": (_KIND_PHASE, _INT64), "name": (_KIND_STR, _INT64), "cat": (_KIND_STR, _INT64),
          "pid": (_KIND_WHOLE, (0, fmt.MAX_ID)), "tid": (_KIND_WHOLE, (0, fmt.MAX_ID)),
          "ts": (_KIND_INT, (0, fmt.MAX_TIME_US)), "dur": (_KIND_INT, (0, fmt.MAX_TIME_US))}


def _scan_kind(where: str, key: str, dtype: pl.DataType) -> tuple[int, tuple[int, int]]:
    """How the scanner reads a field: its kind and the range of its integers."""
    if where == "top" and key in _RULED:
        return _RULED[key]
    kind = (_KIND_STR if dtype == pl.String else _KIND_BOOL if dtype == pl.Boolean
            else _KIND_FLOAT if dtype == pl.Float64 else _KIND_INT)
    return kind, _INT64


def _read_scanned(result: PartitionData, data: bytes, wanted: Wanted, *, scanned: bool = False) -> bool:
    """Fill ``result`` from the C scanner's columns; False (``result`` untouched) when a
    line holds valid JSON the scanner cannot take (a value of an unexpected type).
    With ``scanned`` the columns are left as they were read (``result.scanned``) and
    ``result.events`` empty: for a consumer that reduces them itself."""
    sources = list(dict.fromkeys([*(RAW_FIELDS[key] for key in _RULED),
                                  *(s for s in wanted.values() if s is not None)]))
    spec = tuple((int(where == "args"), key.encode(), kind, *bounds)
                 for where, key, dtype in sources for kind, bounds in [_scan_kind(where, key, dtype)])
    raw_starts, raw_status, raw_columns = kernels.C.scan_lines(data, spec, fmt.MAX_DEPTH)
    starts = np.frombuffer(raw_starts, dtype=np.int64)
    status = np.frombuffer(raw_status, dtype=np.uint8)

    def line(index: int) -> bytes:
        return data[starts[index]:starts[index + 1]].strip()

    broken: list[tuple[int, str]] = []
    closed = False
    for index in np.flatnonzero(status != _LINE_EVENT).tolist():
        parsed = fmt.parse_line(line(index))
        problems = fmt.event_problems(parsed.event) if parsed.event is not None else []
        if parsed.error is not None or problems:
            broken.append((index + 1, parsed.error or problems[0][1]))
        elif parsed.event is not None:
            return False  # valid JSON the scanner does not read: the polars path will
        elif parsed.text == b"]":
            closed = True
    texts: dict[tuple[str, str], tuple[list[str | None], np.ndarray]] = {}
    numbers: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    for (where, key, dtype), raw in zip(sources, raw_columns):
        if dtype == pl.String:
            text = _scanned_text(raw, PHASE_CODES if (where, key) == ("top", "ph") else None)
            if text is None:
                return False
            texts[where, key] = text
        else:
            values, valid = raw
            numbers[where, key] = (np.frombuffer(values, dtype=np.float64 if dtype == pl.Float64 else np.int64),
                                   np.frombuffer(valid, dtype=np.bool_))
    ph, name = texts["top", "ph"], texts["top", "name"]
    is_event = status == _LINE_EVENT
    is_meta = is_event & text_passes(*ph, lambda value: value == fmt.PH_METADATA)
    no_ph, no_name = (is_event & text_passes(*text, lambda value: value is None) for text in (ph, name))
    missing = without_name_or_ph(result, no_ph, is_meta, no_name, lambda mask: np.flatnonzero(mask) + 1)
    piece = ScannedPiece(
        {column: texts[source[:2]] for column, source in wanted.items() if source[2] == pl.String},
        {column: numbers[source[:2]] for column, source in wanted.items() if source[2] != pl.String},
        ph, is_event & ~missing & ~is_meta, wanted)
    result.n_lines = len(status)
    result.closed = closed
    for number, reason in sorted(broken):
        result.note_broken(number, reason)
    if result.cut_off is not None:
        note_cut_off(result, result.cut_off)
    meta = (meta_record(result, index + 1, line(index).decode(errors="replace"))
            for index in np.flatnonzero(is_meta).tolist())
    result.meta = [record for record in meta if record is not None]
    if scanned:
        result.scanned = piece
    else:
        result.events = piece.events()
    result.broken.sort()
    return True


def _scanned_text(raw: tuple[list[bytes], bytes], replace: dict[str, str] | None
                  ) -> tuple[list[str | None], np.ndarray] | None:
    """A scanned text column as (distinct values, each line's index; see
    ``ScannedPiece``); None if a value is not UTF-8. ``replace`` maps values, once each."""
    distinct, codes = raw
    try:
        values: list[str | None] = [orjson.loads(b'"' + text + b'"') if b"\\" in text else text.decode()
                                    for text in distinct]
    except (orjson.JSONDecodeError, UnicodeDecodeError):
        return None
    if replace:
        values = [replace.get(value, value) for value in values]  # type: ignore[arg-type]
    index = np.frombuffer(codes, dtype=np.int32)
    if index.size and index.min() < 0:  # lines without the key: a null value after the others
        index = np.where(index < 0, len(values), index).astype(np.int32)
        values.append(None)
    first: dict[str | None, int] = {}
    canonical = [first.setdefault(value, place) for place, value in enumerate(values)]
    if len(first) < len(values):  # two spellings of one value (escaped, or a phase's code and letter)
        index = np.asarray(canonical, dtype=np.int32)[index]
    return values, index


class _Candidates:
    """The lines that start with ``{``, and how to find their line numbers again."""

    def __init__(self, text: pl.Series, removed: np.ndarray):
        self.text = text
        # Candidate i sits at line i + 1 + (lines removed before it); removed[j] - j
        # is how many candidates precede the j-th removed line.
        self._shift = removed - np.arange(len(removed))

    def line_numbers(self, positions: np.ndarray) -> np.ndarray:
        """1-based line numbers of the candidates at ``positions``."""
        return positions + np.searchsorted(self._shift, positions, side="right") + 1


def _wanted(columns: Iterable[str] | None, arg_columns: dict[str, tuple[str, pl.DataType]] | None) -> Wanted:
    if columns is None:
        names = [c for c in EVENT_COLUMNS if c not in ("host", "rank")]
    else:
        unknown = set(columns) - set(EVENT_COLUMNS)
        if unknown:
            raise ValueError(f"unknown event columns {sorted(unknown)}; known: {list(EVENT_COLUMNS)}")
        names = [c for c in EVENT_COLUMNS if c in set(columns) and c not in ("host", "rank")]
    wanted: Wanted = {c: RAW_FIELDS.get(c) for c in names}
    for column, (key, dtype) in (arg_columns or {}).items():
        if column in EVENT_COLUMNS:
            raise ValueError(f"arg column {column!r} has the name of an event column")
        wanted[column] = ("args", key, dtype)
    return wanted


def _empty(wanted: Wanted) -> pl.DataFrame:
    schema = {c: output_type(c, wanted) for c in wanted}
    schema[HOST_KEY] = pl.String
    return pl.DataFrame(schema=schema)


def _utf8_lines(result: PartitionData, data: bytes) -> bytes:
    """``data`` with every line that is not UTF-8 emptied and noted as broken (line
    numbers stay as they were)."""
    lines = data.split(b"\n")
    for index, line in enumerate(lines):
        try:
            line.decode()
        except UnicodeDecodeError as exc:
            result.note_broken(index + 1, f"not UTF-8 text: byte {line[exc.start]:#04x} at column {exc.start + 1}")
            lines[index] = b""
    return b"\n".join(lines)


def _classify_other(result: PartitionData, number: int, text: str) -> bool:
    """Note a line that does not start with ``{``; True if it is an indented event."""
    stripped = text.strip()
    line = fmt.parse_line(stripped.encode())
    if line.is_structural:
        if stripped == "]":
            result.closed = True
    elif line.error is not None:
        result.note_broken(number, line.error)
    return line.event is not None


# Top-level keys in the order writers put them: decoding is fastest when the
# requested struct follows the document order.
_TOP_ORDER = ("id", "name", "cat", "pid", "tid", "ts", "dur", "ph")


def _struct_dtype(wanted: Wanted) -> pl.Struct:
    top: dict[str, Any] = {}
    args: dict[str, Any] = {}
    for source in wanted.values():
        if source is not None:
            where, key, dtype = source
            (args if where == "args" else top)[key] = dtype
    for key in _RULED:  # read always: a line that breaks a rule on them is broken
        top[key] = RAW_FIELDS[key][2]
    ordered = {key: top[key] for key in _TOP_ORDER if key in top}
    if args:
        ordered["args"] = pl.Struct(args)
    return pl.Struct(ordered)


def _decode_fast(
    result: PartitionData, candidates: _Candidates, wanted: Wanted
) -> tuple[pl.DataFrame, list[tuple[int, str]]]:
    text = candidates.text
    # Through a frame: Series.str.json_decode runs sequentially, a select in parallel.
    parsed = text.to_frame().select(pl.col(text.name).str.json_decode(_struct_dtype(wanted))).unnest(text.name)
    ph = parsed.get_column("ph").replace(PHASE_CODES)
    is_meta = (ph == fmt.PH_METADATA).fill_null(False)
    if _misread(text, parsed, is_meta).any():
        raise _Misread
    if "args" in wanted:
        parsed = parsed.with_columns(text.str.json_path_match("$.args").alias("args_json"))
    missing = without_name_or_ph(result, ph.is_null().to_numpy(), is_meta.to_numpy(),
                                  parsed.get_column("name").is_null().to_numpy(),
                                  lambda mask: candidates.line_numbers(np.flatnonzero(mask)))
    numbers = candidates.line_numbers(is_meta.arg_true().to_numpy()).tolist()
    meta_lines = list(zip(numbers, text.filter(is_meta).to_list()))
    events = parsed.with_columns(ph).filter(~is_meta & ~pl.Series(missing))
    return _finish(events, wanted), meta_lines


class _Misread(Exception):
    """polars read a line otherwise than the rules do (``_misread``): the lines go the slow path."""


# Each ruled key with a value of its type (a number for a phase: DFTracer's codes, an
# integer for pid and tid), and args with an object: polars turns other types into
# text or null, keeps the first of a key given twice, and reads numbers out of range
# as null or as they are.
_RULED_KEY = (r'"ph"\s*:\s*["0-9]|"(?:name|cat)"\s*:\s*"|"(?:pid|tid)"\s*:\s*-?[0-9]+\s*[,}]'
              r'|"(?:ts|dur)"\s*:\s*[-0-9]|"args"\s*:\s*\{')
_RANGES = {"pid": (0, fmt.MAX_ID), "tid": (0, fmt.MAX_ID), "ts": (0, fmt.MAX_TIME_US), "dur": (0, fmt.MAX_TIME_US)}


def _misread(text: pl.Series, parsed: pl.DataFrame, is_meta: pl.Series) -> pl.Series:
    """Which event lines polars may have read otherwise than :func:`fmt.parse_line`,
    :func:`fmt.event_problems` and JSON's last-key-wins do: a ruled key spelled more
    often (or with another type) than polars found a value for it, a number out of
    its range, more brackets than ``fmt.MAX_DEPTH``. Such lines (and those with a
    ruled key inside their args, or many brackets in their text, rare) are read
    again line by line."""
    ruled = [key for key in (*_RULED, "args") if key in parsed.columns]
    found = pl.sum_horizontal(pl.col(key).is_not_null().cast(pl.UInt32) for key in ruled)
    out_of_range = pl.any_horizontal(~pl.col(key).is_between(lo, hi) for key, (lo, hi) in _RANGES.items())
    check = parsed.select(ruled).with_columns(spelled=text.str.count_matches(_RULED_KEY),
                                              opened=text.str.count_matches(r"[\[{]"))
    misread = check.select((pl.col("spelled") != found) | out_of_range.fill_null(False)
                           | (pl.col("opened") > fmt.MAX_DEPTH)).to_series()
    return misread & ~is_meta


def _finish(parsed: pl.DataFrame, wanted: Wanted) -> pl.DataFrame:
    """Turn decoded fields into schema columns (args unnested, p_idx <= 0 as null)."""
    args = pl.col("args")
    exprs = []
    for column, source in wanted.items():
        if source is None:
            exprs.append(pl.col("args_json").alias("args"))
            continue
        where, key, _ = source
        expr = args.struct.field(key) if where == "args" else pl.col(key)
        if column == "parent_id":
            expr = pl.when(expr > 0).then(expr)
        exprs.append(expr.cast(output_type(column, wanted)).alias(column))
    # Hosts of trace files are resolved per (file, pid) from the metadata.
    exprs.append(pl.lit("", pl.String).alias(HOST_KEY))
    return parsed.select(exprs)


def _decode_slow(
    result: PartitionData, candidates: _Candidates, wanted: Wanted
) -> tuple[pl.DataFrame, list[tuple[int, str]]]:
    """Parse line by line: slower, but reports each bad line and coerces odd types."""
    rows: dict[str, list[Any]] = {"ph": [], "args": [], "args_json": []}
    tops = ({s[1] for s in wanted.values() if s is not None and s[0] == "top"} | {"name"}) - {"ph"}
    for key in tops:
        rows[key] = []
    meta_lines = []
    numbers = candidates.line_numbers(np.arange(candidates.text.len())).tolist()
    for number, text in zip(numbers, candidates.text.to_list()):
        line = fmt.parse_line(text.encode())
        if line.error is not None:
            result.note_broken(number, line.error)
            continue
        event = line.event
        assert event is not None
        problems = fmt.event_problems(event)
        if problems:
            result.note_broken(number, problems[0][1])
            continue
        ph = fmt.normalize_phase(event.get("ph"))
        if ph == fmt.PH_METADATA:
            meta_lines.append((number, text))
            continue
        rows["ph"].append(ph)
        for key in tops:
            rows[key].append(event.get(key))
        raw_args = event.get("args")
        raw_args = raw_args if isinstance(raw_args, dict) else None
        rows["args"].append(raw_args)
        rows["args_json"].append(orjson.dumps(raw_args).decode() if raw_args is not None else None)
    fields = {f.name: f.dtype for f in _struct_dtype(wanted).fields}
    columns = {"ph": pl.Series(rows["ph"], dtype=pl.String)}
    for key, key_dtype in fields.items():
        if key in tops:
            columns[key] = pl.Series([coerce_value(v, key_dtype) for v in rows[key]], dtype=key_dtype)
    if "args" in fields:
        arg_fields = {f.name: f.dtype for f in fields["args"].fields}
        columns["args"] = pl.Series(
            [
                {k: coerce_value(a.get(k), t) for k, t in arg_fields.items()} if a is not None else None
                for a in rows["args"]
            ],
            dtype=pl.Struct(arg_fields),
        )
    columns["args_json"] = pl.Series(rows["args_json"], dtype=pl.String)
    return _finish(pl.DataFrame(columns), wanted), meta_lines


def _read_parquet(partition: Partition, wanted: Wanted) -> PartitionData:
    events, meta = read_parquet_parts(partition.path, [c for c in wanted if c in EVENT_COLUMNS])
    extra = [c for c in wanted if c not in EVENT_COLUMNS]
    if extra:
        # A Parquet file keeps the other args as JSON text in its args column.
        args = pl.read_parquet(partition.path, columns=["args"]).get_column("args")
        events = events.with_columns(
            args.str.json_path_match(f"$.{wanted[c][1]}").cast(output_type(c, wanted), strict=False).alias(c)
            for c in extra
        )
    # A Parquet file is written whole (no rotated parts, no crash-cut tail): it is finished.
    return PartitionData(partition, events, meta=meta, n_lines=0, closed=True)
