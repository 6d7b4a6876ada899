"""Child processes: one file each, no events of the parent, configured from the environment."""

from __future__ import annotations

import os
import sys

import pytest

import dftrace
from dftrace import ai, testing

from ._util import WRITERS, assert_valid, events_by_pid, files, meta, run, spans, write_script

MP_SCRIPT = """
    import multiprocessing as mp
    import sys

    import dftrace
    from dftrace import ai


    def child(k, n):
        for i in range(n):
            with ai.data.item(args={"child": k, "i": i}):
                pass


    if __name__ == "__main__":
        method, out = sys.argv[1], sys.argv[2]
        # A long flush interval: children's events can reach disk only at their exit.
        dftrace.initialize(log_file=out + "/mp", compression="gzip", flush_interval=60)
        with ai.pipeline.epoch:
            for i in range(5):
                with ai.compute.forward(args={"parent": i}):
                    pass
            ctx = mp.get_context(method)
            procs = [ctx.Process(target=child, args=(k, 7)) for k in range(2)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
        with ai.compute.forward(args={"parent": 5}):
            pass
        print(" ".join(str(p.pid) for p in procs), [p.exitcode for p in procs])
"""


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocessing_children_write_complete_files_of_their_own(tmp_path, method, writer):
    """Each multiprocessing child writes all its events, and only its own, to a finished file."""
    script = write_script(tmp_path, MP_SCRIPT)
    out = run([script, method, str(tmp_path / "traces")], DFTRACE_WRITER=writer)
    assert out.returncode == 0, out.stderr
    assert "not available" not in out.stderr
    child_pids = [int(p) for p in out.stdout.split("[")[0].split()]
    by_pid = events_by_pid(tmp_path / "traces")
    parent_pid = next(p for p in by_pid if p not in child_pids)
    assert sorted(by_pid) == sorted([parent_pid, *child_pids])
    paths = files(tmp_path / "traces")
    assert all(p.endswith(".pfw.gz") for p in paths), paths  # the parent's settings
    assert_valid(paths)

    parent = spans(by_pid[parent_pid])
    assert sorted(e["args"]["parent"] for e in parent if e["name"] == "forward") == list(range(6))
    assert [e["name"] for e in parent if e["name"] != "forward"] == ["epoch"]
    for k, pid in enumerate(child_pids):
        mine = spans(by_pid[pid])
        assert [(e["name"], e["args"]["child"], e["args"]["i"]) for e in mine] == \
            [("item", k, i) for i in range(7)]
        assert {e["pid"] for e in by_pid[pid]} == {pid}
    keys = [(e["pid"], e["id"]) for evs in by_pid.values() for e in spans(evs)]
    assert len(keys) == len(set(keys))


POOL_SCRIPT = """
    import multiprocessing as mp
    import os
    import sys

    import dftrace
    from dftrace import ai


    def work(i):
        with ai.data.preprocess(args={"i": i}):
            return os.getpid()


    if __name__ == "__main__":
        dftrace.initialize(log_file=sys.argv[1] + "/p")
        context = mp.get_context(sys.argv[2])
        with context.Pool(2) as pool:  # leaves by terminate(): SIGTERM to each worker
            workers = set(pool.map(work, range(20)))
        print(" ".join(map(str, workers)))
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_pool_ending_its_workers_is_not_a_kill(tmp_path, method):
    """``with Pool()`` ends its workers with SIGTERM (``terminate()``): their traces are
    whole and say no "killed by signal 15" (the summary called them ended abnormally).
    Any SIGTERM a pool's worker takes is read as its pool's end."""
    script = write_script(tmp_path, POOL_SCRIPT)
    out = run([script, str(tmp_path / "traces"), method], DFTRACE_WRITER="process")
    assert out.returncode == 0, out.stderr
    workers = {int(p) for p in out.stdout.split()}
    by_pid = events_by_pid(tmp_path / "traces")
    assert sum(e["name"] == "preprocess" for pid in workers for e in spans(by_pid.get(pid, []))) == 20
    for pid in workers:
        assert meta(by_pid[pid], "process_end") == [], pid


FORK_SCRIPT = """
    import os
    import sys

    import dftrace
    from dftrace import ai

    dftrace.initialize(log_file=sys.argv[1] + "/f", compression="zstd", flush_interval=60)


    @ai.pipeline.train
    def train():
        with ai.pipeline.epoch:
            for i in range(4):
                with ai.compute.forward(args={"parent": i}):
                    pass
            pid = os.fork()  # inside two open spans, with four events buffered
            if pid == 0:
                for i in range(3):
                    with ai.data.item(args={"child": i}):
                        pass
                sys.exit(0)
            os.waitpid(pid, 0)
            print(pid)


    train()
