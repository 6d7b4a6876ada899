"""Writing PyTorch profiler (Kineto) traces with GPU activity, deterministically, for the tests.

One JSON document per rank, laid out as ``torch.profiler`` writes it (pretty-printed
object; ``schemaVersion``, ``deviceProperties``, ``distributedInfo``,
``baseTimeNanoseconds``, ``traceEvents``; ``ts`` in µs relative to the base, with
nanosecond fractions). Each step is a ``ProfilerStep#N`` span on the main thread
in which CPU ops launch kernels through ``cudaLaunchKernel``/``cudaMemcpyAsync``
calls carrying a ``correlation`` id: computation kernels on the compute stream,
NCCL kernels on a communication stream (overlapping the next computation), memory
copies and sets on a copy stream; a kernel starts after its launch plus a queue
delay and after the previous kernel on its stream. Some steps end with a
``cudaDeviceSynchronize``.
"""

from __future__ import annotations

import gzip
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

BASE_NS = 1_790_857_026_000_000_000
#: ts of the first event (µs after the base), as recent profilers write them.
START_US = 4_710_705_334_895.068
COMPUTE_STREAM, COMM_STREAM, COPY_STREAM = 7, 20, 13

COMPUTE_KERNELS = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int, float*)",
    "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(at::native::ReduceOp<float>)",
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)",
)
COMM_KERNELS = (
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
)
MEMORY_KERNELS = (
    ("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)"),
    ("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)"),
    ("gpu_memset", "Memset (Device)"),
)


@dataclass
class Rank:
    """The state of one rank's trace while it is generated."""

    rank: int
    pid: int
    rng: random.Random
    now: float = START_US  # host clock (µs after the base)
    correlation: int = 1000
    external: int = 1

    def __post_init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.stream_free = {COMPUTE_STREAM: 0.0, COMM_STREAM: 0.0, COPY_STREAM: 0.0}

    def _t(self, value: float) -> float:
        return round(value, 3)

    def host(self, cat: str, name: str, dur: float, tid: int | None = None, **args: Any) -> float:
        start = self.now
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": tid or self.pid,
                            "ts": self._t(start), "dur": self._t(dur), "args": {"External id": self.external, **args}})
        self.external += 1
        return start

    def launch(self, cat: str, name: str, stream: int, gpu_dur: float, after: float = 0.0,
               runtime: str = "cudaLaunchKernel") -> tuple[float, float]:
        """A runtime call on the main thread launching one GPU activity; returns its (start, end)."""
        self.correlation += 1
        call_dur = self.rng.uniform(3, 9)
        start = self.host("cuda_runtime", runtime, call_dur, cbid=211, correlation=self.correlation)
        queued = start + self.rng.uniform(4, 12)
        gpu_start = max(queued, self.stream_free[stream], after)
        self.stream_free[stream] = gpu_start + gpu_dur
        args = {"External id": self.external, "device": self.rank, "context": 1, "stream": stream,
                "correlation": self.correlation}
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.rank, "tid": stream,
                            "ts": self._t(gpu_start), "dur": self._t(gpu_dur), "args": args})
        self.now = start + call_dur + self.rng.uniform(0.5, 3)
        return gpu_start, gpu_start + gpu_dur

    def step(self, number: int, with_comm: bool, sync: bool) -> None:
        rng = self.rng
        step_start = self.now
        index = len(self.events)
        self.now += 2
        self.launch("gpu_memcpy", MEMORY_KERNELS[0][1], COPY_STREAM, rng.uniform(20, 60), runtime="cudaMemcpyAsync")
        comm_end = 0.0
        for layer in range(rng.randint(6, 10)):
            op_start = self.now
            self.now += rng.uniform(2, 6)
            name = COMPUTE_KERNELS[rng.randrange(len(COMPUTE_KERNELS))]
            _, end = self.launch("kernel", name, COMPUTE_STREAM, rng.uniform(5, 400) * (3 if layer % 4 == 0 else 1))
            if layer % 3 == 2:
                self.launch(*MEMORY_KERNELS[2], COPY_STREAM, rng.uniform(1, 5), runtime="cudaMemsetAsync")
            if with_comm and layer % 2 == 1:
                # the gradient of this layer is reduced while the next layers compute
                _, comm_end = self.launch("kernel", COMM_KERNELS[layer % 2], COMM_STREAM, rng.uniform(50, 300),
                                          after=end)
            self.now += rng.uniform(1, 30)  # host work between ops: sometimes the GPU waits
            self.events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::layer{layer}", "pid": self.pid,
                                "tid": self.pid, "ts": self._t(op_start), "dur": self._t(self.now - op_start),
                                "args": {"External id": self.external}})
            self.external += 1
        self.launch("gpu_memcpy", MEMORY_KERNELS[1][1], COPY_STREAM, rng.uniform(2, 10),
                    after=max(self.stream_free[COMPUTE_STREAM], comm_end), runtime="cudaMemcpyAsync")
        if sync:
            busy_until = max(self.stream_free.values())
            wait = max(busy_until - self.now, 0) + 2
            self.host("cuda_runtime", "cudaDeviceSynchronize", wait, cbid=165, correlation=self.correlation + 1)
            self.correlation += 1
            self.now += wait + 1
        self.now += rng.uniform(50, 400)  # data loading between steps: the GPU idles
        self.events.insert(index, {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}",
                                   "pid": self.pid, "tid": self.pid, "ts": self._t(step_start),
                                   "dur": self._t(self.now - step_start),
                                   "args": {"External id": self.external}})
        self.external += 1


