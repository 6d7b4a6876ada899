"""The summary decodes a file's next piece while it reduces the one in hand: two
pieces at most, in order, errors raised at the piece they stood for, nothing left
running when the reader stops early."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis.read.decode import read_ahead  # noqa: E402

WAIT_S = 30  # a bound for a broken implementation, never reached by a working one


class _Source:
    """Pieces 0..n-1, counting those decoded and not yet let go by the reader."""

    def __init__(self, n: int, fail_at: int | None = None):
        self.n, self.fail_at = n, fail_at
        self.held = self.most_held = 0
        self.started: list[threading.Event] = [threading.Event() for _ in range(n)]
        self.threads: set[str] = set()
        self.closed = False
        self.lock = threading.Lock()

    def pieces(self):
        try:
            for i in range(self.n):
                self.started[i].set()
                self.threads.add(threading.current_thread().name)
                if i == self.fail_at:
                    raise ValueError(f"piece {i} is broken")
                with self.lock:
                    self.held += 1
                    self.most_held = max(self.most_held, self.held)
                yield i
        finally:
            self.closed = True

    def let_go(self) -> None:
        with self.lock:
            self.held -= 1


def test_pieces_come_in_order_with_the_next_decoded_meanwhile_and_two_held_at_most():
    source = _Source(6)
    got = []
    for piece in read_ahead(source.pieces()):
        if piece + 1 < source.n:
            # The next piece is being decoded while this one is in hand.
            assert source.started[piece + 1].wait(WAIT_S)
        if piece + 2 < source.n:
            assert not source.started[piece + 2].is_set()
        got.append(piece)
        source.let_go()
    assert got == list(range(6))
    assert source.most_held == 2 and source.closed
    assert source.threads == {"dftrace-read-ahead"}
    assert not [t for t in threading.enumerate() if t.name == "dftrace-read-ahead"]


def test_an_error_is_raised_at_the_piece_it_stood_for():
    source = _Source(5, fail_at=2)
    got = []
    with pytest.raises(ValueError, match="piece 2 is broken"):
        for piece in read_ahead(source.pieces()):
            got.append(piece)
    assert got == [0, 1] and source.closed


def test_stopping_early_closes_the_source_and_leaves_no_thread():
    source = _Source(10)
    reader = read_ahead(source.pieces())
    assert next(reader) == 0
    assert source.started[1].wait(WAIT_S)
    reader.close()
    assert source.closed
    assert not source.started[2].is_set()
    assert not [t for t in threading.enumerate() if t.name == "dftrace-read-ahead"]


def test_an_empty_source_gives_nothing():
    source = _Source(0)
    assert list(read_ahead(source.pieces())) == [] and source.closed


def test_partitions_overlap_the_next_ones_first_piece_decoded_and_pieces_reduced(monkeypatch):
    """aggregate_partitions reads ahead across partitions: once a partition's last
    piece is in hand, the next partition's first piece is decoded, and the partition
    is finished (folded, its steps modelled) on a thread of its own while the next
    one's pieces are reduced; each partition gets its own pieces, in order."""
    from dftrace.analysis.reduce import aggregate as _aggregate
    from dftrace.analysis.read.sources import Partition

    partitions = [Partition(f"file{k}") for k in range(3)]
    started = {p.path: threading.Event() for p in partitions}
    reduced = {p.path: threading.Event() for p in partitions}
    pieces_of = {"file0": 3, "file1": 1, "file2": 2}
    finishers = set()

    def pieces(partition, *args, **kwargs):
        started[partition.path].set()
        for i in range(pieces_of[partition.path]):
            yield (partition.path, i)

    def following(path):
        k = [p.path for p in partitions].index(path) + 1
        return partitions[k].path if k < len(partitions) else None

    def pieces_folded(pieces, *, work_per_step):
        got = list(pieces)
        path = got[0][0]
        if following(path):  # its pieces are all in hand: the next partition's are under way
            assert started[following(path)].wait(WAIT_S)
        reduced[path].set()
        return got

    def finished(partition, stack, model):
        finishers.add(threading.current_thread().name)
        if following(partition.path):  # the next partition's pieces are reduced meanwhile
            assert reduced[following(partition.path)].wait(WAIT_S)
        return partition.path, stack

    monkeypatch.setattr(_aggregate, "iter_partition_pieces", pieces)
    monkeypatch.setattr(_aggregate, "_pieces_folded", pieces_folded)
    monkeypatch.setattr(_aggregate, "_finished", finished)
    assert list(_aggregate.aggregate_partitions(partitions)) == [
        (p.path, [(p.path, i) for i in range(pieces_of[p.path])]) for p in partitions]
    assert len(finishers) == 1 and threading.current_thread().name not in finishers


