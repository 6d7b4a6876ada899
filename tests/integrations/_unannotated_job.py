"""PyTorch programs with no dftrace in them, or with some: what ``dftrace run`` and
``DFTRACE_ENABLE=1`` are tested on.

``python _unannotated_job.py MODE TRUTH.json``:

- ``plain``: a DataLoader with 2 workers, a model, an optimizer, 2 epochs, then an
  evaluation forward under ``torch.no_grad()``; no import of dftrace;
- ``annotated``: the same loop annotated by hand (``fetch.iter``, a decorated
  forward, ``with ai.compute.backward``, ``update``);
- ``accumulate``: ``plain`` with two micro-batches per optimizer step;
- ``accumulate_across``: ``plain`` with three: the last two micro-batches of an
  epoch are stepped in the next one, and the last two of the run never are;
- ``fresh``: ``plain`` with a DataLoader made anew for each epoch, and after each
  epoch an evaluation loader iterated under ``torch.no_grad()``;
- ``gan_tensors``: ``gan`` with no DataLoader (tensors made in the loop), 12
  iterations, then 6 steps of a third optimizer alone (a new phase);
- ``break``: ``plain`` leaving each epoch's loop after 4 of its 8 batches;
- ``peek``: ``plain`` after a look at one batch (``next(iter(loader))``) and 0.3 s
  of setting up before training;
- ``valmid``: ``plain`` with an evaluation loader iterated under ``torch.no_grad()``
  in the middle of each epoch, after its fourth step;
- ``valbreak``: ``valmid`` whose evaluation leaves its loop after two batches (a
  limit on validation batches);
- ``valtensors``: ``valmid`` whose evaluation iterates no loader: four forwards in
  ``eval()`` mode over tensors at hand, 5 ms apart;
- ``gan``: ``plain`` with two models each stepped by its own optimizer per batch (a
  discriminator's step, then a generator's);
- ``tail``: ``plain`` with 5 ms of work the tracer does not see (a logging call)
  after each optimizer step, the epoch's last step's included;
- ``cycle``: ``plain`` with the batches drawn through ``itertools.cycle(loader)``
  for two and a half passes: after the loader's one pass, no batch is fetched;
- ``cycleval``: ``cycle`` with a pass of an evaluation loader under
  ``torch.no_grad()`` after every fifth step;
- ``preval``: ``plain`` after a pass of an evaluation loader (a baseline's);
- ``compiled``: ``torch.compile(model)`` before the first step, trained four steps,
  then called once more with a global forward hook of the program's own: the
  warnings torch gave about global hooks, in each part;
- ``killed``: ``plain`` killed by SIGTERM in the sixth step's backward;
- ``idle``: no PyTorch work at all;
- ``edges``: what a program does with a model once its calls are recorded (after
  the first optimizer steps): a deep copy called, pickling and ``torch.save``,
  ``torch.compile(fullgraph=True)``, ``torch.jit.script``, ``torch.fx``, its
  ``forward``'s signature, a model called inside another one, a forward and an
  optimizer step that raise;
- ``lightning``: a Lightning ``Trainer.fit`` with no callback of dftrace's given (it
  gets one), then a plain loop over the same model.

Writes what the loop counted on its own clock to TRUTH.json: steps, epochs, the
time spent waiting in ``next()`` on the loader, each step's start, each epoch's time
from ``iter(loader)`` to the end of its iteration (its workers started and shut down),
and when the ``next()`` that found each epoch's pass over was called.
"""

from __future__ import annotations

import json
import os
import sys
import time

BATCHES, EPOCHS = 8, 2


