"""The summary reduces a piece the C scanner read straight from its columns, without a
table of its events: every partial table is the one the table path gives, on realistic
runs and on lines that exercise each rule (tracer and missing categories, the sketch's
exact bins and its buckets, epoch spans numbered by count or by epoch, loop bodies,
item waits and completions, collectives with and without a group, two spellings of one
name, integer phases, spans without a level); pieces it cannot reduce this way go the
table path."""

from __future__ import annotations

import orjson
import pytest
from _requirements import native_scanner_missing, needs_marks
from tracegen import collective_run, training_process, write_process

pl = pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis.reduce import aggregate as _aggregate  # noqa: E402
from dftrace.analysis.reduce import scanned as scanned_path  # noqa: E402
from dftrace.analysis.reduce.partial import PARTIAL_TABLES  # noqa: E402
from dftrace.analysis.read.decode import iter_partition_pieces  # noqa: E402
from dftrace.analysis.read.schema import SUMMARY_COLUMNS  # noqa: E402
from dftrace.analysis.read.sources import plan_partitions  # noqa: E402

pytestmark = needs_marks("native", native_scanner_missing())

PIECE_BYTES = 4096  # a piece for each MiB read: spans whose parent is in another piece


def _span(name, cat, ts, dur, *, pid=7, tid=7, ph='"X"', **args):
    body = {"name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    text = orjson.dumps(body)[:-1] + b',"ph":' + ph.encode()
    return text + b',"args":' + orjson.dumps(args) + b"}"


#: Lines for each rule of the reduction, in one process's file.
_RULE_LINES = [
    b'{"name":"process_name","cat":"dftrace","pid":7,"tid":7,"ph":"M","args":{"name":"rank 0"}}',
    _span("train", "pipeline", 0, 10_000, level=1),
    _span("epoch", "pipeline", 10, 4_000, level=2, count=3, epoch=9),  # a count, among others: by its events
    _span("epoch", "pipeline", 4_100, 4_000, level=2, epoch=5),
    _span("epoch", "pipeline", 8_200, 100, level=2),  # no epoch number: left out
    _span("fetch.block", "dataloader", 20, 100, level=3, epoch=0, step=1, count=1),
    _span("fetch.iter", "dataloader", 20, 30, level=4, epoch=0, count=1),
    _span("forward", "compute", 60, 40, level=4, epoch=0, step=1),
    _span("forw\\u0061rd", "compute", 120, 40, level=4, epoch=0, step=1).replace(b"\\\\u", b"\\u"),
    _span("forward", "compute", 200, 40, ph="1", level=4, epoch=0, step=2),
    _span("all_reduce", "comm", 240, 30, level=4, epoch=0, step=2, group="g0", seq=1),
    _span("all_reduce.done", "comm", 260, 50, level=4, epoch=0, step=2, seq=2),
    _span("all_reduce", "comm", 320, 5, level=4, epoch=0, step=2, group="g0"),  # no seq: no collective
    _span("checkpoint", "checkpoint", 400, 300, level=2, incomplete=True),
    _span("tracer", "dftrace", 400, 300, level=2),  # the tracer's own: left out
    _span("uncategorised", None, 400, 300, level=2),  # no category: left out
    _span("copy", "device", 800, 20, tid=9, epoch=1, step=1),  # no level
    _span("copy", "device", 830, 20, tid=9, level=None, epoch=1, step=1),
    _span("deep", "compute", 900, 10, tid=11, level=3, epoch=1, step=1),  # its parent is elsewhere
    _span("instant", "compute", 950, None, ph='"i"', level=1),
    b'{"name":"counter","cat":"metric","pid":7,"tid":7,"ts":960,"ph":"C","args":{"value":3}}',
    _span("noise", "compute", 970, 5, ph='"X"', level=1, step=None, epoch=None),
    _span("save", "checkpoint", 1_000, 2_000, tid=12, level=1),  # one bucket of the sketch, two values
    _span("save", "checkpoint", 3_100, 2_010, tid=12, level=1),
    _span("reversed", "compute", 6_000, -5, tid=12, level=1),  # ends before it starts
]


def _pieces(path):
    (partition,) = plan_partitions([str(path)], 1 << 40)
    return list(iter_partition_pieces(partition, SUMMARY_COLUMNS, piece_bytes=PIECE_BYTES, scanned=True))


def _sorted(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort(frame.columns, nulls_last=True) if frame.height else frame


def _assert_same_partials(piece, *, overlap: bool, work_per_step: bool = False) -> bool:
    """Whether ``piece`` was reduced from its columns; either way, that its partial is
    the table path's."""
    scanned = scanned_path.aggregate_scanned(piece, piece.scanned, overlap, work_per_step)
    from_columns = scanned is not None
    if scanned is None:
        # the fallback, through the table
        scanned = _aggregate.aggregate(piece, overlap=overlap, work_per_step=work_per_step)
        assert piece.scanned is None
    else:
        piece.events, piece.scanned = piece.scanned.events(), None
    table = _aggregate.aggregate(piece, overlap=overlap, work_per_step=work_per_step)
    assert scanned.keys == table.keys
    for kind in (*PARTIAL_TABLES, "phases"):
        ours, theirs = getattr(scanned, kind), getattr(table, kind)
        assert ours.schema == theirs.schema, kind
        assert _sorted(ours).equals(_sorted(theirs)), kind
    return from_columns


@pytest.mark.parametrize("work_per_step", [False, True])
@pytest.mark.parametrize("overlap", [False, True])
def test_each_rule_reduces_as_the_table_path_does(tmp_path, overlap, work_per_step):
    path = tmp_path / "rules.pfw"
    path.write_bytes(b"[\n" + b"\n".join(_RULE_LINES) + b"\n]\n")
    (piece,) = _pieces(path)
    assert scanned_path.aggregate_scanned(piece, piece.scanned, overlap) is not None
    spans = piece.scanned.events().filter(pl.col("ph") == "X")
    # The file holds what the rules are about: two spellings of "forward", a phase as
    # DFTracer's integer, spans without a level.
    assert spans.filter(pl.col("name") == "forward").height == 3
    assert spans.get_column("level").null_count() == 2
    _assert_same_partials(piece, overlap=overlap, work_per_step=work_per_step)
    table = _aggregate.aggregate(piece)
    steps = table.steps.filter(pl.col("name") == "forward")
    assert sorted(steps.select("step", "n").rows()) == [(1, 2), (2, 1)]
    assert table.collectives.height == 2
    # An epoch span with no number keeps its place (minus its start) for its events to
    # number it, and so does one numbered by its count among spans numbered otherwise
    # (a loop after an integration's epochs: its count is no epoch number there).
    assert sorted(table.epoch_spans.get_column("epoch").to_list()) == [-8200, -10, 5]
    (save,) = table.durations.filter(pl.col("name") == "save").rows(named=True)
    assert (save["n"], save["lo"], save["hi"], save["m2"]) == (2, 2_000, 2_010, 50.0)


def _long_runs(directory, ranks: int = 2):
    """Ranks' files of a few MiB, uncompressed: read a MiB at a time, a piece each."""
    return [write_process(directory, training_process(1000 + rank, rank=rank, epochs=3, steps=500),
                          compression="none") for rank in range(ranks)]


@pytest.mark.parametrize("work_per_step", [False, True])
def test_realistic_runs_reduce_as_the_table_path_does_piece_by_piece(tmp_path, work_per_step):
    paths = _long_runs(tmp_path)
    reduced = [_assert_same_partials(piece, overlap=False, work_per_step=work_per_step)
               for path in paths for piece in _pieces(path) if piece.scanned is not None and piece.scanned.kept.any()]
    assert len(reduced) > 2 * len(paths) and all(reduced)  # several pieces a file, each reduced both ways


def test_spans_with_the_same_times_are_taken_in_the_tables_order(tmp_path, monkeypatch):
    # The collective run's ranks start and end several spans together: which is the
    # innermost is the table's sort's to say, and the columns' reduction asks it.
    paths = [write_process(tmp_path, proc, prefix="coll") for proc in collective_run(ranks=2)]
    asked = []
    original = scanned_path.tied_order
    monkeypatch.setattr(scanned_path, "tied_order", lambda *a: asked.append(1) or original(*a))
    reduced = [_assert_same_partials(piece, overlap=True) for path in paths for piece in _pieces(path)
               if piece.scanned is not None and piece.scanned.kept.any()]
    assert reduced and all(reduced) and asked


def test_a_piece_of_several_processes_goes_the_table_path(tmp_path):
    path = tmp_path / "two.pfw"
    lines = [_span("forward", "compute", 10, 5, pid=7, level=1, step=1),
             _span("forward", "compute", 20, 5, pid=8, level=1, step=1)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    (piece,) = _pieces(path)
    assert scanned_path.aggregate_scanned(piece, piece.scanned, True) is None
    partial = _aggregate.aggregate(piece)
    assert sorted(partial.keys) == [(7, ""), (8, "")]
    assert sorted(partial.steps.select("pid", "n").rows()) == [(7, 1), (8, 1)]


def test_the_summary_reduces_each_scanned_piece_from_its_columns(tmp_path, monkeypatch):
    paths = _long_runs(tmp_path)
    reduced = []
    original = scanned_path.aggregate_scanned

    def counted(data, piece, with_overlap, work_per_step):
        partial = original(data, piece, with_overlap, work_per_step)
        reduced.append(partial is not None and work_per_step)  # whole files: each step's work in one row
        return partial

    monkeypatch.setattr(_aggregate, "SUMMARY_PIECE_BYTES", PIECE_BYTES)
    monkeypatch.setattr(_aggregate, "aggregate_scanned", counted)
    partitions = plan_partitions([str(p) for p in paths], 1 << 40)
    partials = list(_aggregate.aggregate_partitions(partitions))
    assert len(reduced) > 2 * len(paths) and all(reduced)
    monkeypatch.setattr(_aggregate, "aggregate_scanned", lambda *args: None)
    tables = list(_aggregate.aggregate_partitions(partitions))
    for ours, theirs in zip(partials, tables):
        for kind in ("durations", "self_times", "extents", "collectives", "epochs"):
            assert _sorted(getattr(ours, kind)).equals(_sorted(getattr(theirs, kind))), kind
        assert _sorted(ours.modelled).equals(_sorted(theirs.modelled))
