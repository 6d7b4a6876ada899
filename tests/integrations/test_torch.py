"""dftrace.torch with real PyTorch: DataLoader workers, compute hooks, per-module
spans, torch.distributed over gloo, device transfer and checkpoints."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import dftrace.torch as dft  # noqa: E402
from dftrace import ai, testing  # noqa: E402
from dftrace.format import validate_file  # noqa: E402

from ._torch_helpers import Counting, Squares  # noqa: E402


def assert_valid(paths):
    for p in paths:
        assert validate_file(p) == [], p


def by_id(events):
    return {e["id"]: e for e in events if e.get("ph") == "X"}


def parent(events, span):
    return by_id(events).get(span["args"]["p_idx"])


def encloses(outer, inner):
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def files_by_pid(directory):
    out = {}
    for p in testing.trace_files(directory):
        events = testing.read_events(p)
        out[events[0]["pid"]] = (p, events)
    return out


def train_steps(model, opt, loader, epochs=1):
    for _ in ai.pipeline.epoch.iter(range(epochs)):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()


# ---------------------------------------------------------------------------
# DataLoader
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_dataloader_workers_write_items_and_collate(tmp_path, context):
    """With 2 workers (fork/spawn/forkserver) the main file has fetch spans per batch
    and each worker's own file has its data.item and preprocess.collate spans."""
    loader = DataLoader(Squares(12), batch_size=4, num_workers=2, multiprocessing_context=context)
    with testing.trace_to(tmp_path, inherit=True) as result:
        batches = [x for x, _ in dft.trace_dataloader(loader)]
    assert len(batches) == 3
    main_pid = result.events[0]["pid"]
    assert [e["args"]["count"] for e in result.spans("fetch.iter")] == [1, 2, 3]
    assert [e["args"]["count"] for e in result.spans("fetch.block")] == [1, 2, 3]
    assert len(result.spans("fetch.init")) == 1
    files = files_by_pid(tmp_path)
    workers = {pid: ev for pid, (_, ev) in files.items() if pid != main_pid}
    assert len(workers) == 2
    items = [e for ev in workers.values() for e in testing.spans(ev, "item", "data")]
    assert sorted(e["args"]["index"] for e in items) == list(range(12))
    collates = [e for ev in workers.values() for e in testing.spans(ev, "preprocess.collate", "data")]
    assert [e["args"]["items"] for e in collates] == [4, 4, 4]
    assert_valid(p for p, _ in files.values())


def test_spawned_workers_trace_without_the_environment(tmp_path, monkeypatch):
    """A spawned worker traces with the parent's settings even when they were not exported."""
    monkeypatch.delenv("DFTRACE_ENABLE", raising=False)
    loader = DataLoader(Squares(8), batch_size=4, num_workers=1, multiprocessing_context="spawn")
    with testing.trace_to(tmp_path, inherit=False):
        assert "DFTRACE_ENABLE" not in os.environ
        list(dft.trace_dataloader(loader))
    files = testing.trace_files(tmp_path)
    assert len(files) == 2
    items = [e for f in files for e in testing.spans(testing.read_events(f), "item")]
    assert len(items) == 8
    assert_valid(files)


def test_in_process_items_nest_in_fetch_iter(tmp_path):
    """Without workers, items and collation are children of the fetch.iter that waited for them."""
    with testing.trace_to(tmp_path) as result:
        for _ in dft.trace_dataloader(DataLoader(Squares(4), batch_size=2)):
            pass
    iters = {e["id"]: e for e in result.spans("fetch.iter")}
    for e in result.spans("item") + result.spans("preprocess.collate"):
        assert e["args"]["p_idx"] in iters
        assert encloses(iters[e["args"]["p_idx"]], e)
    assert len(result.spans("item")) == 4
    assert_valid(result.paths)


def test_iterable_dataset_items(tmp_path):
    """Items of an IterableDataset are data.item spans with a count; the exhausting call is flagged."""
    loader = DataLoader(Counting(6), batch_size=3)
    with testing.trace_to(tmp_path) as result:
        batches = list(dft.trace_dataloader(loader))
    assert [b.shape[0] for b in batches] == [3, 3]
    items = result.spans("item", "data")
    assert [e["args"]["count"] for e in items] == list(range(1, 8))
    assert [e["args"].get("exhausted", False) for e in items] == [False] * 6 + [True]
    assert_valid(result.paths)