"""


@pytest.mark.parametrize("writer", WRITERS)
def test_os_fork_child_writes_only_its_own_events(tmp_path, writer):
    """A child of os.fork gets its own file; the parent's buffered and open spans stay the parent's."""
    script = write_script(tmp_path, FORK_SCRIPT)
    out = run([script, str(tmp_path)], DFTRACE_WRITER=writer)
    assert out.returncode == 0, out.stderr
    assert "not available" not in out.stderr
    child = int(out.stdout.split()[-1])
    by_pid = events_by_pid(tmp_path)
    assert len(by_pid) == 2
    parent = next(p for p in by_pid if p != child)
    assert_valid(files(tmp_path))
    assert sorted(e["name"] for e in spans(by_pid[parent])) == ["epoch"] + ["forward"] * 4 + ["train"]
    kids = spans(by_pid[child])
    assert [(e["name"], e["args"]["child"]) for e in kids] == [("item", i) for i in range(3)]
    assert all(e["args"]["level"] == 1 and e["args"]["p_idx"] == 0 for e in kids)


def test_subprocess_traces_with_the_configuration_the_parent_exported(tmp_path):
    """A program started by a traced one traces at import, with the parent's settings."""
    script = write_script(tmp_path, """
        import subprocess
        import sys

        import dftrace

        dftrace.initialize(log_file=sys.argv[1] + "/p", compression="gzip", flush_interval=7)
        code = "import dftrace; from dftrace import ai\\nwith ai.compute.step: pass"
        with dftrace.ai.pipeline.train:
            subprocess.run([sys.executable, "-c", code], check=True)
    """)
    out = run([script, str(tmp_path)])
    assert out.returncode == 0, out.stderr
    by_pid = events_by_pid(tmp_path)
    assert len(by_pid) == 2
    assert_valid(files(tmp_path))
    assert all(p.endswith(".pfw.gz") for p in files(tmp_path))
    (child,) = [evs for evs in by_pid.values() if spans(evs, "step")]
    assert [e["name"] for e in spans(child)] == ["step"]


@pytest.mark.parametrize("folder", ["{tmp}/traces/", "~/traces/"])
def test_children_write_into_a_folder_named_with_a_trailing_separator(tmp_path, folder):
    """``log_file`` a folder (``DIR/``, ``~/DIR/``): a spawned child and a Python
    subprocess write their files in it, beside the parent's (they wrote theirs beside
    the folder, named after it: ``traces-<host>-<pid>.pfw``, and a summary of the
    folder lost them)."""
    script = write_script(tmp_path, """
        import multiprocessing as mp
        import subprocess
        import sys

        import dftrace
        from dftrace import ai


        def child():
            with ai.data.item:
                pass


        if __name__ == "__main__":
            dftrace.initialize(log_file=sys.argv[1])
            with ai.pipeline.train:
                p = mp.get_context("spawn").Process(target=child)
                p.start()
                p.join()
                code = "from dftrace import ai\\nwith ai.compute.step: pass"
                subprocess.run([sys.executable, "-c", code], check=True)
    """)
    home = tmp_path / "home"
    home.mkdir()
    out = run([script, folder.format(tmp=home)], HOME=str(home))
    assert out.returncode == 0, out.stderr
    everything = sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())
    assert len(everything) == 3 and all(p.startswith("traces/dftrace-") for p in everything), everything
    names = sorted(e["name"] for evs in events_by_pid(home / "traces").values() for e in spans(evs))
    assert names == ["item", "step", "train"]


