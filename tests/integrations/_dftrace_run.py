"""``dftrace run`` of a script the test writes, in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def dftrace_run(tmp_path: Path, text: str, engine: str = "c", timeout: float = 600) -> Path:
    """Run ``text`` as ``job.py`` under ``dftrace run`` with the C engine (``engine``
    "c") or the pure-Python one ("python"), no DFTRACE_ or rank setting inherited;
    the folder of its traces. Fails the test where the script fails."""
    script = tmp_path / "job.py"
    script.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFTRACE_", "RANK", "LOCAL_RANK"))}
    if engine == "python":
        env["DFTRACE_NO_SPEEDUPS"] = "1"
    done = subprocess.run([sys.executable, "-m", "dftrace", "run", "--log-file", str(tmp_path / "t" / "job"),
                           str(script)], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp_path / "t"
