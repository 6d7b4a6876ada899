"""convert, merge and validate hold a piece of the input at a time, not its events:
their peak memory on a trace four times as long is the same (within a margin far
below what the extra events would take held), and every event is written."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest
import tracegen
from _peak_memory import PEAK_MB
import zstandard

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

#: Steps of the smaller trace (4 events each); the larger has four times as many.
STEPS = 50_000
#: Decoded bytes per piece in the commands' runs (the default is 64 MiB).
PIECE = 1 << 20
#: Peak memory the larger trace may add (MB): holding its 600,000 extra events would
#: take several times this (about 140 bytes each even as validate's former columns).
MARGIN_MB = 50


def _trace(folder: Path, steps: int) -> Path:
    """One rank's training loop: per step, two children written before their parent
    (as dftrace writes spans, when they end) and an instant event."""
    folder.mkdir()
    proc = tracegen.Process(5000, rank=0)
    head = b"[\n" + b"\n".join(orjson.dumps(e) for e in proc.metadata()) + b"\n"
    path = folder / "run-rank0-node0-5000.pfw.zst"
    with open(path, "wb") as fh, zstandard.ZstdCompressor(level=1).stream_writer(fh) as out:
        out.write(head)
        for step in range(steps):
            ts, parent = tracegen.T0_US + 100 * step, 3 * step + 1
            common = {"pid": 5000, "tid": 5000, "ph": "X"}
            out.write(b"\n".join((
                orjson.dumps({"id": parent + 1, "name": "forward", "cat": "compute", "ts": ts + 1, "dur": 30,
                              "args": {"level": 2, "p_idx": parent, "step": step}, **common}),
                orjson.dumps({"id": parent + 2, "name": "backward", "cat": "compute", "ts": ts + 40, "dur": 50,
                              "args": {"level": 2, "p_idx": parent, "step": step}, **common}),
                orjson.dumps({"id": parent, "name": "step", "cat": "pipeline", "ts": ts, "dur": 95,
                              "args": {"level": 1, "p_idx": 0, "step": step}, **common}),
                orjson.dumps({"name": "loss", "cat": "compute", "ts": ts + 96, "ph": "C", "pid": 5000, "tid": 5000,
                              "args": {"value": step}}),
            )) + b"\n")
        out.write(b"]\n")
    return folder


def _run(*argv: str) -> tuple[int, float]:
    """Exit code and peak memory (MB) of ``dftrace argv`` in a fresh interpreter that
    decodes pieces of PIECE bytes."""
    code = PEAK_MB + textwrap.dedent(f"""
        import contextlib, io, resource
        from dftrace import format as fmt
        whole = fmt.iter_line_pieces
        def small(*args, **kwargs):
            kwargs["piece_bytes"] = {PIECE}
            return whole(*args, **kwargs)
        fmt.iter_line_pieces = small
        from dftrace.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            rc = main({list(argv)!r})
        print(rc, peak_mb())
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    rc, peak = result.stdout.split()
    return int(rc), float(peak)


def _events_in(path: Path) -> tuple[int, int]:
    """(complete events, counter events) in an output file, counted from its text."""
    data = path.read_bytes()
    return data.count(b'"ph":"X"'), data.count(b'"ph":"C"')


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounded")
    return _trace(root / "small", STEPS), _trace(root / "large", 4 * STEPS)


@pytest.mark.parametrize("command", ["convert", "merge", "validate"])
def test_memory_does_not_grow_with_the_events(traces, tmp_path, command):
    peaks = []
    for trace, steps in zip(traces, (STEPS, 4 * STEPS)):
        if command == "validate":
            rc, peak = _run("validate", str(trace))
            assert rc == 0
        else:
            out = tmp_path / f"{trace.name}.pfw"
            rc, peak = _run(command, str(trace), "-o", str(out), "--no-progress")
            assert rc == 0 and _events_in(out) == (3 * steps, steps)
            if command == "merge":  # each process's events in time order
                times = [line.event["ts"] for line in fmt_lines(out) if line.event and line.event.get("ph") != "M"]
                assert times == sorted(times)
        peaks.append(peak)
    assert peaks[1] - peaks[0] < MARGIN_MB, peaks


def fmt_lines(path: Path):
    from dftrace import format as fmt

    return fmt.iter_trace_lines(path)
