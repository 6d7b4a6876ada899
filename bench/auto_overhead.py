"""The cost per training step of tracing a PyTorch loop with no annotations
(``auto=True``, what ``dftrace run`` does) beside the same loop annotated by hand
and the loop untraced, each in a process of its own (automatic tracing changes
torch for the whole process).

    python bench/auto_overhead.py [--steps N] [--rounds R]

Each variant runs R rounds of N steps of a small model (DataLoader over tensors in
memory, forward, backward, optimizer step) and reports the fastest round's time per
step; the overhead is that minus the untraced loop's."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

VARIANTS = ("untraced", "hand", "auto")


def _loop(variant: str, steps: int, rounds: int, out: str) -> list[float]:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    if variant != "untraced":
        import dftrace

        dftrace.initialize(log_file=os.path.join(out, variant), auto=variant == "auto")
    from dftrace import ai

    data = TensorDataset(torch.randn(steps * 8, 32), torch.randn(steps * 8, 1))
    loader = DataLoader(data, batch_size=8)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    @ai.compute.forward
    def forward(x):
        return model(x)

    per_step = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        if variant == "hand":
            for k, (x, y) in enumerate(ai.dataloader.fetch.iter(loader)):
                ai.update(step=k)
                loss = nn.functional.mse_loss(forward(x), y)
                opt.zero_grad()
                with ai.compute.backward:
                    loss.backward()
                with ai.compute.step:
                    opt.step()
        else:
            for x, y in loader:
                loss = nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        per_step.append((time.perf_counter() - t0) / steps * 1e6)
    return per_step


def measure(steps: int = 2000, rounds: int = 7) -> dict[str, float]:
    """Fastest round's µs per step of each variant, each in a fresh process."""
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for variant in VARIANTS:
            env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
            done = subprocess.run([sys.executable, __file__, "--child", variant, "--steps", str(steps),
                                   "--rounds", str(rounds), "--out", d],
                                  env=env, capture_output=True, text=True, check=True)
            out[variant] = min(json.loads(done.stdout.splitlines()[-1]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--child", choices=VARIANTS)
    p.add_argument("--out")
    ns = p.parse_args()
    if ns.child:
        print(json.dumps(_loop(ns.child, ns.steps, ns.rounds, ns.out)))
        return
    figures = measure(ns.steps, ns.rounds)
    base = figures["untraced"]
    for variant, us in figures.items():
        print(f"{variant:<9} {us:8.1f} us/step   overhead {us - base:+7.1f} us")


if __name__ == "__main__":
    main()
