"""One rank of the real DistributedDataParallel runs in test_torch_ddp (spawned)."""

from __future__ import annotations

import json
import os
from collections import Counter

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import dftrace
import dftrace.torch as dft
from dftrace import ai
from dftrace.examples.ddp_training import SlowForward


def run(rank: int, world: int, init_file: str, out: str, epochs: int, steps: int, slow_rank: int,
        slow_s: float) -> None:
    """Train with DDP, trace_ddp and trace_distributed; write how many torch.distributed
    calls this rank made (DDP's buckets counted by the hook) to calls-<rank>.json."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    dftrace.initialize(log_file=os.path.join(out, "ddp"))
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    calls: Counter[str] = Counter()

    def counting_hook(state, bucket):  # type: ignore[no-untyped-def]
        calls["all_reduce"] += 1
        return default_hooks.allreduce_hook(state, bucket)

    try:
        torch.manual_seed(0)
        x = torch.randn(steps * 8 * world, 8)
        data = TensorDataset(x, x.sum(1, keepdim=True))
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
        loader = dft.trace_dataloader(DataLoader(data, batch_size=8, sampler=sampler))
        model = SlowForward(nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1)),
                            slow_s if rank == slow_rank else 0.0)
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.001)  # two buckets
        dft.trace_ddp(ddp, hook=counting_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        with dft.trace_distributed(), dft.trace_compute(ddp, opt), ai.pipeline.train:
            for epoch in ai.pipeline.epoch.iter(range(epochs)):
                for step, (xb, yb) in enumerate(loader):
                    ai.update(epoch=epoch, step=step)
                    loss = nn.functional.mse_loss(ddp(xb), yb)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    dist.all_reduce(loss.detach().clone())
                    calls["all_reduce"] += 1
                with ai.pipeline.evaluate, torch.no_grad():
                    for xb, _ in loader:
                        ddp(xb)
                dist.barrier()
                calls["barrier"] += 1
    finally:
        dist.destroy_process_group()
        dftrace.finalize()
    with open(os.path.join(out, f"calls-{rank}.json"), "w") as fh:
        json.dump(calls, fh)
