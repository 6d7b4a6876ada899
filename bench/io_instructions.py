"""Instructions per traced file call, counted by callgrind.

    python bench/io_instructions.py [--n 20000] [--only LABEL-PART] [--dftracer-preload PATH]

prints a markdown table. The program: ``os.pread(fd, 4096, 0)`` N times on a 4 KiB
file, then exit. Configurations: no tracer; no tracer with one idle thread alive;
dftrace ``io=True`` with the file outside ``data_dir`` (its fd untraced) and inside
it (traced), with the default writer (a drainer process) and with ``writer="thread"``;
DFTracer 2.2.0's preload library (``LD_PRELOAD``, ``DFTRACER_INIT=PRELOAD``) with the
file outside and inside ``DFTRACER_DATA_DIR``, and inside with
``DFTRACER_INC_METADATA=1``. DFTracer's rows are skipped, with a note, where its wheel
is not installed (``pip install 'dftrace[bench]'``).

Each configuration runs twice under ``valgrind --tool=callgrind
--separate-threads=yes --trace-children=yes`` (``PYTHONHASHSEED=0``), with N and 2N
calls; every figure is (count at 2N - count at N) / N, so the interpreter's start,
imports, the tracer's start and finalize cancel out. Figures:

- *wrapper's own*: the inclusive count of the function ``os_pread`` calls for
  ``pread64`` (libc's ``pread`` untraced, dftrace's ``w_pread64``, DFTracer's
  ``pread64_wrapper``) less libc's ``pread`` in it.
- *os_pread*: the inclusive count of os.pread's C function in libpython: the call's
  argument handling, its bytes object, the GIL's release and the call through the
  GOT. Its growth over the untraced row is what the tracer adds where the program
  runs, including what any second thread costs there: in a process with more than
  one thread, libc's ``pread`` (a cancellation point) and ``malloc`` take their
  multi-threaded paths (the row with one more, idle, thread shows that part alone).
- *main thread*: every instruction of the main thread (the Python loop included).
- *dftrace-io thread*: every instruction of the thread that drains the wrappers'
  ring (the per-file counters, the calls handed to the engine as records).
- *writer*: every instruction of the writer (encoding, zstd, ``write``): its thread
  with ``writer="thread"``, the drainer process with the default writer.
- *traced process*: every thread of the program's process; *all*: with the drainer.

Kernel time is not counted (callgrind counts user-space instructions), and under
valgrind ``clock_gettime`` is a system call rather than the vDSO's few dozen
instructions, for both tracers alike.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)

#: (label, tracer, the file is in the traced directory, DFTracer's INC_METADATA or
#: dftrace's writer)
CONFIGS = (
    ("untraced", "none", False, None),
    ("untraced, one more thread alive", "thread", False, None),
    ("dftrace, fd not traced", "dftrace", False, "process"),
    ("dftrace, traced", "dftrace", True, "process"),
    ("dftrace, traced, `writer=\"thread\"`", "dftrace", True, "thread"),
    ("DFTracer 2.2.0, fd not traced", "dftracer", False, "0"),
    ("DFTracer 2.2.0, traced", "dftracer", True, "0"),
    ("DFTracer 2.2.0, traced, INC_METADATA=1", "dftracer", True, "1"),
)

#: Functions whose inclusive counts are reported: (function, a piece of its object's path).
CALLING = ("os_pread", "libpython")
#: What ``os_pread`` calls through pread64's GOT entry: libc's, or the tracer's wrapper.
GOT_TARGET = {"none": ("pread", "libc.so"), "thread": ("pread", "libc.so"),
              "dftrace": ("w_pread64", "_io."),
              "dftracer": ("pread64_wrapper(int, void*, unsigned long, long)", "dftracer")}
LIBC_PREAD = ("pread", "libc.so")
#: The dftrace-io thread's: the ring's reader.
DRAIN = ("drain", "_io.")
#: The writer thread's (``writer="thread"``): its loop.
WRITER_LOOP = ("write_loop", "_speedups")


# -- the measured program ------------------------------------------------------------
def child(tracer: str, n: int, workdir: str, traced: bool, writer: str) -> None:
    path = os.path.join(workdir, "data" if traced else "other", "f4k")
    if tracer == "dftrace":
        import dftrace

        dftrace.initialize(io=True, data_dir=os.path.join(workdir, "data"),
                           log_file=os.path.join(workdir, "out", f"t{n}"), writer=writer,
                           inherit=False)
    if tracer == "thread":
        import threading

        done = threading.Event()
        alive = threading.Thread(target=done.wait)
        alive.start()
    fd = os.open(path, os.O_RDONLY)
    pread = os.pread
    for _ in range(n):
        pread(fd, 4096, 0)
    os.close(fd)
    if tracer == "dftrace":
        import time

        time.sleep(0.5)  # the dftrace-io thread drains what is left, not finalize
        dftrace.finalize()
    if tracer == "thread":
        done.set()
        alive.join()


# -- DFTracer's preload library ---------------------------------------------------------
def dftracer_preload() -> str | None:
    """The path of DFTracer's preload library, or None where it is not installed."""
    spec = importlib.util.find_spec("dftracer")
    if spec is None:
        return None
    roots = list(spec.submodule_search_locations or [os.path.dirname(spec.origin or "")])
    site = os.path.dirname(roots[0])
    for pattern in ("dftracer/lib*/libdftracer_preload.so", "**/libdftracer_preload.so"):
        found = sorted(glob.glob(os.path.join(site, pattern), recursive=True))
        if found:
            return found[0]
    return None


