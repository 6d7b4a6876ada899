"""The analysis run by a user with no home: no ``HOME`` and no passwd entry (a
container started with an arbitrary uid). The summary works, nothing named ``~``
appears in the working directory, and the summary's index goes to a directory of the
temporary directory that is this user's alone (one warning says where), or to none.
See docs/reliability.md, "At a glance".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ._util import clean_env, write_script

#: Runs ``dftrace summary --json DIR`` as a user whose uid has no passwd entry
#: (what ``os.path.expanduser`` asks, answered as on such a machine).
HOMELESS = """
    import pwd, sys

    def getpwuid(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    pwd.getpwuid = getpwuid
    from dftrace.cli import main
    sys.exit(main(["summary", "--json", sys.argv[1]]))
"""


def _trace(tmp_path) -> str:
    out = tmp_path / "trace"
    prog = write_script(tmp_path, """
        import sys
        import dftrace
        dftrace.initialize(log_file=sys.argv[1])
        for _ in range(3):
            with dftrace.ai.compute.forward:
                pass
    """, name="traced.py")
    done = subprocess.run([sys.executable, prog, str(out / "t")], capture_output=True,
                          text=True, timeout=120, env=clean_env())
    assert done.returncode == 0, done.stderr
    return str(out)


def _summary(tmp_path, trace: str) -> tuple[subprocess.CompletedProcess, str, str]:
    """The summary run homeless in a directory of its own; (result, cwd, index dir)."""
    pytest.importorskip("polars", reason="dftrace summary needs the analysis extra")
    cwd = tmp_path / "cwd"
    tmp = tmp_path / "tmp"
    cwd.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    env = clean_env(TMPDIR=str(tmp))
    for name in ("HOME", "XDG_CACHE_HOME", "DFTRACE_INDEX_DIR"):
        env.pop(name, None)
    prog = write_script(tmp_path, HOMELESS, name="homeless.py")
    done = subprocess.run([sys.executable, prog, trace], capture_output=True, text=True,
                          timeout=300, env=env, cwd=cwd)
    return done, str(cwd), str(tmp / f"dftrace-index-{os.getuid()}")


def test_no_home_leaves_no_tilde_directory_and_indexes_in_a_private_one(tmp_path):
    """Without a home the summary answers, makes no ``~`` directory, and keeps its
    index in ``<tmp>/dftrace-index-<uid>`` (mode 0700), saying so once."""
    trace = _trace(tmp_path)
    done, cwd, index = _summary(tmp_path, trace)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)
    assert os.listdir(cwd) == []
    assert os.stat(index).st_mode & 0o777 == 0o700
    assert [n for n in os.listdir(index) if n.endswith(".idx")]
    assert done.stderr.count("no home directory") == 1, done.stderr


def test_no_home_never_uses_a_temporary_index_of_someone_else(tmp_path):
    """A ``dftrace-index-<uid>`` made by another user first is not written to: the
    summary still answers, with no index."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test makes the directory another user's (chown)")
    trace = _trace(tmp_path)
    planted = tmp_path / "tmp" / f"dftrace-index-{os.getuid()}"
    planted.mkdir(parents=True)
    os.chown(planted, 54321, 54321)
    done, cwd, index = _summary(tmp_path, trace)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)
    assert os.listdir(cwd) == []
    assert os.listdir(index) == []
