"""Sample mode: trace_in_memory(max_items=N) pushes a handful of items through a pipeline."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch", reason="sample mode is tested on torch DataLoaders: pip install 'dftrace[torch]'")

from torch.utils.data import DataLoader, Dataset  # noqa: E402

import dftrace  # noqa: E402
from dftrace import ai, testing  # noqa: E402
from dftrace._core import tree as _tree
from dftrace._inspect.values import content_hash  # noqa: E402


def test_every_iter_inside_stops_after_max_items():
    """Each .iter() called inside the block yields at most max_items items."""
    seen = []
    with dftrace.trace_in_memory(max_items=3) as t:
        for epoch in ai.pipeline.epoch.iter(range(10)):
            for batch in ai.dataloader.fetch.iter(range(100)):
                seen.append((epoch, batch))
    assert seen == [(e, b) for e in range(3) for b in range(3)]
    assert len(t.dataloader.fetch.iter) == 9 and t.max_items == 3


def test_shorter_iterables_are_not_padded():
    """An iterable shorter than max_items runs to its end."""
    with dftrace.trace_in_memory(max_items=5):
        assert list(ai.dataloader.fetch.iter("ab")) == ["a", "b"]


def test_sampling_ends_with_the_in_memory_trace():
    """After the block, .iter() yields every item again."""
    with dftrace.trace_in_memory(max_items=1):
        pass
    assert list(ai.dataloader.fetch.iter(range(4))) == [0, 1, 2, 3]
    assert _tree._max_items is None


def test_sampling_ends_even_when_the_block_raises():
    """A failing sampled block does not leave sampling switched on."""
    with pytest.raises(ZeroDivisionError):
        with dftrace.trace_in_memory(max_items=1):
            1 / 0
    assert list(ai.dataloader.fetch.iter(range(3))) == [0, 1, 2]


def test_a_plain_in_memory_trace_does_not_sample():
    """Without max_items, .iter() inside an in-memory trace yields everything."""
    with dftrace.trace_in_memory():
        assert len(list(ai.dataloader.fetch.iter(range(50)))) == 50


def test_inner_sampling_trace_wins_and_outer_limit_returns():
    """Nested in-memory traces: the inner limit applies inside it, the outer one after it."""
    with dftrace.trace_in_memory(max_items=4):
        with dftrace.trace_in_memory(max_items=2):
            inner = list(ai.dataloader.fetch.iter(range(10)))
        outer = list(ai.dataloader.fetch.iter(range(10)))
    assert (len(inner), len(outer)) == (2, 4)


def test_sampling_applies_to_disabled_nodes_too():
    """A disabled node's .iter() is still cut to max_items (the pipeline is sampled,
    not just its trace)."""
    ai.dataloader.disable()
    with dftrace.trace_in_memory(max_items=2) as t:
        items = list(ai.dataloader.fetch.iter(range(10)))
    assert items == [0, 1] and len(t) == 0


def test_aiter_is_sampled_as_well():
    """async for over .aiter() stops after max_items items."""
    async def source():
        for i in range(10):
            yield i

    async def main():
        return [x async for x in ai.dataloader.fetch.aiter(source())]

    with dftrace.trace_in_memory(max_items=3) as t:
        got = asyncio.run(main())
    assert got == [0, 1, 2]
    assert [c.args["count"] for c in t.dataloader.fetch.iter] == [1, 2, 3]


class Squares(Dataset):
    """Item i is (a 3-vector filled with i, i*i)."""

    def __len__(self):
        return 1000

    @ai.data.item(capture=True, capture_result=True)
    def __getitem__(self, index):
        return torch.full((3,), float(index)), index * index


class TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 1)

    @ai.compute.forward(capture=["batch"], capture_result=True, capture_hash=True)
    def forward(self, batch):
        return self.linear(batch)


def test_torch_dataloader_pipeline_in_sample_mode():
    """A Dataset/DataLoader/model pipeline traced in memory with max_items=2 runs two
    batches and records what went through every stage."""
    torch.manual_seed(0)
    model = TinyModel()
    loader = DataLoader(Squares(), batch_size=4, shuffle=False)
    batches = 0
    with dftrace.trace_in_memory(max_items=2) as t:
        for x, y in ai.dataloader.fetch(capture_result=True).iter(loader):
            model(x)
            batches += 1
    assert batches == 2
    # the dataset stage: 8 items, each index in, (tensor, square) out
    assert [c.params.index for c in t.data.item] == list(range(8))
    item = t.data.item[5]
    assert item.result[0].shape == [3] and item.result[0].dtype == "float32"
    assert item.result[1] == 25
    # the loader stage: the collated batch, and the items fetched while getting it
    fetched = t.dataloader.fetch.iter[1]
    assert fetched.result[0].shape == [4, 3] and fetched.result[1].dtype == "int64"
    assert [c.params.index for c in fetched.children] == [4, 5, 6, 7]
    # the model stage: nested in the loop body, with input and output shapes
    fwd = t.compute.forward[0]
    assert fwd.parent is t.dataloader.fetch.block[0]
    assert fwd.params.batch.shape == [4, 3] and fwd.result.shape == [4, 1]
    assert fwd.params.batch.hash == content_hash(torch.stack(
        [torch.full((3,), float(i)) for i in range(4)]))
    assert fwd.result.requires_grad is True


def test_torch_pipeline_helpers_assert_on_captured_shapes():
    """The testing helpers check the same pipeline from its events."""
    model = TinyModel()
    loader = DataLoader(Squares(), batch_size=2)
    with testing.trace_to_memory(max_items=3) as result:
        for x, _ in ai.dataloader.fetch.iter(loader):
            model(x)
    testing.assert_span(result, "forward", count=3, args={"params.batch.shape": [2, 3]})
    testing.assert_span(result, "item", count=6)
    testing.assert_nested(result, "fetch.iter", "item")
    testing.assert_nested(result, "fetch.block", "forward")
