"""The steps of a PyTorch loop traced by ``trace_dataloader`` and ``trace_compute`` (the
quick start), against the loop's own clock: each batch's wait in the step it feeds,
evaluations between steps, and forked workers that carry their parent's step."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import dftrace.torch as dft  # noqa: E402
from dftrace import ai, testing  # noqa: E402
from dftrace.analysis import summarize  # noqa: E402

from ._torch_helpers import Squares  # noqa: E402


class _SlowBatch(torch.utils.data.Dataset):
    """48 items in batches of 8; the items of batch 3 (the fourth) take 30 ms to load."""

    def __len__(self):
        return 48

    def __getitem__(self, i):
        if i == 3 * 8:
            import time

            time.sleep(0.03)
        return torch.randn(4), torch.randn(1)


def test_a_batch_slow_to_load_is_its_own_steps_wait(tmp_path):
    """``trace_dataloader`` + ``trace_compute`` (the quick start): the fetches carry no
    step, the compute spans the optimizer's count. Each fetch is the wait of the step
    it feeds: batch 3 slow to load makes step 3 the slowest, not step 2; each step is
    the loop's own from one fetch to the next."""
    import time

    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    starts = []
    with testing.trace_to(tmp_path / "trace") as result:
        loader = dft.trace_dataloader(DataLoader(_SlowBatch(), batch_size=8))
        with dft.trace_compute(model, opt):
            it = iter(loader)
            while True:
                starts.append(time.perf_counter_ns())
                try:
                    x, y = next(it)
                except StopIteration:
                    break
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
    summary = summarize(result.paths, index=False)
    mine = {s["step"]: s["max_us"] for s in summary.steps}
    truth = [(b - a) / 1e3 for a, b in zip(starts, starts[1:])]
    assert sorted(mine) == list(range(6))
    # Step 3 holds its batch's 30 ms wait, step 2 does not (a busy machine may make any
    # step slow: each is compared with the loop's own clock, not with the others).
    assert mine[3] > 30_000 and mine[3] == pytest.approx(truth[3], rel=0.05, abs=1000), (mine, truth)
    assert mine[2] == pytest.approx(truth[2], rel=0.05, abs=1000), (mine, truth)
    # Steps 0 to 4 end where the next fetch begins; the last ends with its own work.
    assert sum(mine[k] for k in range(5)) == pytest.approx(sum(truth[:5]), rel=0.02, abs=500), (mine, truth)


def test_an_evaluation_between_steps_makes_no_step(tmp_path):
    """The quick start with an evaluation every 2 steps (``model.eval()``, in
    ``pipeline.evaluate``): its forwards carry no step (they carried the next step's
    number, so that step began inside the evaluation, and the last one made a step of
    its own): 6 steps for 6 batches, none holding an evaluation's time."""
    import time

    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with testing.trace_to(tmp_path / "trace") as result:
        loader = dft.trace_dataloader(DataLoader(_SlowBatch(), batch_size=8))
        with dft.trace_compute(model, opt):
            for k, (x, y) in enumerate(loader):
                model.train()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                if k % 2 == 1:
                    with ai.pipeline.evaluate, torch.no_grad():
                        model.eval()
                        model(x)
                        time.sleep(0.05)
    evaluated = [e for e in result.spans("forward") if e["args"]["training"] is False]
    assert len(evaluated) == 3 and all("step" not in e["args"] for e in evaluated)
    summary = summarize(result.paths, index=False)
    assert [s["step"] for s in summary.steps] == list(range(6))
    assert all(s["max_us"] < 45_000 for s in summary.steps if s["step"] != 3), summary.steps


def test_workers_carrying_their_parents_step_are_not_ranks(tmp_path):
    """Forked DataLoader workers start with the step their parent had numbered: their
    item spans carry it. They are no ranks of their own: the steps are the main
    process's alone (they made extra rank-steps, a worker's the slowest step)."""
    with testing.trace_to(tmp_path / "trace"):
        loader = dft.trace_dataloader(DataLoader(Squares(16), batch_size=4, num_workers=2,
                                                 multiprocessing_context="fork"))
        for epoch in range(2):
            for k, _ in enumerate(loader):
                ai.update(epoch=epoch, step=epoch * 4 + k)
                with ai.compute.forward:
                    pass
    paths = testing.trace_files(tmp_path / "trace")  # the workers' files too
    items = [e for path in paths for e in testing.read_events(path) if e.get("name") == "item"]
    assert len(items) == 32 and len(paths) == 5
    assert [e for e in items if e["args"].get("step") is not None]  # the second epoch's workers
    summary = summarize(paths, index=False)
    assert summary.step_stats["count"] == len(summary.steps) == 8
    assert all("worker" not in s["slowest"] for s in summary.steps), summary.steps