# -- counting ---------------------------------------------------------------------------
_LINE = re.compile(r"^\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?(.*)$")


def _inclusive(outfile: str) -> dict[tuple[str, str], int]:
    """{(function, object): inclusive instructions} of one callgrind output file."""
    proc = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", outfile],
                          capture_output=True, text=True, check=True)
    out: dict[tuple[str, str], int] = {}
    for line in proc.stdout.splitlines():
        m = _LINE.match(line)
        if not m or ":" not in m.group(2):
            continue
        rest = m.group(2)
        obj = rest[rest.rfind(" [") + 2:-1] if rest.endswith("]") else ""
        fn = rest[:rest.rfind(" [")] if obj else rest
        fn = fn.split(":", 1)[1] if ":" in fn else fn
        out[(fn.strip(), obj)] = out.get((fn.strip(), obj), 0) + int(m.group(1).replace(",", ""))
    return out


def _totals(outfile: str) -> int:
    with open(outfile) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {outfile}")


def _find(counts: dict[tuple[str, str], int], fn: str, obj_piece: str) -> int:
    return sum(v for (f, o), v in counts.items() if f == fn and obj_piece in o)


def _wait_for_children(runs: str, timeout: float = 600.0) -> None:
    """Wait for the processes the program started (the drainer finishes writing
    after the program exits) to end: callgrind writes their counts as they do."""
    deadline = time.monotonic() + timeout
    pids = {os.path.basename(f)[len("cg.out."):].split("-")[0] for f in glob.glob(f"{runs}/cg.out.*")}
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.2)