def test_traced_loader_behaves_like_the_loader():
    """The traced loader keeps len() and attributes; the dataset wrapper forwards them."""
    ds = Squares(10)
    traced = dft.trace_dataloader(DataLoader(ds, batch_size=4))
    assert len(traced) == 3
    assert traced.batch_size == 4
    assert traced.dataset.label == "squares"
    assert traced.dataset.dataset is ds
    assert len(traced.dataset) == 10
    assert dft.trace_dataloader(traced) is traced


def test_dataset_error_reaches_the_user_and_is_recorded(tmp_path):
    """An exception in __getitem__ propagates unchanged; its item span records the error."""

    class Broken(Squares):
        def __getitem__(self, i):
            raise KeyError(i)

    with testing.trace_to(tmp_path) as result:
        with pytest.raises(KeyError):
            list(dft.trace_dataloader(DataLoader(Broken(2), batch_size=2)))
    [item] = result.spans("item")
    assert item["args"]["error"] == "KeyError"
    assert_valid(result.paths)


# ---------------------------------------------------------------------------
# Compute
# ---------------------------------------------------------------------------

def _model_and_data():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))
    data = [(torch.randn(4, 2), torch.randn(4, 1)) for _ in range(3)]
    return model, torch.optim.SGD(model.parameters(), lr=0.1), data


def test_compute_spans_nest_in_the_loop_with_step_args(tmp_path):
    """forward/backward/step spans appear per iteration inside the fetch.block, with step = optimizer steps so far."""
    model, opt, data = _model_and_data()
    with testing.trace_to(tmp_path) as result:
        with dft.trace_compute(model, opt):
            train_steps(model, opt, ai.dataloader.fetch.iter(data))
    for name in ("forward", "backward", "step"):
        spans = result.spans(name, "compute")
        assert [e["args"]["step"] for e in spans] == [0, 1, 2], name
        for e in spans:
            assert parent(result.events, e)["name"] == "fetch.block"
    assert result.spans("step")[0]["args"]["optimizer"] == "SGD"
    assert all(e["args"]["training"] is True for e in result.spans("forward"))
    # forward, then backward, then step inside each iteration
    for block in result.spans("fetch.block"):
        inside = sorted((e for e in result.spans(cat="compute") if e["args"]["p_idx"] == block["id"]),
                        key=lambda e: e["ts"])
        assert [e["name"] for e in inside] == ["forward", "backward", "step"]
    assert_valid(result.paths)


def test_compute_tracing_removes_every_hook():
    """Leaving trace_compute removes the module and optimizer hooks and restores torch.autograd.backward."""
    model, opt, _ = _model_and_data()
    original = torch.autograd.backward
    with dft.trace_compute(model, opt):
        assert torch.autograd.backward is not original
        assert model._forward_hooks and opt._optimizer_step_pre_hooks
    assert torch.autograd.backward is original
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks


def test_forward_error_propagates_and_closes_the_span(tmp_path):
    """A forward that raises closes its compute.forward span with args.error; the error reaches the caller."""

    class Fails(nn.Module):
        def forward(self, x):
            raise ValueError("bad input")

    model = Fails()
    with testing.trace_to(tmp_path) as result:
        with dft.trace_compute(model):
            with pytest.raises(ValueError, match="bad input"):
                model(torch.zeros(1))
            with ai.pipeline.test:  # recorded after the failure
                pass
    [fwd] = result.spans("forward")
    assert fwd["args"]["error"] == "ValueError"
    assert fwd["ts"] + fwd["dur"] <= result.spans("test")[0]["ts"]
    assert_valid(result.paths)


def test_failed_optimizer_step_is_closed_at_the_next_step(tmp_path):
    """A step() that raised is written as incomplete when the next step begins."""
    model, opt, _ = _model_and_data()
    state = {"fail": True}

    def fail_once(optimizer, args, kwargs):
        if state["fail"]:
            state["fail"] = False
            raise RuntimeError("step failed")

    with testing.trace_to(tmp_path) as result:
        with dft.trace_compute(model, opt):
            opt.register_step_pre_hook(fail_once)  # runs after trace_compute's hook
            model(torch.randn(1, 2)).sum().backward()
            with pytest.raises(RuntimeError, match="step failed"):
                opt.step()
            opt.step()
    steps = result.spans("step", "compute")
    assert len(steps) == 2
    assert steps[0]["args"]["incomplete"] is True
    assert "incomplete" not in steps[1]["args"]
    assert_valid(result.paths)


