"""A traced DDP training job on a GPU: dftrace's traces and the PyTorch profiler's, side by side.

Each rank trains a small MLP on ``cuda:0`` under ``DistributedDataParallel`` (buckets of
``--bucket-mb``, so several gradient buckets), with ``trace_dataloader``,
``trace_compute``, ``trace_distributed`` and ``profile_steps``; the profiler's windows
are written beside each rank's dftrace file. The traces under ``tests/data/gpu-real``
come from this script on an NVIDIA H200::

    python bench/gpu_job.py --out traces/gloo --ranks 2 --backend gloo
    python bench/gpu_job.py --out traces/nccl --ranks 1 --backend nccl

``--schedule-cost`` instead times a training step without ``profile_steps`` and with it
between its windows, in interleaved blocks, and prints the medians as JSON.

Without a GPU it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

import dftrace
import dftrace.torch as dft
from dftrace import ai


def model_of(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


def rank_main(rank: int, opts: argparse.Namespace, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(opts.ranks), LOCAL_RANK=str(rank))
    dftrace.initialize(log_file=os.path.join(opts.out, "train"))
    dist.init_process_group(opts.backend, rank=rank, world_size=opts.ranks)
    device = torch.device(opts.device)
    torch.manual_seed(rank)
    data = TensorDataset(torch.randn(opts.batch * opts.steps, 256), torch.randint(0, 10, (opts.batch * opts.steps,)))
    loader = dft.trace_dataloader(DataLoader(data, batch_size=opts.batch, num_workers=2, pin_memory=True))
    model = DistributedDataParallel(model_of(opts.width).to(device),
                                    device_ids=[0] if device.type == "cuda" else None,
                                    bucket_cap_mb=opts.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with dft.trace_compute(model, opt), dft.trace_distributed(), \
            dft.profile_steps(opt, every=opts.every, active=opts.active) as prof:
        for epoch in ai.pipeline.epoch.iter(range(opts.epochs)):
            for step, (x, y) in enumerate(loader):
                ai.update(epoch=epoch, step=step)
                x, y = dft.to_device((x, y), device, non_blocking=True)
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if step % 4 == 3:
                    loss.item()  # the host waits for the GPU here
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
    dftrace.finalize()
    if rank == 0:
        print(json.dumps({"rank": rank, "profiler_files": prof.paths}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def schedule_cost(opts: argparse.Namespace) -> None:
    """Median step time without profile_steps and with it between windows, on the GPU."""
    device = torch.device("cuda", 0)
    model = model_of(opts.width).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(opts.batch, 256, device=device)
    y = torch.randint(0, 10, (opts.batch,), device=device)

    def steps(n: int) -> list[float]:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return times

    steps(200)  # warm-up: kernels chosen, caches filled
    plain: list[float] = []
    scheduled: list[float] = []
    for _ in range(opts.rounds):
        plain += steps(opts.block)
        with dft.profile_steps(opt, every=10**9, active=1, skip_first=10**9):
            scheduled += steps(opts.block)
    print(json.dumps({
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "steps_each": len(plain),
        "plain_median_us": round(statistics.median(plain) * 1e6, 1),
        "between_windows_median_us": round(statistics.median(scheduled) * 1e6, 1),
        "plain_min_us": round(min(plain) * 1e6, 1),
        "between_windows_min_us": round(min(scheduled) * 1e6, 1),
    }))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="traces/gpu")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16, help="steps per epoch")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--bucket-mb", type=float, default=1.0)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--active", type=int, default=2)
    parser.add_argument("--device", default="cuda:0", help="cpu: a dry run of the script")
    parser.add_argument("--schedule-cost", action="store_true")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=200)
    opts = parser.parse_args(argv)
    if opts.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_job: no CUDA device here", file=sys.stderr)
        return 2
    if opts.schedule_cost:
        schedule_cost(opts)
        return 0
    os.makedirs(opts.out, exist_ok=True)
    mp.spawn(rank_main, args=(opts, free_port()), nprocs=opts.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