def rank_document(rank: int, *, steps: int = 4, seed: int = 0, with_comm: bool = True, world: int = 1,
                  first_step: int = 10, host: str | None = "gpu-node0") -> dict[str, Any]:
    """The Kineto document of one rank."""
    state = Rank(rank, pid=4000 + rank, rng=random.Random(seed * 1000 + rank))
    for number in range(first_step, first_step + steps):
        state.step(number, with_comm, sync=number % 2 == 0)
    meta: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": state.pid, "tid": 0, "ts": START_US, "args": {"name": "python"}},
        {"ph": "M", "name": "process_labels", "pid": state.pid, "tid": 0, "ts": START_US, "args": {"labels": "CPU"}},
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "ts": START_US, "args": {"name": f"GPU {rank}"}},
    ]
    for stream in sorted(state.stream_free):
        meta.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": stream, "ts": START_US,
                     "args": {"name": f"stream {stream} "}})
    flows = [{"ph": "s", "id": e["args"]["correlation"], "pid": state.pid, "tid": state.pid, "ts": e["ts"],
              "cat": "ac2g", "name": "ac2g"} for e in state.events if e["cat"] == "cuda_runtime"]
    trace = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
             "ts": START_US, "dur": round(state.now - START_US, 3), "args": {"Op count": 0}}
    doc: dict[str, Any] = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": rank, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85_000_000_000}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
    }
    if host is not None:
        doc["host_name"] = host
    doc.update({"baseTimeNanoseconds": BASE_NS, "traceEvents": meta + state.events + flows + [trace],
                "traceName": f"rank-{rank}.pt.trace.json"})
    return doc


def write_document(doc: dict[str, Any], path: Path) -> Path:
    """Write a document as the profiler does: indented JSON, gzip when the name ends in .gz."""
    text = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text, mtime=0))
    else:
        path.write_bytes(text)
    return path


def write_job(directory: Path, *, ranks: int = 2, seed: int = 0, gzip_files: bool = True, **options: Any) -> list[Path]:
    """One profiler trace per rank, named as ``tensorboard_trace_handler`` names them."""
    directory.mkdir(parents=True, exist_ok=True)
    suffix = ".pt.trace.json.gz" if gzip_files else ".pt.trace.json"
    return [write_document(rank_document(rank, seed=seed, world=ranks, **options),
                           directory / f"gpu-node0_{4000 + rank}.{1700000000 + rank}{suffix}")
            for rank in range(ranks)]
