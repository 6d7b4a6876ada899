"""A PyTorch input pipeline's file I/O: every byte its DataLoader workers read (fork
and spawn, workers started each epoch or kept: ``persistent_workers=True``, which the
parent ends with a SIGTERM at its exit) and its checkpoint writes, against the files'
own sizes."""

from __future__ import annotations

import importlib.util

import pytest

from _io_util import NEEDS_IO, READS, WRITES, IOTrace, run_traced

pytestmark = NEEDS_IO

pytest.importorskip("torch", reason="needs torch: pip install 'dftrace[torch]'")

JOB = """
    import json, os, sys
    import torch
    from torch.utils.data import DataLoader, Dataset
    import dftrace

    class Files(Dataset):
        def __init__(self, paths):
            self.paths = paths
        def __len__(self):
            return len(self.paths)
        def __getitem__(self, i):
            with open(self.paths[i], "rb") as f:
                return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).float().mean()

    if __name__ == "__main__":
        out, method, kept = sys.argv[1], sys.argv[2], sys.argv[3] == "kept"
        data = os.path.abspath("data")
        os.makedirs(data, exist_ok=True)
        paths, sizes = [], {}
        for i in range(120):
            p = os.path.join(data, f"s{i}.bin")
            with open(p, "wb") as f:
                f.write(os.urandom(4096 + 97 * i))
            paths.append(p)
            sizes[p] = 4096 + 97 * i
        dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
        loader = DataLoader(Files(paths), batch_size=8, num_workers=2,
                            multiprocessing_context=method, persistent_workers=kept)
        for _ in loader:
            pass
        ckpt = os.path.join(data, "model.pt")
        torch.save({"w": torch.zeros(300_000)}, ckpt)
        dftrace.finalize()
        print(json.dumps({"sizes": sizes, "ckpt": ckpt, "ckpt_bytes": os.path.getsize(ckpt),
                          "pid": os.getpid()}))
"""


@pytest.mark.parametrize("workers", ["started", "kept"])
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_reads_and_the_checkpoint(tmp_path, monkeypatch, method, workers):
    """Kept workers outlive the main process's ``finalize()``: their parent ends them
    with a SIGTERM at its exit, which PyTorch's handler answers with ``_exit(0)``. Each
    still finishes its trace first: every read, its counters and that it is a worker
    (their reads were lost since the last drain, and the loader read 0 bytes)."""
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, JOB, method, workers, timeout=400)
    trace = IOTrace(tmp_path / "trace")
    for path, n in truth["sizes"].items():
        events = [e for e in trace.of(path) if e["name"] in READS]
        assert sum(max(e["args"]["ret"], 0) for e in events) == n, path
        assert all(e["pid"] != truth["pid"] for e in events)  # read by the workers
    assert trace.bytes(truth["ckpt"], WRITES) == truth["ckpt_bytes"]
    assert len({e["pid"] for e in trace.events}) == 3  # the main process and two workers
    assert "dftrace" not in truth["_stderr"]  # no warning: the workers' ends lost nothing
    if importlib.util.find_spec("polars") is not None:
        from dftrace.analysis import summarize

        # The workers say they are (no worker_init_fn of ours given): their reads are data loading.
        summary = summarize(tmp_path / "trace", index=False)
        assert summary.io["loader"]["read_bytes"] == sum(truth["sizes"].values())
        assert summary.overview["ended_abnormally"] == 0  # a worker shut down by its parent ended normally


SHARD_JOB = """
    import json, os, sys
    import torch
    from torch.utils.data import DataLoader, Dataset
    import dftrace

    class Shard(Dataset):
        def __init__(self, path):
            self.fd = os.open(path, os.O_RDONLY)  # opened once, here: read in the workers
        def __len__(self):
            return 32
        def __getitem__(self, i):
            return torch.frombuffer(bytearray(os.pread(self.fd, 4096, i * 4096)), dtype=torch.uint8).sum()

    if __name__ == "__main__":
        out = sys.argv[1]
        shard = os.path.abspath("shard.bin")
        with open(shard, "wb") as f:
            f.write(os.urandom(32 * 4096))
        dftrace.initialize(log_file=out, io=True, data_dir=os.path.dirname(shard), compression="none")
        for _ in DataLoader(Shard(shard), batch_size=4, num_workers=2, multiprocessing_context="fork"):
            pass
        dftrace.finalize()
        print(json.dumps({"shard": shard, "bytes": 32 * 4096}))
"""


def test_a_file_opened_before_the_workers_fork_is_named_in_their_reads(tmp_path, monkeypatch):
    """The shard a Dataset opens in the main process and its forked workers read: the
    workers' reads are that file's (by the path the main process opened), not a hash's."""
    pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")
    from dftrace.analysis import run_sql, summarize

    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, SHARD_JOB)
    files = summarize(tmp_path / "trace", index=False).io["files"]
    assert [(f["path"], f["read_bytes"], f["read_ops"]) for f in files] == [(truth["shard"], truth["bytes"], 32)]
    reads = run_sql("SELECT path, sum(bytes) AS n FROM io WHERE name = 'pread' GROUP BY path", tmp_path / "trace")
    assert reads.rows() == [(truth["shard"], truth["bytes"])]
