"""Picklable pieces for the PyTorch tests: datasets that spawned DataLoader workers
can import, and the body of each rank of the torch.distributed test."""

from __future__ import annotations

import os

import torch
from torch.utils.data import Dataset, IterableDataset


class Squares(Dataset):
    """Item ``i`` is ``(tensor([i, i*i]), i)``: easy to check, cheap to make."""

    def __init__(self, n: int = 12):
        self.n = n
        self.label = "squares"

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.tensor([float(i), float(i * i)]), i


class Counting(IterableDataset):
    """Yields 0..n-1 as tensors."""

    def __init__(self, n: int = 6):
        self.n = n

    def __iter__(self):
        return (torch.tensor([float(i)]) for i in range(self.n))


def distributed_rank(rank: int, world: int, init_method: str, log_dir: str) -> None:
    """One rank: trace collectives, point-to-point and a DDP backward over gloo."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import dftrace
    import dftrace.torch as dft

    dftrace.initialize(log_file=os.path.join(log_dir, "trace"), compression="none",
                       rank=rank, inherit=False)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        with dft.trace_distributed():
            t = torch.full((4,), float(rank + 1))
            dist.all_reduce(t)
            assert t.tolist() == [3.0] * 4
            dist.broadcast(t, src=0)
            out = [torch.zeros(4) for _ in range(world)]
            dist.all_gather(out, torch.full((4,), float(rank)))
            dist.reduce(torch.ones(2, dtype=torch.float64), dst=0, op=dist.ReduceOp.MAX)
            dist.barrier()
            work = dist.all_reduce(torch.ones(8), async_op=True)
            work.wait()
            if rank == 0:
                dist.send(torch.arange(3.0), dst=1)
                dist.isend(torch.arange(5.0), dst=1).wait()
            else:
                dist.recv(torch.zeros(3), src=0)
                dist.irecv(torch.zeros(5), src=0).wait()
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Linear(4, 1))
        dft.trace_ddp(model)
        with dft.trace_compute(model):
            model(torch.randn(2, 4)).sum().backward()
    finally:
        dist.destroy_process_group()
        dftrace.finalize()


def run_two_rank_job(job: str, out, truth, *args: str) -> dict[int, dict]:
    """Run ``python JOB OUT TRUTH *ARGS`` (a 2-rank job that starts its other rank
    itself) with no launcher or dftrace variables inherited, once more if gloo aborted
    a rank at start-up (a loaded loopback now and then does); each rank's
    ``truth-<rank>.json``, by rank."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DFTRACE_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))}
    for attempt in range(2):
        for d in (out, truth):
            d.mkdir(exist_ok=True)
            for f in d.iterdir():
                if f.is_file():
                    f.unlink()
        done = subprocess.run([sys.executable, job, str(out), str(truth), *args], env=env,
                              capture_output=True, text=True, timeout=300)
        if done.returncode == 0 or attempt:
            break
    assert done.returncode == 0, done.stderr[-3000:]
    return {f["rank"]: f for f in (json.loads((truth / f"truth-{r}.json").read_text()) for r in (0, 1))}
