"""Unusual process context and storage: bytes that are not UTF-8, a full disk at
import, pid reuse, a log directory deleted mid-run, children that exec, spans that
are never stopped. Each test runs a real process and checks its status and files."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from dftrace import testing
from dftrace._core.session import _safe_host

from ._util import assert_valid, clean_env, files, meta, spans, tmpfs_dir, write_script

PROG = """
    import sys, threading
    import dftrace
    from dftrace import ai

    def work():
        for i in range(100):
            with ai.compute.forward(args={"i": i}):
                pass
    t = threading.Thread(target=work, name="w\\udce9\\ud800")
    t.start(); t.join()
    print("done", dftrace.session() is not None)
"""


def _run(argv: list, env: dict, cwd=None, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    full = {k.encode() if isinstance(k, str) else k: v.encode() if isinstance(v, str) else v
            for k, v in clean_env().items()}
    full.update({k.encode() if isinstance(k, str) else k: v.encode() if isinstance(v, str) else v
                 for k, v in env.items()})
    return subprocess.run([sys.executable, *argv], capture_output=True, env=full, cwd=cwd,
                          timeout=timeout, **kw)


def test_non_utf8_context_is_recorded_with_replacement_characters(tmp_path):
    """Latin-1 bytes in the script's name (argv), the working directory, the process
    name, the data dir, the log directory and a thread name: the program runs traced
    (status 0), and every such string is written with U+FFFD."""
    root = os.fsencode(tmp_path)
    cwd = root + b"/caf\xe9"
    os.mkdir(cwd)
    script = cwd + b"/r\xe9sum\xe9.py"
    with open(script, "w") as fh:
        fh.write(PROG.replace("\n    ", "\n"))
    out = _run([script], {"DFTRACE_ENABLE": "1", "DFTRACE_LOG_FILE": root + b"/logs\xe9/t",
                          "DFTRACE_PROCESS_NAME": b"trainer \xe9", "DFTRACE_DATA_DIR": b"/d\xe9"},
               cwd=cwd)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [b"done", b"True"]
    assert b"dftrace:" not in out.stderr
    (path,) = files(os.fsdecode(root + b"/logs\xe9"))
    assert_valid([path])
    events = testing.read_events(path)
    assert len(spans(events, "forward")) == 100
    (pr,) = meta(events, "PR")
    assert pr["args"]["cmdline"][0].endswith("/caf\ufffd/r\ufffdsum\ufffd.py")
    assert pr["args"]["cwd"].endswith("/caf\ufffd")
    assert pr["args"]["data_dir"] == "/d\ufffd"
    assert meta(events, "process_name")[0]["args"]["name"] == "trainer \ufffd"


@pytest.mark.parametrize("env,name", [
    ({"DFTRACE_LOG_FILE": "/proc/self/x/t"}, "DFTRACE_LOG_FILE"),  # cannot be created
    ({"DFTRACE_LOG_FILE": "/etc/hostname/t"}, "DFTRACE_LOG_FILE"),  # a parent is a file
    ({"RANK": str(2**64 + 1)}, "RANK"),
    ({"DFTRACE_ENABLE": "ture"}, "DFTRACE_ENABLE"),
])
def test_unusable_environment_leaves_a_child_untraced_with_one_warning(tmp_path, env, name):
    """DFTRACE_ENABLE=1 and an environment dftrace cannot use: the program runs to the
    end (status 0) untraced, with one warning naming the setting."""
    env = {"DFTRACE_ENABLE": "1", "DFTRACE_LOG_FILE": str(tmp_path / "t"), **env}
    script = write_script(tmp_path, PROG)
    out = _run([script], env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [b"done", b"False"]
    assert out.stderr.count(b"dftrace: tracing is off") == 1, out.stderr
    assert name.encode() in out.stderr
    assert files(tmp_path) == []


def _no_more_bytes() -> None:
    # A disk with no room left: no file may grow at all. Ignoring SIGXFSZ turns
    # the kernel's kill into an EFBIG error, as a full disk gives ENOSPC.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def test_full_disk_at_import_leaves_the_child_running(tmp_path):
    """A child started with DFTRACE_ENABLE=1 on a full disk: it runs to the end
    (status 0); a warning says tracing stopped, and the count in all comes at the
    end; no partial file is left."""
    script = write_script(tmp_path, PROG)
    out = _run([script], {"DFTRACE_ENABLE": "1", "DFTRACE_LOG_FILE": str(tmp_path / "logs" / "t")},
               preexec_fn=_no_more_bytes)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [b"done", b"True"]
    assert out.stderr.count(b"dftrace:") == 2, out.stderr
    assert b"tracing stops, the run goes on. No file was written." in out.stderr
    assert b"events could not be written to" in out.stderr
    assert os.listdir(tmp_path / "logs") == []


@pytest.fixture
def small_tmpfs(tmp_path):
    with tmpfs_dir(tmp_path, "64k") as mnt:
        yield mnt


def test_full_tmpfs_mid_run(small_tmpfs, tmp_path):
    """A real full file system (a 64 KiB tmpfs): a warning when it fills and the
    count in all at the end, status 0, the file decodes to its last whole frame."""
    script = write_script(tmp_path, """
        import os, sys
        import dftrace
        from dftrace import ai
        s = dftrace.initialize(log_file=sys.argv[1] + "/t", compression="none", flush_interval=60)
        for i in range(3000):
            with ai.compute.step(args={"i": i, "pad": os.urandom(64).hex()}):
                pass
            if i % 200 == 199:
                s.writer.flush()
        print("done")
    """)
    out = _run([script, str(small_tmpfs)], {})
    assert out.returncode == 0, out.stderr
    assert out.stderr.count(b"dftrace:") == 2, out.stderr
    (path,) = files(small_tmpfs)
    assert_valid([path], complete=False)
    steps = [e["args"]["i"] for e in spans(testing.read_events(path), "step")]
    assert steps == list(range(len(steps))) and 0 < len(steps) < 3000


REUSE = """
    import os, sys
    import dftrace
    from dftrace import ai
    dftrace.initialize(log_file=sys.argv[1] + "/t", inherit=False)
    for i in range(int(sys.argv[2])):
        with ai.compute.forward:
            pass
    print(os.getpid())
