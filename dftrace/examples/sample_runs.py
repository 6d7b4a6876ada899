"""The sample runs the documentation reads: ``dftrace demo --write-samples [DIR]``.

``traces/`` is made on the spot: four ranks of the toy pipeline
(``dftrace.examples.toy_training``), each traced by ``dftrace run`` in a process of its
own. The others are recorded runs that come with the package (the ``sample_data``
folder beside this module), copied as they are; the paths in their ``PR`` records
(command line, executable, working directory) were replaced by neutral ones, nothing
else was changed:

- ``ddp-run/``: ``dftrace demo --ddp --epochs 2``, PyTorch DistributedDataParallel on
  two CPU ranks (gloo on loopback), rank 1 slow on purpose;
- ``ddp-buckets/``: a DDP job of 2 ranks whose gradients go in 2 buckets, 64 steps:
  in ``slow/`` rank 1 sleeps 25 ms in its collate function on every 4th step,
  ``control/`` has no slow rank;
- ``diff-runs/``: a traced loop of fixed CPU work (48 steps of about 21 ms):
  ``base/run0..2`` three runs of the same code, ``new/run0..2`` three runs with 10 % of
  a step added to every forward, ``same/`` one more run of the base code;
- ``gpu-job/``: PyTorch profiler traces of two generated GPU ranks (computation, NCCL
  and memory kernels on three streams, ``ProfilerStep#10..14``);
- ``gpu-h200/``: a two-rank DDP job on an NVIDIA H200: each rank's dftrace file, its
  DataLoader workers' files and three profiler windows (``profile_steps``);
- ``dftracer-*/``: files written by DFTracer 1.0.5 (an excerpt), 2.0.3 (a run and an
  excerpt of a fork's file) and 2.2.0 (with and without metadata).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["SAMPLES", "write_samples"]

DATA = Path(__file__).resolve().parent / "sample_data"

#: What ``write_samples`` writes: name (a directory, or a group of them) -> what it holds.
SAMPLES = {
    "traces/": "4 ranks of the toy training pipeline, traced now (dftrace run -m dftrace.examples.toy_training)",
    "ddp-run/": "2 DistributedDataParallel ranks on CPU, rank 1 slow on purpose (dftrace demo --ddp)",
    "ddp-buckets/": "a DDP job with 2 gradient buckets: slow/ (rank 1 late in 16 of 64 steps), control/",
    "diff-runs/": "a loop of fixed work: base/run0..2, new/run0..2 (a slower forward), same/",
    "gpu-job/": "PyTorch profiler traces of 2 GPU ranks",
    "gpu-h200/": "a 2-rank DDP job on an H200: dftrace traces and 3 profiler windows per rank",
    "dftracer-*/": "files written by DFTracer 1.0.5, 2.0.3 and 2.2.0",
}

#: The toy run in ``traces/``: what the pages' outputs were made from.
TOY_RANKS = 4
TOY_ARGS = ("--epochs", "2", "--samples", "160")


def _targets(directory: Path) -> list[Path]:
    """Every top-level path ``write_samples`` creates in ``directory``."""
    return [directory / "traces", *(directory / p.name for p in sorted(DATA.iterdir()) if p.is_dir())]


def write_samples(directory: str | os.PathLike[str] = ".") -> list[Path]:
    """Write the sample runs into ``directory`` (created if needed) and return the
    top-level directories written.

    Raises ``FileExistsError`` naming the first of them that is already there, before
    anything is written: samples never mix with a run of the reader's own.
    """
    where = Path(directory)
    targets = _targets(where)
    for target in targets:
        if os.path.lexists(target):
            raise FileExistsError(f"{target} already exists")
    where.mkdir(parents=True, exist_ok=True)
    for source in sorted(DATA.iterdir()):
        if source.is_dir():
            shutil.copytree(source, where / source.name)
    _trace_toy_run(where / "traces")
    return targets


def _trace_toy_run(traces: Path) -> None:
    """Four ranks of the toy pipeline, one after the other, with only the options given
    here (no DFTRACE_* variable of the caller's), so the run is the pages' run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    for rank in range(TOY_RANKS):
        env["RANK"] = str(rank)
        done = subprocess.run(
            [sys.executable, "-m", "dftrace", "run", "--log-file", str(traces / "train"),
             "-m", "dftrace.examples.toy_training", *TOY_ARGS],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the toy run of rank {rank} failed (exit {done.returncode}):\n{done.stdout}")
