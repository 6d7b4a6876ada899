"""The documented CI line against a busy machine: same-code (A/A) pairs and pairs with a
planted forward, each pair one run per side.

    python bench/diff_noise.py [--same 20] [--planted 3] [--extra 24] [--steps 48] [--busy 3] [--out DIR]

Starts ``--busy`` processes spinning on the CPU, then runs pairs of the timed loop of
tests/analysis/_timed_job.py (48 steps of 240 work units; ``--extra`` units added to
every forward in the planted pairs: 24 is 10 % of a step) and judges each pair with
``dftrace diff BASE NEW --fail-on-regression 5%``. Prints one line per pair and the
counts as JSON: A/A pairs that passed, planted pairs that failed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

JOB = Path(__file__).resolve().parents[1] / "tests" / "analysis" / "_timed_job.py"
STEPS = 48


def _job(out: Path, extra: int, steps: int = STEPS) -> Path:
    subprocess.run([sys.executable, str(JOB), str(out), str(steps), str(extra)], check=True, timeout=600)
    return out


def _judge(base: Path, new: Path) -> tuple[int, dict]:
    from dftrace.analysis.commands import main

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["diff", str(base), str(new), "--fail-on-regression", "5%", "--json", "--no-progress"])
    return code, json.loads(buffer.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--same", type=int, default=20, help="A/A pairs (default 20)")
    parser.add_argument("--planted", type=int, default=3, help="planted pairs (default 3)")
    parser.add_argument("--extra", type=int, default=24, help="work units added to each forward (default 24)")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"steps per run (default {STEPS})")
    parser.add_argument("--busy", type=int, default=3, help="spinning processes (default 3)")
    parser.add_argument("--out", help="keep the runs here (default: a temporary directory)")
    args = parser.parse_args()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    counts = {"same": args.same, "same_passed": 0, "planted": args.planted, "planted_failed": 0,
              "busy": args.busy, "extra_units": args.extra}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(args.out or tmp)
            kinds = ["planted"] * args.planted + ["same"] * args.same
            for i, kind in enumerate(kinds):
                base = _job(root / f"{kind}{i}" / "base", 0, args.steps)
                new = _job(root / f"{kind}{i}" / "new", args.extra if kind == "planted" else 0, args.steps)
                code, data = _judge(base, new)
                step = next(r for r in data["rows"] if r["metric"] == "step.p50")
                reason = data["regression"]["reason"] if code else "passed"
                print(f"{kind:8} {i:3} exit {code}  step.p50 {step['relative'] * 100:+6.1f}%  "
                      f"speed {data['speed']}  {reason}", flush=True)
                if kind == "same":
                    counts["same_passed"] += code == 0
                else:
                    counts["planted_failed"] += code == 1
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