"""


def test_an_existing_trace_of_the_same_name_is_never_overwritten(tmp_path):
    """A process whose file name is taken (a finished trace of an earlier process
    with the same pid) writes ``<name>.1.pfw.zst``; the earlier trace is untouched."""
    script = write_script(tmp_path, """
        import os, socket, sys
        from dftrace._core.session import _safe_host
        base = f"{sys.argv[1]}/t-{_safe_host(socket.gethostname())}-{os.getpid()}"
        with open(base + ".pfw.zst", "wb") as fh:
            fh.write(b"an earlier trace")
        import dftrace
        from dftrace import ai
        dftrace.initialize(log_file=sys.argv[1] + "/t", inherit=False)
        for i in range(int(sys.argv[2])):
            with ai.compute.forward:
                pass
        print(os.getpid())
    """)
    out = _run([script, str(tmp_path), "10"], {})
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout)
    base = f"{tmp_path}/t-{_safe_host(socket.gethostname())}-{pid}"
    assert open(base + ".pfw.zst", "rb").read() == b"an earlier trace"
    assert len(spans(testing.read_events(base + ".1.pfw.zst"), "forward")) == 10


NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def test_pid_reuse_keeps_both_traces(tmp_path):
    """Two processes that really get the same pid (set through ns_last_pid): 1,000
    spans of the first and 10 of the second, each in its own file."""
    if not os.access(NS_LAST_PID, os.W_OK):
        pytest.skip("ns_last_pid is not writable here")
    script = write_script(tmp_path, REUSE)
    pids = []
    for n in (1000, 10):
        for _ in range(20):  # another process may take the pid first: try again
            target = pids[0] if pids else None
            if target is not None:
                with open(NS_LAST_PID, "w") as fh:
                    fh.write(str(target - 1))
            out = _run([script, str(tmp_path), str(n)], {})
            assert out.returncode == 0, out.stderr
            pid = int(out.stdout)
            if target is None or pid == target:
                pids.append(pid)
                break
            shutil.rmtree(tmp_path / "junk", ignore_errors=True)
            for p in files(tmp_path):
                if f"-{pid}." in p:
                    os.remove(p)
        else:
            pytest.skip("could not get the same pid twice")
    counts = sorted(len(spans(testing.read_events(p), "forward")) for p in files(tmp_path))
    assert counts == [10, 1000]


def test_log_directory_deleted_mid_run_warns_with_the_count(tmp_path):
    """The log directory disappears while the program runs: a warning with the
    number of events lost, and the count in all at the end; the program ends normally."""
    script = write_script(tmp_path, """
        import shutil, sys, time
        import dftrace
        from dftrace import ai
        s = dftrace.initialize(log_file=sys.argv[1] + "/logs/t", flush_interval=0.05)
        for i in range(1000):
            with ai.compute.forward:
                pass
        time.sleep(0.5)  # written
        shutil.rmtree(sys.argv[1] + "/logs")
        for i in range(500):
            with ai.compute.forward:
                pass
        time.sleep(0.5)
        print("done")
    """)
    out = _run([script, str(tmp_path)], {})
    assert out.returncode == 0, out.stderr
    err = out.stderr.decode()
    assert err.count("dftrace:") == 2, err
    assert "was deleted while the run went on" in err
    assert "events could not be written to" in err
    lost = int(err.split("was deleted while the run went on: ")[1].split()[0])
    assert lost >= 1000  # the spans and the metadata written to the file


def test_children_that_exec_leave_no_file(tmp_path):
    """subprocess with preexec_fn forks (the fork hook runs) and then execs: no file
    of the forked child is left, only the parent's. A forked child that records
    nothing leaves none either."""
    script = write_script(tmp_path, """
        import os, subprocess, sys
        import dftrace
        from dftrace import ai
        dftrace.initialize(log_file=sys.argv[1] + "/t", inherit=False)
        with ai.pipeline.train:
            for _ in range(3):
                subprocess.run(["true"], preexec_fn=lambda: None, check=True)
            pid = os.fork()
            if pid == 0:
                dftrace.finalize()
                os._exit(0)
            os.waitpid(pid, 0)
    """)
    out = _run([script, str(tmp_path)], {})
    assert out.returncode == 0, out.stderr
    (path,) = files(tmp_path)
    assert [e["name"] for e in spans(testing.read_events(path))] == ["train"]


def test_spans_never_stopped_are_capped_and_counted(tmp_path):
    """300,000 start() calls never stopped: one warning; 100,000 (the default cap)
    are written as incomplete at the end, the other 200,000 are counted in a
    ``dropped`` line (reason "open spans"); memory stays bounded."""
    script = write_script(tmp_path, """
        import resource, sys
        import dftrace
        from dftrace import ai
        dftrace.initialize(log_file=sys.argv[1] + "/t", inherit=False)
        for i in range(300_000):
            ai.compute.step.start()
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    """)
    out = _run([script, str(tmp_path)], {}, timeout=120)
    assert out.returncode == 0, out.stderr
    err = out.stderr.decode()
    assert err.count("dftrace:") == 1 and "100000 spans started with start()" in err, err
    (path,) = files(tmp_path)
    assert_valid([path])
    events = testing.read_events(path)
    steps = spans(events, "step")
    assert len(steps) == 100_000 and all(e["args"]["incomplete"] for e in steps)
    (dropped,) = meta(events, "dropped")
    assert dropped["args"] == {"count": 200_000, "reason": "open spans"}


def _torn_copy(tmp_path, compression: str) -> tuple[str, int, int]:
    """A trace as a kill in the middle of a write leaves it: whole frames, then half
    a frame (no ``]``). Returns (path, bytes of the whole frames, events in them)."""
    from dftrace import ai

    src = tmp_path / "src"
    with testing.trace_to(src) as t:
        for i in range(50):
            with ai.compute.forward(args={"i": i}):
                pass
    (path,) = t.paths
    lines = open(path, "rb").read().splitlines(keepends=True)
    assert lines[-1] == b"]\n"
    whole, cut = b"".join(lines[:-1]), b'{"name":"x","ph":"M","pid":1,"tid":1}\n' * 5000
    if compression == "zstd":
        import zstandard

        pack = zstandard.ZstdCompressor().compress
    else:
        import gzip

        pack = gzip.compress
    head = pack(whole)
    torn = str(tmp_path / os.path.basename(path)) + (".zst" if compression == "zstd" else ".gz")
    with open(torn, "wb") as fh:
        fh.write(head + pack(cut)[:-40])
    return torn, len(head), len(lines) - 2


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_torn_tail_validates_with_a_report_and_fails_only_when_strict(tmp_path, compression):
    """``dftrace validate`` on a file whose last frame was cut: exit 0 and 'cut off
    at byte N in the frame that starts at byte M, K events readable', N where the
    file was cut; with --strict, exit 1."""
    torn, size, events = _torn_copy(tmp_path, compression)
    cli = [sys.executable, "-m", "dftrace", "validate"]
    out = subprocess.run([*cli, torn], capture_output=True, text=True, env=clean_env())
    assert out.returncode == 0, out.stdout + out.stderr
    readable = len(testing.read_events(torn, strict=False))  # includes the cut frame's whole lines
    assert readable >= events
    cut_at = os.path.getsize(torn)  # where the file ends, inside the frame that starts at `size`
    assert f"cut off at byte {cut_at} in the frame that starts at byte {size}, {readable} events readable" \
        in out.stdout
    strict = subprocess.run([*cli, "--strict", torn], capture_output=True, text=True,
                            env=clean_env())
    assert strict.returncode == 1 and "cut off" in strict.stdout


def test_which_readers_read_a_torn_file(tmp_path):
    """What docs/reliability.md says about readers of a file cut mid-frame."""
    import gzip

    import zstandard

    torn, size, events = _torn_copy(tmp_path / "z", "zstd")
    # ours: every whole event, and a last line saying where the cut is
    assert len(testing.read_events(torn, strict=False)) >= events
    # zstandard's streaming reader: the whole frames, silently (no error, no notice)
    with open(torn, "rb") as fh:
        data = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True).read()
    assert data.count(b"\n") == events + 1  # +1: the "[" line
    # the zstd command: writes the whole frames, then fails
    if shutil.which("zstd"):
        z = subprocess.run(["zstd", "-dc", torn], capture_output=True)
        assert z.returncode != 0 and z.stdout.count(b"\n") >= events + 1
    gz, _, gz_events = _torn_copy(tmp_path / "g", "gzip")
    # Python's gzip module: refuses the whole file
    with pytest.raises(EOFError):
        gzip.open(gz).read()
    # gzip -dc: writes the whole members, then fails
    if shutil.which("gzip"):
        g = subprocess.run(["gzip", "-dc", gz], capture_output=True)
        assert g.returncode != 0 and g.stdout.count(b"\n") >= gz_events + 1
