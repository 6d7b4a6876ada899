"""The C encoder writes, byte for byte, the lines of the Python encoder (records.Encoder),
through the writer thread and through the drainer: numbers on both sides of 2**32,
timestamps below and across the 100-second steps whose leading digits the encoder
keeps, threads taking turns."""

from __future__ import annotations

import itertools
import os

import pytest

import dftrace
from dftrace._core import engine
from dftrace._core.records import Encoder, Extra, kind_id
from dftrace import testing

#: Timestamps (µs): below 10**8, at and around its multiples, and today's.
TIMESTAMPS = [0, 7, 99_999_999, 100_000_000, 100_000_001, 199_999_999, 200_000_000,
              1_764_000_099_999_998, 1_764_000_099_999_999, 1_764_000_100_000_000,
              1_764_000_100_000_001, 1_764_000_200_000_000]
NUMBERS = [1, 9, 10, 99, 100, 65_535, 99_999_999, 100_000_000, 2**32 - 1, 2**32, 2**40 + 3]
TIDS = [1, 4242, 2**32 + 5]


@pytest.mark.skipif(engine.speedups is None, reason="the C engine is not in use")
@pytest.mark.parametrize("writer", ["thread", "process"])
def test_c_lines_are_the_python_encoder_s(tmp_path, writer):
    kinds = [kind_id("forward", "compute"), kind_id("a\"b", "c\\d"), kind_id("x" * 50, "cat")]
    extras = [None, Extra({"a": 1}), Extra({"s": "v" * 40, "l": [1, 2]})]
    records = []
    numbers = itertools.cycle(NUMBERS)
    with testing.trace_to(tmp_path, validate=False, writer=writer) as t:  # made-up records
        s = dftrace.session()
        off = s.encoder.offset_ns
        for k, (ts, tid) in enumerate(itertools.product(TIMESTAMPS, TIDS)):
            t0 = ts * 1000 - off + k % 1000
            t1 = t0 + [0, 999, 1000, 10**9, 10**13][k % 5]
            x = extras[k % 3]
            rec = (kinds[k % 3], t0, t1, next(numbers), next(numbers), 1 + k % 4, tid,
                   x, [-1, 0, 2**33][k % 3], k % 2)
            records.append(rec)
            engine.record(*rec[:7], None, *rec[7:])  # no sticky args
        encoder = Encoder(s.pid, s.hhash, off)
    expected = encoder.encode_spans([
        (kid, t0, t1, i, p, lvl, tid, x.frag if x is not None else b"", count, flags)
        for kid, t0, t1, i, p, lvl, tid, x, count, flags in records])
    (path,) = [p for p in t.paths if os.path.exists(p)]
    with open(path, "rb") as f:
        written = [line for line in f if b'"ph":"X"' in line]
    assert b"".join(written) == expected
