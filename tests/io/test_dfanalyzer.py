"""DFAnalyzer's ``posix`` preset on a dftrace trace reports the program's own bytes and
calls: reads, writes, opens and closes, nothing misfiled as "other". Runs where
DFAnalyzer (``pip install dftracer-analyzer``) imports beside dftrace; skips elsewhere."""

from __future__ import annotations

import importlib.util
import json

import pytest

from _io_util import NEEDS_IO, run_traced
from _requirements import needs_marks
from reliability._util import run, write_script


#: Writes 50 files of known sizes in 16 KiB writes under data/, reads the even ones
#: back in 4 KiB reads and the odd ones in 64 KiB preads (each to its 0-byte end),
#: one libc call per os call, and prints what it did.
WORKLOAD = """
    import json, os, sys
    import dftrace
    out, data = sys.argv[1], os.path.abspath("data")
    os.makedirs(data)
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="gzip")
    truth = {"read_count": 0, "read_size": 0, "write_count": 0, "write_size": 0,
             "open_count": 0, "close_count": 0}
    block = os.urandom(16384)
    for i in range(50):
        fd = os.open(os.path.join(data, f"f{i}.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
        left = 20000 + 3001 * i
        while left:
            n = os.write(fd, block[:min(left, len(block))])
            truth["write_count"] += 1
            truth["write_size"] += n
            left -= n
        os.close(fd)
    for i in range(50):
        fd = os.open(os.path.join(data, f"f{i}.bin"), os.O_RDONLY)
        offset = 0
        while True:
            got = os.pread(fd, 65536, offset) if i % 2 else os.read(fd, 4096)
            truth["read_count"] += 1
            truth["read_size"] += len(got)
            offset += len(got)
            if not got:
                break
        os.close(fd)
    truth["open_count"] = truth["close_count"] = 100
    dftrace.finalize()
    print(json.dumps(truth))
"""

#: Runs DFAnalyzer's posix preset on a trace folder (one process, one thread pool)
#: and prints the sums of its per-process view's posix columns.
ANALYZE = """
    import json, sys
    try:
        from dftracer.analyzer import init_with_hydra
    except ImportError as e:
        print(json.dumps({"skip": f"dftracer.analyzer does not import: {e}"}))
        sys.exit(0)
    trace, work = sys.argv[1], sys.argv[2]
    analyzer = init_with_hydra([
        f"trace_path={trace}", "analyzer/preset=posix", "analyzer.checkpoint=false",
        "cluster.n_workers=1", "cluster.processes=false", "+cluster.dashboard_address=null",
        f"cluster.local_directory={work}/dask", f"hydra.run.dir={work}",
        "view_types=[proc_name]"])
    try:
        view = analyzer.analyze_trace().flat_views[("proc_name",)]
        print(json.dumps({c[len("posix_"):-len("_sum")]: int(view[c].sum()) for c in view.columns
                          if c.startswith("posix_") and c.endswith(("_count_sum", "_size_sum"))}))
    finally:
        analyzer.shutdown()
"""


def _dfanalyzer_installed() -> bool:
    try:
        return importlib.util.find_spec("dftracer.analyzer") is not None
    except ModuleNotFoundError:  # no dftracer package at all
        return False


pytestmark = [*NEEDS_IO, *needs_marks("dfanalyzer", None if _dfanalyzer_installed() else
                                      "needs DFAnalyzer (pip install dftracer-analyzer)")]


@pytest.mark.timeout(900)
def test_dfanalyzer_posix_totals_are_the_programs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, WORKLOAD)
    truth.pop("_stderr")
    done = run([write_script(tmp_path, ANALYZE, "analyze.py"), str(tmp_path / "trace"),
                str(tmp_path / "dfanalyzer")], timeout=840)
    assert done.returncode == 0, done.stderr[-5000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    assert {k: got[k] for k in truth} == truth
    # a call name DFAnalyzer does not map (pread64, as DFTracer writes it) is filed "other"
    assert got["other_count"] == 0
    assert got["count"] == sum(v for k, v in truth.items() if k.endswith("_count"))
    assert got["size"] == truth["read_size"] + truth["write_size"]