def test_backward_outside_tracing_is_not_recorded(tmp_path):
    """After trace_compute ends, backward() calls write nothing."""
    model, opt, _ = _model_and_data()
    with testing.trace_to(tmp_path) as result:
        with dft.trace_compute(model, opt):
            model(torch.randn(1, 2)).sum().backward()
        model(torch.randn(1, 2)).sum().backward()
    assert len(result.spans("backward")) == 1


# ---------------------------------------------------------------------------
# Per-module view
# ---------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x))


def _nested_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), Block(), nn.Linear(8, 2))


def test_module_spans_named_by_path_with_shapes(tmp_path):
    """Each submodule call is a forward.<path> span inside its parent module's span, with input/output shapes."""
    model = _nested_model()
    with testing.trace_to(tmp_path) as result:
        with dft.trace_modules(model) as tm:
            model(torch.randn(3, 4))
    assert tm.paths == ["0", "1", "1.fc", "1.act", "2"]
    spans = {e["name"]: e for e in result.spans(cat="compute")}
    assert set(spans) == {"forward.0", "forward.1", "forward.1.fc", "forward.1.act", "forward.2"}
    fc = spans["forward.1.fc"]
    assert fc["args"]["module"] == "1.fc" and fc["args"]["type"] == "Linear"
    assert fc["args"]["input_shapes"] == [[3, 8]] and fc["args"]["output_shapes"] == [[3, 8]]
    assert spans["forward.2"]["args"]["output_shapes"] == [[3, 2]]
    assert parent(result.events, fc)["name"] == "forward.1"
    assert parent(result.events, spans["forward.1"]) is None
    assert_valid(result.paths)


def test_module_selection(tmp_path):
    """include/exclude patterns, classes and max_depth choose the hooked submodules."""
    model = _nested_model()
    with dft.trace_modules(model, max_depth=1) as tm:
        assert tm.paths == ["0", "1", "2"]
    with dft.trace_modules(model, include=[nn.Linear]) as tm:
        assert tm.paths == ["0", "1.fc", "2"]
    with dft.trace_modules(model, include=["1*"], exclude=["*.act"]) as tm:
        assert tm.paths == ["1", "1.fc"]
    with pytest.raises(ValueError, match="max_depth"):
        dft.trace_modules(model, max_depth=0)
    with pytest.raises(TypeError, match="include"):
        dft.trace_modules(model, include=[3])
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_module_hooks_removed_after_an_exception(tmp_path):
    """Leaving trace_modules by an exception removes every hook and closes the open spans."""
    model = _nested_model()
    with testing.trace_to(tmp_path) as result:
        with pytest.raises(RuntimeError):
            with dft.trace_modules(model, backward=True):
                model(torch.randn(3, 5))  # wrong width: Linear(4, 8) raises
    for m in model.modules():
        assert not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)
    [first] = result.spans("forward.0")
    assert first["args"]["error"] == "RuntimeError"
    assert_valid(result.paths)


@pytest.mark.parametrize("shapes", [True, False])
def test_a_model_copied_or_saved_while_traced_is_its_own(tmp_path, shapes):
    """A copy made inside trace_modules (an EMA model, a best model kept by
    ``copy.deepcopy``) runs its own weights, during the block and after it, and is
    not traced; ``torch.save(model)`` meanwhile saves a model that loads and runs as
    the original does. The copy ran the original's weights, and the save raised."""
    import copy
    import io

    model = _nested_model()
    x = torch.randn(3, 4)
    with testing.trace_to(tmp_path) as result:
        with dft.trace_modules(model, shapes=shapes):
            ema = copy.deepcopy(model)
            with torch.no_grad():
                for p in ema.parameters():
                    p.zero_()
            assert torch.equal(ema(x), torch.zeros(3, 2))
            saved = io.BytesIO()
            torch.save(model, saved)
            expected = model(x)
        assert torch.equal(ema(x), torch.zeros(3, 2))
    saved.seek(0)
    loaded = torch.load(saved, weights_only=False)
    assert torch.equal(loaded(x), expected)
    assert len(result.spans("forward.1.fc")) == 1  # the original's call only
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_module_tracing_keeps_no_tensor_alive():
    """After a traced forward, input and output tensors die with their last user reference."""
    model = _nested_model()
    with dft.trace_modules(model, backward=True):
        x = torch.randn(3, 4, requires_grad=True)
        y = model(x)
        y.sum().backward()
        refs = [weakref.ref(x), weakref.ref(y)]
        del x, y
        gc.collect()
        assert [r() for r in refs] == [None, None]