def test_process_context_is_recorded_at_start(tmp_path):
    """The PR metadata says what the process is: command line, directory, versions, CPUs, host."""
    numpy = pytest.importorskip("numpy")  # an imported framework gets its version recorded

    with testing.trace_to(tmp_path) as t:
        with ai.compute.step:
            pass
    (pr,) = t.metadata("PR")
    a = pr["args"]
    assert a["cmdline"] == sys.argv
    assert a["cwd"] == os.getcwd()
    assert a["python"] == sys.version.split()[0]
    assert a["dftrace"] == dftrace.__version__
    assert a["packages"]["numpy"] == numpy.__version__
    assert a["cpu_affinity"] == sorted(os.sched_getaffinity(0))
    assert a["cpu_count"] == os.cpu_count()
    assert a["memory_total"] > 0
    import socket

    assert a["hostname"] == socket.gethostname()
    assert a["pid"] == os.getpid() and a["ppid"] == os.getppid()


@pytest.mark.parametrize("env,rank,local", [
    ({"RANK": "3", "LOCAL_RANK": "1"}, 3, 1),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, 5, 0),
    ({"PMI_RANK": "2"}, 2, None),
    ({"SLURM_PROCID": "7", "SLURM_LOCALID": "3"}, 7, 3),
])
def test_rank_from_launcher_environment(tmp_path, monkeypatch, env, rank, local):
    """The launcher's rank is in the file name, process_name, process_sort_index and PR."""
    for k in ("RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
              "PMI_RANK", "SLURM_PROCID", "SLURM_LOCALID"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with testing.trace_to(tmp_path) as t:
        with ai.compute.forward:
            pass
    (path,) = t.paths
    assert os.path.basename(path).startswith(f"trace-rank{rank}-")
    import socket

    (name,) = t.metadata("process_name")
    assert name["args"]["name"] == f"rank {rank} · {socket.gethostname()} · pid {os.getpid()}"
    assert t.metadata("process_sort_index")[0]["args"]["sort_index"] == rank
    pr = t.metadata("PR")[0]["args"]
    assert (pr["rank"], pr["local_rank"]) == (rank, local)


RANKED_CHILDREN = """
    import multiprocessing as mp
    import sys

    import dftrace
    from dftrace import ai


    def rank_worker(rank):
        dftrace.initialize(rank=rank)  # the parent's session carried on here at the fork
        with ai.compute.forward:
            pass


    if __name__ == "__main__":
        dftrace.initialize(log_file=sys.argv[1] + "/r", compression="zstd")
        ctx = mp.get_context("fork")
        procs = [ctx.Process(target=rank_worker, args=(k,)) for k in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        print(" ".join(str(p.pid) for p in procs))
"""


def test_a_forked_child_takes_the_rank_its_initialize_gives(tmp_path):
    """A child forked from a traced parent, calling ``initialize(rank=k)``: its trace
    carries rank k (the call returned the session carried on from the parent, and the
    rank was dropped: the run had no ranks)."""
    script = write_script(tmp_path, RANKED_CHILDREN)
    out = run([script, str(tmp_path / "traces")])
    assert out.returncode == 0, out.stderr
    children = [int(p) for p in out.stdout.split()]
    by_pid = events_by_pid(tmp_path / "traces")
    for rank, pid in enumerate(children):
        assert [r["args"]["rank"] for r in meta(by_pid[pid], "PR") if "rank" in r["args"]][-1] == rank


def test_process_without_rank_sorts_by_pid(tmp_path, monkeypatch):
    """Without a launcher the file has no rank part and the process sorts by pid."""
    for k in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    with testing.trace_to(tmp_path) as t:
        with ai.compute.step:
            pass
    assert "-rank" not in os.path.basename(t.paths[0])
    assert meta(t.events, "process_sort_index")[0]["args"]["sort_index"] == os.getpid()
