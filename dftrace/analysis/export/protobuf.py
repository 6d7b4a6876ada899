"""Protocol Buffers' wire format, written by hand a column at a time with numpy: each
field of a message over n rows (:class:`Field`: a constant, a varint, a fixed64, bytes
or a nested message) knows each row's length and writes itself at each row's position,
so a batch of messages is laid out (:func:`layout`) without a Python loop per row."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

#: Bytes fields copy this many rows' bytes at a time.
WRITE_ROWS = 65_536

VARINT, FIXED64, LEN = 0, 1, 2


def varint(value: int) -> bytes:
    """``value`` as a protobuf varint (a negative int64 as its two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def int_field(number: int, value: int) -> bytes:
    return tag(number, VARINT) + varint(value)


def message(number: int, payload: bytes | str) -> bytes:
    """A length-delimited field: a string, bytes or a nested message."""
    data = payload.encode() if isinstance(payload, str) else payload
    return tag(number, LEN) + varint(len(data)) + data


@dataclass
class Rows:
    """Byte strings stored flat, one per row: row i is ``data[offsets[i]:offsets[i + 1]]``
    (``offsets[0]`` is 0)."""

    data: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def sized(data: np.ndarray, lengths: np.ndarray) -> Rows:
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Rows(data, offsets)


def positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices ``starts[i] .. starts[i] + lengths[i] - 1`` of every row, in order."""
    ends = np.cumsum(lengths)
    return np.arange(int(ends[-1]) if len(ends) else 0) + np.repeat(starts - (ends - lengths), lengths)


def text_rows(values: pl.Series) -> Rows:
    """Strings as their UTF-8 bytes (null as empty)."""
    text = values.cast(pl.String).fill_null("")
    data = np.frombuffer("".join(text.to_list()).encode(), np.uint8)
    return sized(data, text.str.len_bytes().cast(pl.Int64).to_numpy())


def varint_lengths(values: np.ndarray) -> np.ndarray:
    lengths = np.ones(len(values), np.int64)
    rest = values >> np.uint64(7)
    while rest.any():
        lengths += rest != 0
        rest >>= np.uint64(7)
    return lengths


def write_varints(out: np.ndarray, starts: np.ndarray, values: np.ndarray, lengths: np.ndarray) -> None:
    """Each of ``values`` (uint64) as a varint of its ``lengths`` at ``starts`` in ``out``."""
    for k in range(int(lengths.max(initial=0))):
        rows = lengths > k if k else slice(None)
        low = (values[rows] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (lengths[rows] > k + 1).astype(np.uint64) << np.uint64(7)
        out[starts[rows] + k] = low | more


def as_uint64(values: np.ndarray) -> np.ndarray:
    """Integers as protobuf writes them: an int64 as its two's complement."""
    return np.ascontiguousarray(values).astype(np.int64, copy=False).view(np.uint64)


class Field:
    """One field of a message in n rows: ``lengths`` (0 where the row has none) and how
    to write it at each row's position."""

    lengths: np.ndarray

    def write(self, out: np.ndarray, at: np.ndarray) -> None:
        raise NotImplementedError


class Const(Field):
    """The same bytes in each row that has them (a tag with its value)."""

    def __init__(self, value: bytes, n: int, present: np.ndarray | None = None):
        self.value, self.present = value, present
        self.lengths = np.full(n, len(value), np.int64) if present is None else present * len(value)

    def write(self, out: np.ndarray, at: np.ndarray) -> None:
        starts = at if self.present is None else at[self.present]
        for j, byte in enumerate(self.value):
            out[starts + j] = byte


class Varint(Field):
    """A varint field: its tag, then the row's value."""

    def __init__(self, tag: bytes, values: np.ndarray, present: np.ndarray | None = None):
        self.tag, self.present = tag, present
        self.values = as_uint64(values if present is None else values[present])
        self.sizes = varint_lengths(self.values)
        if present is None:
            self.lengths = self.sizes + len(tag)
        else:
            self.lengths = np.zeros(len(present), np.int64)
            self.lengths[present] = self.sizes + len(tag)

    def write(self, out: np.ndarray, at: np.ndarray) -> None:
        starts = at if self.present is None else at[self.present]
        for j, byte in enumerate(self.tag):
            out[starts + j] = byte
        write_varints(out, starts + len(self.tag), self.values, self.sizes)


class Fixed64(Field):
    """A fixed64 or double field: its tag, then the value's 8 bytes, little-endian."""

    def __init__(self, tag: bytes, values: np.ndarray, present: np.ndarray):
        self.tag, self.present = tag, present
        kept = values[present]
        self.raw = np.ascontiguousarray(kept.astype("<f8" if kept.dtype.kind == "f" else "<u8")).view(
            np.uint8).reshape(-1, 8)
        self.lengths = present * (len(tag) + 8)

    def write(self, out: np.ndarray, at: np.ndarray) -> None:
        starts = at[self.present]
        for j, byte in enumerate(self.tag):
            out[starts + j] = byte
        starts = starts + len(self.tag)
        for j in range(8):
            out[starts + j] = self.raw[:, j]


class Bytes(Field):
    """Rows of ``source`` (``index``: which row, where ``present``), each after ``tag``
    and its length (a string or bytes field), or bare for an empty ``tag``."""

    def __init__(self, tag: bytes, source: Rows, index: np.ndarray, present: np.ndarray | None = None):
        self.tag, self.present = tag, present
        self.index = index if present is None else index[present]
        self.sizes = source.lengths[self.index]
        self.source = source
        self.prefix = varint_lengths(as_uint64(self.sizes)) + len(tag) if tag else np.zeros(len(self.sizes), np.int64)
        if present is None:
            self.lengths = self.prefix + self.sizes
        else:
            self.lengths = np.zeros(len(present), np.int64)
            self.lengths[present] = self.prefix + self.sizes

    def write(self, out: np.ndarray, at: np.ndarray) -> None:
        starts = at if self.present is None else at[self.present]
        if self.tag:
            for j, byte in enumerate(self.tag):
                out[starts + j] = byte
            write_varints(out, starts + len(self.tag), as_uint64(self.sizes), self.prefix - len(self.tag))
        for begin in range(0, len(starts), WRITE_ROWS):  # the byte indices of a slice at a time
            rows = slice(begin, begin + WRITE_ROWS)
            sizes = self.sizes[rows]
            out[positions(starts[rows] + self.prefix[rows], sizes)] = self.source.data[
                positions(self.source.offsets[:-1][self.index[rows]], sizes)]


class Message(Field):
    """A nested message: its tag and length, then its fields."""

    def __init__(self, tag: bytes, fields: list[Field], present: np.ndarray | None = None):
        self.tag, self.fields, self.present = tag, fields, present
        inner = np.sum([f.lengths for f in fields], axis=0)
        self.inner = as_uint64(inner if present is None else inner[present])
        self.sizes = varint_lengths(self.inner)
        self.prefix = np.zeros(len(inner), np.int64)
        if present is None:
            self.prefix += self.sizes + len(tag)
        else:
            self.prefix[present] = self.sizes + len(tag)
        self.lengths = self.prefix + inner

    def write(self, out: np.ndarray, at: np.ndarray) -> None:
        starts = at if self.present is None else at[self.present]
        for j, byte in enumerate(self.tag):
            out[starts + j] = byte
        write_varints(out, starts + len(self.tag), self.inner, self.sizes)
        write_fields(out, at + self.prefix, self.fields)


def write_fields(out: np.ndarray, at: np.ndarray, fields: list[Field]) -> None:
    at = at.copy()
    for f in fields:
        f.write(out, at)
        at += f.lengths


def layout(fields: list[Field], n: int) -> Rows:
    """n rows, each the fields one after the other."""
    lengths = np.sum([f.lengths for f in fields], axis=0) if fields else np.zeros(n, np.int64)
    rows = sized(np.empty(int(lengths.sum()), np.uint8), lengths)
    write_fields(rows.data, rows.offsets[:-1], fields)
    return rows