def test_module_backward_spans(tmp_path):
    """backward=True adds backward.<path> spans, nested the way gradients flow."""
    model = _nested_model()
    with testing.trace_to(tmp_path) as result:
        with dft.trace_modules(model, backward=True):
            model(torch.randn(3, 4, requires_grad=True)).sum().backward()
    names = [e["name"] for e in result.spans(cat="compute") if e["name"].startswith("backward.")]
    assert sorted(names) == sorted(["backward.0", "backward.1", "backward.1.fc", "backward.1.act", "backward.2"])
    fc = result.spans("backward.1.fc")[0]
    assert parent(result.events, fc)["name"] == "backward.1"
    assert_valid(result.paths)


def test_hook_failure_never_reaches_the_model(tmp_path, monkeypatch):
    """An error inside a dftrace hook is swallowed with one warning; the forward result is unchanged."""
    model = _nested_model()
    x = torch.randn(2, 4)
    expected = model(x)

    def broken(*a, **k):
        raise RuntimeError("shape helper broke")

    monkeypatch.setattr(dft._modules, "shapes", broken)  # the output shapes of a module's forward
    with testing.trace_to(tmp_path):
        with dft.trace_modules(model), pytest.warns(RuntimeWarning, match="shape helper broke"):
            out = model(x)
    assert torch.equal(out, expected)


# ---------------------------------------------------------------------------
# Device and checkpoint
# ---------------------------------------------------------------------------

def test_to_device_records_bytes(tmp_path):
    """to_device moves nested tensors inside a device.transfer span with their total bytes."""
    batch = {"x": torch.zeros(4, 3), "y": [torch.zeros(4, dtype=torch.int64)]}
    with testing.trace_to(tmp_path) as result:
        moved = dft.to_device(batch, "cpu")
    assert moved["x"].shape == (4, 3) and moved["y"][0].dtype == torch.int64
    [span] = result.spans("transfer", "device")
    assert span["args"]["bytes"] == 4 * 3 * 4 + 4 * 8
    assert span["args"]["device"] == "cpu"


def test_checkpoint_save_and_load(tmp_path):
    """save/load write checkpoint.capture/restart with the path and the file's size."""
    model = _nested_model()
    path = tmp_path / "ckpt.pt"
    with testing.trace_to(tmp_path / "trace") as result:
        dft.save(model.state_dict(), path)
        state = dft.load(path)
    model.load_state_dict(state)
    [cap] = result.spans("capture", "checkpoint")
    [rst] = result.spans("restart", "checkpoint")
    size = path.stat().st_size
    assert cap["args"]["path"] == str(path) and cap["args"]["bytes"] == size
    assert rst["args"]["path"] == str(path) and rst["args"]["bytes"] == size


# ---------------------------------------------------------------------------
# torch.distributed
# ---------------------------------------------------------------------------

