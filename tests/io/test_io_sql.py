"""``dftrace sql``'s io table on a traced program's failing calls: each call's ``ret``
and ``errno`` tell a failure apart (a failed read moved 0 bytes, as an end of file
does), checked against the errors the program itself saw."""

from __future__ import annotations

import pytest

from _io_util import NEEDS_IO, START, run_traced

pytestmark = NEEDS_IO

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis import run_sql  # noqa: E402

FAILING = START + """
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    path, seen = os.path.join(data, "w.bin"), []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    for _ in range(5):
        try:
            os.read(fd, 100)
        except OSError as e:
            seen.append(["read", e.errno])
    os.write(fd, b"x" * 10)
    os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    for _ in range(3):
        try:
            os.write(fd, b"y" * 100)
        except OSError as e:
            seen.append(["write", e.errno])
    n = len(os.read(fd, 100))
    os.close(fd)
    print(json.dumps({"seen": seen, "read": n}))
"""


def test_failed_calls_carry_their_ret_and_errno(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, FAILING)
    assert truth["read"] == 10 and len(truth["seen"]) == 8
    failed = run_sql("SELECT name, errno FROM io WHERE ret < 0 ORDER BY ts", tmp_path / "trace").rows()
    assert [list(row) for row in failed] == truth["seen"]
    moved = run_sql("SELECT name, count(*) AS n, sum(bytes) AS b FROM io WHERE ret >= 0 AND name IN ('read', 'write') "
                    "GROUP BY name ORDER BY name", tmp_path / "trace").rows()
    assert moved == [("read", 1, 10), ("write", 1, 10)]
