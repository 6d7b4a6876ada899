"""A toy training pipeline annotated with every category of the ``ai`` tree.

No framework needed: a dataset of random vectors, a thread-pool "DataLoader", a
linear model trained with plain Python arithmetic, a simulated all-reduce and a
checkpoint written with ``pickle``. Run it with ``dftrace demo`` or
``dftrace run -m dftrace.examples.toy_training``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from dftrace import ai


class ToyDataset:
    """Random (x, y) pairs with y = w·x + noise."""

    @ai.data.item.init
    def __init__(self, n: int = 256, dim: int = 16, seed: int = 0):
        rng = random.Random(seed)
        self.w = [rng.uniform(-1, 1) for _ in range(dim)]
        self.rows = [[rng.uniform(-1, 1) for _ in range(dim)] for _ in range(n)]

    def __len__(self) -> int:
        return len(self.rows)

    @ai.data.item
    def __getitem__(self, i: int) -> tuple[list[float], float]:
        x = self.rows[i]
        with ai.data.preprocess:
            x = [v * 0.5 for v in x]  # "normalise"
        y = sum(a * b for a, b in zip(x, self.w))
        return x, y


collate = ai.data.preprocess.derive(name="collate")


@collate
def collate_batch(items: list[tuple[list[float], float]]) -> tuple[list[list[float]], list[float]]:
    return [x for x, _ in items], [y for _, y in items]


class ToyLoader:
    """Batches fetched by a pool of worker threads, like a DataLoader with workers."""

    def __init__(self, ds: ToyDataset, batch_size: int, workers: int = 2):
        self.ds, self.batch_size, self.workers = ds, batch_size, workers

    def __iter__(self):
        idx = list(range(len(self.ds)))
        random.Random(1).shuffle(idx)
        chunks = [idx[i:i + self.batch_size] for i in range(0, len(idx), self.batch_size)]
        with ThreadPoolExecutor(self.workers, thread_name_prefix="loader") as pool:
            for items in pool.map(lambda c: [self.ds[i] for i in c], chunks):
                yield collate_batch(items)


@ai.device.transfer
def to_device(batch):
    time.sleep(0.0002)  # pretend to copy to an accelerator
    return batch


@ai.compute.forward
def forward(w, xs):
    return [sum(a * b for a, b in zip(x, w)) for x in xs]


@ai.compute.backward
def backward(w, xs, ys, preds):
    n = len(xs)
    grad = [0.0] * len(w)
    for x, y, p in zip(xs, ys, preds):
        err = p - y
        for j, v in enumerate(x):
            grad[j] += 2 * err * v / n
    with ai.comm.all_reduce(args={"bytes": 8 * len(grad)}):
        time.sleep(0.0003)  # a simulated gradient all-reduce
    return grad


@ai.compute.step
def step(w, grad, lr):
    return [a - lr * g for a, g in zip(w, grad)]


@ai.pipeline.evaluate
def evaluate(w, loader):
    total, n = 0.0, 0
    for xs, ys in ai.dataloader.fetch.iter(loader):
        preds = forward(w, xs)
        total += sum((p - y) ** 2 for p, y in zip(preds, ys))
        n += len(ys)
    return total / max(n, 1)


@ai.checkpoint.capture
def save_checkpoint(w, path):
    with open(path, "wb") as f:
        pickle.dump(w, f)


@ai.pipeline.train
def train(epochs: int = 3, batch_size: int = 32, n: int = 256, lr: float = 0.5,
          checkpoint_dir: str | None = None) -> list[float]:
    """Train, evaluate, checkpoint (into ``checkpoint_dir``, by default a temporary
    directory removed afterwards) and restart; returns the weights."""
    if checkpoint_dir is None:
        with tempfile.TemporaryDirectory(prefix="dftrace-demo-") as tmp:
            return _train(epochs, batch_size, n, lr, tmp)
    return _train(epochs, batch_size, n, lr, checkpoint_dir)


def _train(epochs: int, batch_size: int, n: int, lr: float, ckpt_dir: str) -> list[float]:
    ds = ToyDataset(n=n)
    loader = ToyLoader(ds, batch_size)
    w = [0.0] * len(ds.w)
    loss = float("nan")
    for epoch in ai.pipeline.epoch.iter(range(epochs)):
        ai.update(epoch=epoch)
        for step_i, (xs, ys) in ai.dataloader.fetch.iter(enumerate(loader)):
            ai.compute.update(step=step_i)
            xs, ys = to_device((xs, ys))
            preds = forward(w, xs)
            grad = backward(w, xs, ys, preds)
            w = step(w, grad, lr)
        loss = evaluate(w, loader)
        save_checkpoint(w, os.path.join(ckpt_dir, f"epoch{epoch}.pkl"))
    with ai.checkpoint.restart:
        with open(os.path.join(ckpt_dir, f"epoch{epochs - 1}.pkl"), "rb") as f:
            w = pickle.load(f)
    with ai.pipeline.test:
        forward(w, [ds[0][0]])
    print(f"final loss {loss:.6f}")
    return w


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    a = p.parse_args(argv)
    train(epochs=a.epochs, batch_size=a.batch_size, n=a.samples)


if __name__ == "__main__":
    main()