def test_distributed_collectives_over_gloo(tmp_path):
    """Two gloo ranks write comm spans with bytes, op, group size, async flag and peers."""
    import torch.multiprocessing as mp

    from ._torch_helpers import distributed_rank

    # A file rendezvous: no port to pick, so no race with other processes for one.
    rendezvous = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(distributed_rank, args=(2, rendezvous, str(tmp_path)), nprocs=2, join=True)
    files = testing.trace_files(tmp_path)
    assert len(files) == 2
    assert_valid(files)
    for f in files:
        rank = int(f.split("-rank")[1].split("-")[0])
        events = testing.read_events(f)
        comm = testing.spans(events, cat="comm")
        calls = [e for e in comm if not e["args"].get("ddp") and "." not in e["name"]]
        assert [e["name"] for e in calls] == [
            "all_reduce", "bcast", "all_gather", "reduce", "barrier", "all_reduce",
            "send" if rank == 0 else "receive", "send" if rank == 0 else "receive"]
        assert all(e["args"]["group_size"] == 2 for e in comm if "." not in e["name"])
        first = calls[0]["args"]
        assert (first["bytes"], first["op"], first["async"]) == (16, "SUM", False)
        assert calls[1]["args"]["src"] == 0
        assert calls[3]["args"]["op"] == "MAX" and calls[3]["args"]["dst"] == 0
        assert calls[3]["args"]["bytes"] == 16
        assert calls[5]["args"]["async"] is True and calls[5]["args"]["bytes"] == 32
        assert calls[6]["args"]["bytes"] == 12 and calls[6]["args"]["async"] is False
        assert calls[7]["args"]["bytes"] == 20 and calls[7]["args"]["async"] is True
        assert calls[6]["args"].get("dst" if rank == 0 else "src") == (1 if rank == 0 else 0)
        # Matching across ranks: group and a per-group sequence number (p2p: per pair)
        seqs = [e["args"]["seq"] for e in calls[:6]]
        assert all(e["args"]["group"] == "0" for e in calls) and seqs == sorted(set(seqs))
        assert [e["args"]["seq"] for e in calls[6:]] == [1, 2]
        # the async all-reduce's completion, with the call's sequence number
        done = [e for e in comm if e["name"] == "all_reduce.done"]
        assert calls[5]["args"]["seq"] in {e["args"]["seq"] for e in done}
        ddp = [e for e in comm if e["args"].get("ddp")]
        assert ddp and ddp[0]["args"]["bytes"] == 5 * 4 and ddp[0]["args"]["async"] is True
        backward = testing.spans(events, "backward", "compute")
        assert len(backward) == 1 and encloses(backward[0], ddp[0])


def test_distributed_tracing_restores_functions():
    """Leaving trace_distributed puts the original torch.distributed functions back."""
    import torch.distributed as dist

    original = dist.all_reduce
    with dft.trace_distributed() as tracing:
        assert dist.all_reduce is not original
        assert "all_reduce" in tracing.functions
    assert dist.all_reduce is original


# ---------------------------------------------------------------------------
# The combined example
# ---------------------------------------------------------------------------

def test_combined_example_shows_every_category(tmp_path):
    """python -m dftrace.examples.torch_training writes every category and leaf of the tree, in valid files."""
    out = tmp_path / "example"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "dftrace.examples.torch_training", "--epochs", "1",
         "--samples", "128", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = testing.trace_files(out)
    # the main process and 2 workers for each of 2 loaders; a worker that got no
    # batch records nothing and leaves no file
    assert 4 <= len(files) <= 5
    assert_valid(files)
    seen = Counter()
    for f in files:
        for e in testing.spans(testing.read_events(f)):
            seen[(e["cat"], e["name"])] += 1
    expected = {
        ("compute", "forward"), ("compute", "backward"), ("compute", "step"),
        ("data", "item"), ("data", "preprocess"), ("data", "preprocess.collate"),
        ("dataloader", "fetch.iter"), ("dataloader", "fetch.block"),
        ("comm", "all_reduce"), ("device", "transfer"),
        ("checkpoint", "capture"), ("checkpoint", "restart"),
        ("pipeline", "train"), ("pipeline", "epoch.iter"), ("pipeline", "epoch.block"),
        ("pipeline", "evaluate"), ("pipeline", "test"),
    }
    assert expected <= set(seen), expected - set(seen)
    assert "trace written to" in proc.stdout


def test_work_still_in_flight_at_the_end_is_written_incomplete(tmp_path):
    """Asynchronous work whose future completes just after the session's end began is
    written whole; one that never completes is written ending then, incomplete (it
    was lost before when its completion came after the end)."""
    import threading
    import time

    from dftrace._core import engine
    from dftrace.torch._in_flight import record_completion

    late, never = torch.futures.Future(), torch.futures.Future()
    with testing.trace_to(tmp_path) as t:
        t0 = engine.clock()
        record_completion(ai.comm.all_reduce, late, t0, {"seq": 1, "bucket": 0})
        record_completion(ai.comm.all_reduce, never, t0, {"seq": 2, "bucket": 1})
        threading.Timer(0.1, late.set_result, (None,)).start()  # completes during the end's wait
        time.sleep(0.01)
    done = {e["args"]["seq"]: e for e in t.spans("all_reduce.done")}
    assert sorted(done) == [1, 2]
    assert "incomplete" not in done[1]["args"] and done[1]["dur"] >= 100_000 - 1000
    assert done[2]["args"]["incomplete"] is True and done[2]["dur"] >= done[1]["dur"]
