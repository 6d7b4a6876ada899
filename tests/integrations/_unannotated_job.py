"""PyTorch programs with no dftrace in them, or with some: what ``dftrace run`` and
``DFTRACE_ENABLE=1`` are tested on.

``python _unannotated_job.py MODE TRUTH.json``:

- ``plain``: a DataLoader with 2 workers, a model, an optimizer, 2 epochs, then an
  evaluation forward under ``torch.no_grad()``; no import of dftrace;
- ``annotated``: the same loop annotated by hand (``fetch.iter``, a decorated
  forward, ``with ai.compute.backward``, ``update``);
- ``accumulate``: ``plain`` with two micro-batches per optimizer step;
- ``idle``: no PyTorch work at all.

Writes what the loop counted on its own clock to TRUTH.json: steps, epochs, the
time spent waiting in ``next()`` on the loader, each step's start.
"""

from __future__ import annotations

import json
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

    class Data(Dataset):
        def __len__(self) -> int:
            return BATCHES * 8

        def __getitem__(self, i: int):
            time.sleep(0.002)
            return torch.randn(16), torch.randn(1)

    torch.manual_seed(0)
    truth = {"fetch_ns": 0, "steps": 0, "epochs": 0, "forwards": 0, "starts_ns": []}
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Data(), batch_size=8, num_workers=2)
    every = 2 if mode == "accumulate" else 1

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
        for epoch in range(EPOCHS):
            it = iter(loader)
            k = 0
            while True:
                t0 = time.perf_counter_ns()
                try:
                    x, y = next(it)
                except StopIteration:
                    break
                truth["fetch_ns"] += time.perf_counter_ns() - t0
                if k % every == 0:
                    truth["starts_ns"].append(t0)
                loss = nn.functional.mse_loss(model(x), y)
                truth["forwards"] += 1
                loss.backward()
                if k % every == every - 1:
                    opt.step()
                    opt.zero_grad()
                    truth["steps"] += 1
                k += 1
            truth["epochs"] += 1
    with torch.no_grad():  # an evaluation: no step's
        model(torch.randn(4, 16))
    with open(truth_path, "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