def main(mode: str, truth_path: str) -> None:
    if mode == "idle":
        json.dump({"steps": 0}, open(truth_path, "w"))
        return
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    if mode == "edges":
        return edges(truth_path)
    if mode == "lightning":
        return lightning(truth_path)

    class Data(Dataset):
        def __len__(self) -> int:
            return BATCHES * 8

        def __getitem__(self, i: int):
            time.sleep(0.002)
            return torch.randn(16), torch.randn(1)

    torch.manual_seed(0)
    truth = {"fetch_ns": 0, "steps": 0, "epochs": 0, "forwards": 0, "starts_ns": [], "epochs_ns": []}
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = nn.Linear(16, 16)
    opt_g = torch.optim.SGD(generator.parameters(), lr=0.01)
    loader = DataLoader(Data(), batch_size=8, num_workers=2)
    every = {"accumulate": 2, "accumulate_across": 3}.get(mode, 1)
    if mode == "gan_tensors":
        return gan_tensors(model, opt, truth, truth_path)
    if mode == "killed":
        return killed(model, opt, loader, truth, truth_path)

    if mode == "compiled":
        import warnings

        compiled = torch.compile(model, backend="eager")
        said = {"training": 0, "own_hook": 0}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for k, (x, y) in enumerate(loader):
                if k == 4:
                    break
                loss = nn.functional.mse_loss(compiled(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                truth["steps"] += 1
            said["training"] = sum("global hooks" in str(w.message) for w in caught)
            handle = nn.modules.module.register_module_forward_hook(lambda module, args, out: None)
            compiled(x)
            handle.remove()
            said["own_hook"] = sum("global hooks" in str(w.message) for w in caught) - said["training"]
        with open(truth_path, "w") as f:
            json.dump({**truth, "warned": said}, f)
        return

    if mode in ("cycle", "cycleval"):
        import itertools

        batches = itertools.cycle(loader)
        for k in range(BATCHES * 5 // 2):
            if mode == "cycleval" and k and k % 5 == 0:
                evaluate_pass(model, DataLoader(Data(), batch_size=16), truth)
            truth["starts_ns"].append(time.perf_counter_ns())
            x, y = next(batches)
            loss = nn.functional.mse_loss(model(x), y)
            truth["forwards"] += 1
            opt.zero_grad()
            loss.backward()
            opt.step()
            truth["steps"] += 1
        with open(truth_path, "w") as f:
            json.dump(truth, f)
        return

    if mode == "annotated":
        from dftrace import ai

        @ai.compute.forward
        def forward(x):
            return model(x)

        for epoch in range(EPOCHS):
            for k, (x, y) in enumerate(ai.dataloader.fetch.iter(loader)):
                ai.update(epoch=epoch, step=truth["steps"])
                truth["starts_ns"].append(time.perf_counter_ns())
                loss = nn.functional.mse_loss(forward(x), y)
                truth["forwards"] += 1
                opt.zero_grad()
                with ai.compute.backward:
                    loss.backward()
                opt.step()
                truth["steps"] += 1
            truth["epochs"] += 1
    else:
        if mode == "peek":  # a look at a batch's shape, then setting up
            x, _ = next(iter(loader))
            time.sleep(0.3)
        if mode == "preval":  # a baseline's evaluation
            evaluate_pass(model, DataLoader(Data(), batch_size=16), truth)
        for epoch in range(EPOCHS):
            if mode == "fresh":
                loader = DataLoader(Data(), batch_size=8, num_workers=2)
            began = time.perf_counter_ns()
            it = iter(loader)
            k = 0
            while True:
                if mode == "break" and k == 4:  # out of the loop early: its iterator let go
                    it = None
                    truth["epochs_ns"].append(time.perf_counter_ns() - began)
                    break
                t0 = time.perf_counter_ns()
                try:
                    x, y = next(it)
                except StopIteration:
                    truth["epochs_ns"].append(time.perf_counter_ns() - began)
                    truth.setdefault("pass_ends_ns", []).append(t0)
                    break
                truth["fetch_ns"] += time.perf_counter_ns() - t0
                if k % every == 0:  # an epoch's first step waits for its loader to start, too
                    truth["starts_ns"].append(began if k == 0 else t0)
                if mode == "criterion":  # a loss module, called outermost as the model is
                    loss = nn.MSELoss()(model(x), y)
                else:
                    loss = nn.functional.mse_loss(model(x), y)
                truth["forwards"] += 1
                loss.backward()
                if k % every == every - 1:
                    opt.step()
                    opt.zero_grad()
                    truth["steps"] += 1
                    if mode == "tail":
                        time.sleep(0.005)
                if mode in ("valmid", "valbreak") and k == 3:  # an evaluation inside the epoch
                    evaluation = DataLoader(Data(), batch_size=32 if mode == "valmid" else 8)
                    began = time.perf_counter_ns()  # its pass: from its iterator's making
                    with torch.no_grad():
                        for i, (x, _) in enumerate(evaluation):
                            model(x)
                            if mode == "valbreak" and i == 1:
                                break
                    truth.setdefault("evaluations_ns", []).append((began, time.perf_counter_ns()))
                if mode == "valtensors" and k == 3:
                    evaluate_over(model, x, truth)
                if mode == "gan":  # the generator's turn, in the same step
                    fake = model(generator(x))
                    truth["forwards"] += 2
                    (-fake.mean()).backward()
                    opt_g.step()
                    opt_g.zero_grad()
                k += 1
            if mode == "valend":  # an evaluation over tensors at hand after the epoch's last step
                evaluate_over(model, x, truth)
            truth["epochs"] += 1
            if mode == "fresh":
                with torch.no_grad():
                    for x, _ in DataLoader(Data(), batch_size=32):
                        model(x)
    with torch.no_grad():  # an evaluation: no step's
        model(torch.randn(4, 16))
    with open(truth_path, "w") as f:
        json.dump(truth, f)


def evaluate_pass(model, loader, truth) -> None:
    """A pass of an evaluation loader under ``torch.no_grad()``, timed into
    ``truth["evaluations_ns"]``."""
    import torch

    began = time.perf_counter_ns()
    with torch.no_grad():
        for x, _ in loader:
            model(x)
    truth.setdefault("evaluations_ns", []).append((began, time.perf_counter_ns()))


def evaluate_over(model, x, truth) -> None:
    """An evaluation over tensors at hand: four forwards of ``x`` in ``eval()`` mode with
    no gradient, 5 ms apart, timed into ``truth["evaluations_ns"]``."""
    import torch

    model.eval()
    with torch.no_grad():
        began = time.perf_counter_ns()
        for i in range(4):
            if i:
                time.sleep(0.005)
            model(x)
        truth.setdefault("evaluations_ns", []).append((began, time.perf_counter_ns()))
    model.train()


def killed(model, opt, loader, truth, truth_path) -> None:
    """SIGTERM in the sixth step's backward: the truth written first, then the signal
    ends the process there."""
    import signal

    import torch
    from torch import nn

    class Stop(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            if truth["steps"] == 5:
                truth["killed_ns"] = time.perf_counter_ns()
                with open(truth_path, "w") as f:
                    json.dump(truth, f)
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)  # the signal's handler ends the process here
            return grad

    for x, y in loader:
        loss = nn.functional.mse_loss(Stop.apply(model(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        truth["steps"] += 1


def gan_tensors(model, opt, truth, truth_path) -> None:
    """A discriminator's and a generator's optimizer step per iteration, no DataLoader;
    then another optimizer alone. Each iteration's start on the loop's clock."""
    import torch
    from torch import nn

    generator = nn.Linear(16, 16)
    opt_g = torch.optim.SGD(generator.parameters(), lr=0.01)
    for _ in range(12):
        truth["starts_ns"].append(time.perf_counter_ns())
        x = torch.randn(8, 16)
        nn.functional.mse_loss(model(x), torch.ones(8, 1)).backward()
        opt.step()
        opt.zero_grad()
        (-model(generator(x)).mean()).backward()
        opt_g.step()
        opt_g.zero_grad()
        truth["steps"] += 1
    tuned = torch.optim.SGD(model.parameters(), lr=0.001)  # a new phase: another optimizer alone
    for _ in range(6):
        truth["starts_ns"].append(time.perf_counter_ns())
        nn.functional.mse_loss(model(torch.randn(8, 16)), torch.ones(8, 1)).backward()
        tuned.step()
        tuned.zero_grad()
        truth["steps"] += 1
    with open(truth_path, "w") as f:
        json.dump(truth, f)


def _edge_models():
    """The models of ``edges``, defined at the module's level (pickled by name)."""
    global Net, Outer
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 1))
            self.fail = False

        def forward(self, x):
            if self.fail:
                raise ValueError("planted")
            return self.body(x)

    class Outer(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x, scale=2.0, *, shift=0.0):
            return self.inner(x) * scale + shift

    return Net, Outer


def edges(truth_path: str) -> None:
    import copy
    import inspect
    import io
    import pickle

    import torch

    Net, Outer = _edge_models()

    torch.manual_seed(0)
    model = Net()
    outer = Outer(model)
    signature = [str(inspect.signature(m.forward)) for m in (model, outer)]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    truth = {"forwards": 0, "outer": 0, "steps": 0, "errors": 0}

    def step(net) -> None:
        loss = net(torch.randn(4, 16)).pow(2).mean()
        truth["forwards" if net is model else "outer"] += 1
        loss.backward()
        opt.step()
        opt.zero_grad()
        truth["steps"] += 1

    for k in range(6):  # both models are called at the top while the roots are found
        step(model if k % 2 else outer)
    ema = copy.deepcopy(model)  # a copy is not one of the models found
    for _ in range(3):
        ema(torch.randn(4, 16))
    again = pickle.loads(pickle.dumps(model))
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    # what reads forward() reads what it would untraced: compiled, scripted, fx-traced
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    scripted = torch.jit.script(model)
    graphed = torch.fx.symbolic_trace(model)
    truth["forwards"] += 1  # fx traces the graph by calling forward() once
    copies = (again, loaded, ema, compiled, scripted, graphed)
    same = [bool(torch.allclose(m(torch.ones(1, 16)), model(torch.ones(1, 16)))) for m in copies]
    truth["forwards"] += len(copies)  # model's own calls just above (those of the copies are not)
    for _ in range(4):
        step(outer)  # model inside outer: one forward, outer's
    model.fail = True
    try:
        model(torch.randn(4, 16))
    except ValueError:
        truth["errors"] += 1
        truth["forwards"] += 1
    model.fail = False

    def closure():
        raise RuntimeError("planted")

    try:
        opt.step(closure)
    except RuntimeError:
        truth["errors"] += 1
    # the loop goes on (the failed step's span ends at the next batch)
    from torch.utils.data import DataLoader, TensorDataset

    for (x,) in DataLoader(TensorDataset(torch.randn(8, 16)), batch_size=4):
        loss = model(x).pow(2).mean()
        truth["forwards"] += 1
        loss.backward()
        opt.step()
        opt.zero_grad()
        truth["steps"] += 1
    truth.update(same=same, signature=signature, signature_after=[str(inspect.signature(m.forward)) for m in (model, outer)])
    with open(truth_path, "w") as f:
        json.dump(truth, f)


def lightning(truth_path: str) -> None:
    import lightning.pytorch as pl
    import torch
    from torch import nn
    from torch.nn.modules import module as torch_module
    from torch.utils.data import DataLoader, TensorDataset

    truth = {"batches": 0, "global_hooks_in_fit": [], "loop_steps": 0}

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            truth["batches"] += 1
            # the search for the roots is paused: each layer keeps PyTorch's fast path
            truth["global_hooks_in_fit"].append(len(torch_module._global_forward_hooks))
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 3, generator=g), torch.randn(32, 1, generator=g))
    model = Regressor()
    pl.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
               enable_checkpointing=False, default_root_dir=os.path.dirname(truth_path)).fit(
        model, DataLoader(data, batch_size=8))
    truth["callbacks"] = sorted({type(c).__module__ for c in pl.Trainer().callbacks} & {"dftrace.lightning"})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # then a loop of your own: recorded again
    for x, y in DataLoader(data, batch_size=8):
        loss = nn.functional.mse_loss(model.net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        truth["loop_steps"] += 1
    with open(truth_path, "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