def count(tracer: str, traced: bool, option: str | None, n: int, workdir: str,
          preload: str | None) -> dict[str, int]:
    """Instruction counts of one run of ``n`` calls."""
    runs = os.path.join(workdir, "callgrind", f"{tracer}-{int(traced)}-{option}-{n}")
    os.makedirs(runs)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFTRACE_", "DFTRACER_"))}
    env["PYTHONHASHSEED"] = "0"
    if tracer == "dftracer":
        env.update(LD_PRELOAD=preload or "", DFTRACER_ENABLE="1", DFTRACER_INIT="PRELOAD",
                   DFTRACER_DATA_DIR=os.path.join(workdir, "data"),
                   DFTRACER_LOG_FILE=os.path.join(workdir, "out", f"dft{n}"),
                   DFTRACER_INC_METADATA=option or "0")
    cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--trace-children=yes",
           f"--callgrind-out-file={runs}/cg.out.%p", sys.executable, HERE, "--child", tracer,
           str(n), workdir, str(int(traced)), option if tracer == "dftrace" else "-"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{tracer} failed:\n{proc.stderr[-3000:]}")
    _wait_for_children(runs)
    files = [f for f in sorted(glob.glob(f"{runs}/cg.out.*")) if os.path.getsize(f)]
    parsed = [(f.rsplit(".", 1)[1].split("-")[0], _totals(f), _inclusive(f)) for f in files]
    program = next(pid for pid, _, counts in parsed if _find(counts, *CALLING))
    result = {"all": 0, "program": 0, "main": 0, "calling": 0, "got": 0, "libc": 0,
              "io_thread": 0, "writer": 0}
    for pid, total, counts in parsed:
        result["all"] += total
        if pid != program:
            result["writer"] += total  # the drainer process
            continue
        result["program"] += total
        calling = _find(counts, *CALLING)
        if calling:
            result["main"] += total
        elif _find(counts, *DRAIN):
            result["io_thread"] += total
        elif _find(counts, *WRITER_LOOP):
            result["writer"] += total
        result["calling"] += calling
        result["got"] += _find(counts, *GOT_TARGET[tracer])
        result["libc"] += _find(counts, *LIBC_PREAD)
    return result


def measure(n: int, only: str = "",
            preload: str | None = None) -> tuple[list[tuple[str, dict[str, float]]], list[str]]:
    preload = preload or dftracer_preload()
    notes = []
    rows = []
    workdir = tempfile.mkdtemp(prefix="dftrace-io-instr-")
    try:
        for sub in ("data", "other", "out"):
            os.makedirs(os.path.join(workdir, sub))
        for sub in ("data", "other"):
            with open(os.path.join(workdir, sub, "f4k"), "wb") as f:
                f.write(os.urandom(4096))
        for label, tracer, traced, option in CONFIGS:
            if only and only not in label:
                continue
            if tracer == "dftracer" and preload is None:
                if not notes:
                    notes.append("DFTracer's rows are skipped: its preload library is not "
                                 "installed (pip install 'dftrace[bench]').")
                continue
            small = count(tracer, traced, option, n, workdir, preload)
            large = count(tracer, traced, option, 2 * n, workdir, preload)
            rows.append((label, {k: (large[k] - small[k]) / n for k in small}))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows, notes


def table(rows: list[tuple[str, dict[str, float]]], notes: list[str]) -> str:
    base = next((r["calling"] for label, r in rows if label == "untraced"), 0.0)
    lines = ["| configuration | wrapper's own | `os_pread` inclusive | added to `os_pread` | "
             "main thread | dftrace-io thread | writer | traced process | all |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, r in rows:
        added = "—" if label == "untraced" else f"{r['calling'] - base:+,.0f}"
        ours = label.startswith("dftrace")
        io_thread = f"{r['io_thread']:,.0f}" if ours else "—"
        writer = f"{r['writer']:,.0f}" if ours else "—"
        lines.append(f"| {label} | {r['got'] - r['libc']:,.0f} | {r['calling']:,.0f} | {added} | "
                     f"{r['main']:,.0f} | {io_thread} | {writer} | {r['program']:,.0f} | "
                     f"{r['all']:,.0f} |")
    return "\n".join(lines + [""] + notes)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1", sys.argv[6])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="calls in the shorter run")
    parser.add_argument("--only", default="", help="only the configurations whose label has this")
    parser.add_argument("--dftracer-preload", default=None, metavar="PATH",
                        help="DFTracer's libdftracer_preload.so, where its wheel is in another "
                             "environment")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        raise SystemExit("valgrind is not installed (apt install valgrind)")
    rows, notes = measure(args.n, args.only, args.dftracer_preload)
    print(f"Instructions per `os.pread(fd, 4096, 0)` ({2 * args.n:,} calls minus {args.n:,}, "
          f"divided by {args.n:,}):\n")
    print(table(rows, notes))


if __name__ == "__main__":
    main()