@pytest.mark.parametrize("threads", [1, 3])
def test_map_stream_takes_items_one_after_another_and_keeps_their_order(threads):
    """Each thread runs the function over the items it takes, as it asks for them;
    the results come back in the order of the items."""
    from dftrace.analysis.runtime.executor import EmbeddedExecutor

    asked_ahead = []

    def doubled(items):
        items = iter(items)
        for item in items:
            asked_ahead.append(item)
            yield item * 2

    items = list(range(20))
    assert EmbeddedExecutor(threads).map_stream(doubled, items) == [i * 2 for i in items]
    assert sorted(asked_ahead) == items


@pytest.mark.parametrize("threads", [1, 3])
def test_map_stream_raises_the_error_of_an_item(threads):
    """An error on one item reaches the caller of map_stream, whichever thread met it."""
    from dftrace.analysis.runtime.executor import EmbeddedExecutor

    def checked(items):
        for item in items:
            if item == 7:
                raise ValueError("item 7 is broken")
            yield item

    with pytest.raises(ValueError, match="item 7 is broken"):
        EmbeddedExecutor(threads).map_stream(checked, list(range(12)))


#: Events of the trace read in pieces: about 3 MiB of lines.
EVENTS = 30_000


def _threads_of_pieces(monkeypatch, read) -> list[tuple[int, int]]:
    """(inflating thread, decoding thread) of each piece ``read()`` goes through."""
    from dftrace.analysis.read import decode as _decode

    inflated: list[int] = []
    decoded: list[int] = []
    line_pieces = _decode.fmt.iter_line_pieces

    def inflating(*args, **kwargs):
        for piece in line_pieces(*args, **kwargs):
            inflated.append(threading.get_ident())
            yield piece

    class Decoded(_decode.PartitionData):  # made on the thread that decodes a piece
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            decoded.append(threading.get_ident())

    monkeypatch.setattr(_decode.fmt, "iter_line_pieces", inflating)
    monkeypatch.setattr(_decode, "PartitionData", Decoded)
    read()
    assert len(inflated) == len(decoded)
    return list(zip(inflated, decoded))


def test_the_summary_inflates_each_piece_on_the_thread_that_decodes_it(tmp_path, monkeypatch):
    """The summary decodes a piece ahead on a thread of its own, and inflates it there
    too (a thread more inflating further ahead only held a piece more); a reader that
    reduces each piece where it asks for it has the next one inflated meanwhile. Both
    read the same events."""
    import polars as pl

    from dftrace.analysis.reduce import aggregate as _aggregate
    from dftrace.analysis.read.decode import iter_partition_pieces
    from dftrace.analysis.read.sources import Partition

    path = tmp_path / "rank0.pfw"  # read a MiB at a time: a piece at least each
    lines = [f'{{"id":{i},"name":"forward","cat":"compute","pid":7,"tid":7,"ts":{10 * i},"dur":5,'
             f'"ph":"X","args":{{"step":{i}}}}}' for i in range(EVENTS)]
    path.write_text("[\n" + "\n".join(lines) + "\n]\n")
    piece_bytes = 64 << 10
    partition = Partition(str(path))

    pieces: list = []
    ahead = _threads_of_pieces(monkeypatch, lambda: pieces.extend(
        iter_partition_pieces(partition, ["name", "ts", "dur", "step"], piece_bytes=piece_bytes)))
    assert len(ahead) > 3 and all(inflating != decoding for inflating, decoding in ahead)
    events = pl.concat([piece.events for piece in pieces])
    assert events.get_column("ts").to_list() == [10 * i for i in range(EVENTS)]

    monkeypatch.setattr(_aggregate, "SUMMARY_PIECE_BYTES", piece_bytes)
    partials: list = []
    summary = _threads_of_pieces(monkeypatch, lambda: partials.extend(
        _aggregate.aggregate_partitions([partition])))
    assert len(summary) == len(ahead)
    assert all(inflating == decoding != threading.get_ident() for inflating, decoding in summary)
    (partial,) = partials
    assert partial.extents.get_column("n").to_list() == [EVENTS]
