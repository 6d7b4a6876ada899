"""A PyTorch DataLoader workload for the reliability tests (run as a script).

The dataset lives in this importable module so that ``spawn`` and ``forkserver``
workers can unpickle it; run as ``python _dl_workload.py METHOD OUT_DIR N [init]`` (``init``: pass
``worker_init_fn=WorkerInit(...)``).
"""

from __future__ import annotations

import sys

import torch
from torch.utils.data import DataLoader, Dataset

import dftrace
from dftrace import ai
from dftrace.torch._workers import WorkerInit


class Squares(Dataset):
    """Item ``i`` is a tensor holding ``i * i``."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    @ai.data.item
    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i * i])


def seed_worker(worker_id: int) -> None:
    """A user's own worker_init_fn, which WorkerInit must still call."""
    torch.manual_seed(worker_id)


def main(method: str, out: str, n: int, init: bool) -> None:
    # A long flush interval: workers' events reach disk only when they end. The folder
    # named with a trailing separator, as its workers must be given it.
    dftrace.initialize(log_file=f"{out}/", compression="zstd", flush_interval=60)
    loader = DataLoader(Squares(n), batch_size=4, num_workers=2,
                        multiprocessing_context=method,
                        worker_init_fn=WorkerInit(seed_worker) if init else None)
    total = 0
    for batch in ai.dataloader.fetch.iter(loader):
        total += int(batch.sum())
    assert total == sum(i * i for i in range(n)), total
    print("batches", (n + 3) // 4, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:] == ["init"])
