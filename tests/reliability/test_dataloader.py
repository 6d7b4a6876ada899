"""A real PyTorch DataLoader with two workers under each start method."""

from __future__ import annotations

import os
import socket
from collections import Counter

import pytest

from ._util import HERE, WRITERS, assert_valid, events_by_pid, files, meta, run, spans

pytest.importorskip("torch")

N = 40  # items; batches of 4


@pytest.mark.parametrize("method,init,writer", [
    ("fork", False, "thread"),
    ("fork", True, "thread"),
    ("spawn", True, "thread"),
    ("forkserver", True, "thread"),
    *((m, True, "process") for m in ("fork", "spawn") if "process" in WRITERS),
])
def test_every_item_is_traced_once_in_some_worker(tmp_path, method, init, writer):
    """Item spans are in the workers' files, fetch spans in the main one, none twice."""
    args = [os.path.join(HERE, "_dl_workload.py"), method, str(tmp_path), str(N)]
    out = run(args + (["init"] if init else []), timeout=240, DFTRACE_WRITER=writer)
    assert out.returncode == 0, out.stderr
    assert "not available" not in out.stderr
    by_pid = events_by_pid(tmp_path)
    assert_valid(files(tmp_path))
    assert len(by_pid) == 3  # main + two workers
    main_pid = next(p for p, evs in by_pid.items() if spans(evs, "fetch.iter"))
    main = Counter(e["name"] for e in spans(by_pid[main_pid]))
    assert main == {"fetch.iter": N // 4, "fetch.block": N // 4, "fetch.end": 1}  # one pass, run to its end
    workers = [p for p in by_pid if p != main_pid]
    items = [e for p in workers for e in spans(by_pid[p], "item")]
    assert len(items) == N
    assert all(spans(by_pid[p], "item") for p in workers)  # both workers did work
    assert {e["name"] for p in workers for e in spans(by_pid[p])} == {"item"}
    assert len({(e["pid"], e["id"]) for e in items}) == N
    if init:  # worker_init_fn names each worker after its DataLoader worker id
        ids = {p: _worker_id(by_pid[p]) for p in workers}
        assert sorted(ids.values()) == [0, 1]
        for p in workers:
            name = meta(by_pid[p], "process_name")[-1]["args"]["name"]
            assert name == f"dataloader worker {ids[p]} · pid {p}"
    else:
        host = socket.gethostname()
        assert all(meta(by_pid[p], "process_name")[-1]["args"]["name"] == f"{host} · pid {p}"
                   for p in workers)


def _worker_id(events: list[dict]) -> int:
    (cm,) = [e for e in meta(events, "CM") if e["args"]["name"] == "dataloader.worker"]
    assert cm["args"]["num_workers"] == 2
    return int(cm["args"]["value"])
