"""writer="process" on a shared node: what another local user, or a process that
does not follow the protocol, can do to a traced job, and what it gets.

Tests marked ``two_users`` play the other user for real: run as root (as CI does),
they create a second user with ``useradd`` and run the attacker's code as that
user; otherwise they are skipped. See docs/reliability.md, "Shared nodes".
"""

from __future__ import annotations

import json
import mmap
import os
import pwd
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
import textwrap
import uuid

import pytest
from _requirements import native_engine_missing, needs_marks

from dftrace import testing
from dftrace._core import engine as _engine
from dftrace._core.session import _safe_host

from ._ring_tamper import F_IO, HDR, REC0, REC0_ALEN, REC0_AOFF, REC_LAYOUT, SLOT_N
from ._util import assert_valid, clean_env, files, spans, write_script

#: The tests of the shared-memory ring and its drainer.
RING_MARKS = [*needs_marks("native", native_engine_missing()),
              pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="writer='process' needs Linux (memfd)")]


def needs_ring(test):
    """The test needs the C engine's shared-memory ring (Linux)."""
    for mark in RING_MARKS:
        test = mark(test)
    return test

#: The second user this run makes (and removes): one name a run, so that runs side by
#: side (CI's stages, two checkouts) never share or delete each other's user.
OTHER_USER = f"dftrace-other-{os.getpid()}"


def _remove_user(name: str) -> None:
    subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
    subprocess.run([shutil.which("userdel") or "userdel", name], capture_output=True)


def _remove_users_of_ended_runs() -> None:
    """Removes the second users of earlier runs that were killed before they could."""
    for pw in pwd.getpwall():
        prefix, _, pid = pw.pw_name.rpartition("-")
        if prefix == "dftrace-other" and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _remove_user(pw.pw_name)


@pytest.fixture(scope="module")
def other_user() -> Iterator[tuple[int, int, str]]:
    """(uid, gid, python) of a second user of this machine, and an interpreter it
    can run. Created with useradd (root only), and removed again, with whatever it
    still runs, when the module's tests are done."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test creates a second user (useradd) to play another "
                    "user of a shared node; CI runs it as root")
    useradd = shutil.which("useradd")
    if useradd is None:
        pytest.skip("no useradd to create a second user")
    _remove_users_of_ended_runs()
    out = subprocess.run([useradd, "--system", "--no-create-home", "--shell",
                          "/usr/sbin/nologin", OTHER_USER], capture_output=True, text=True)
    if out.returncode:
        pytest.skip(f"useradd {OTHER_USER} failed: {out.stderr.strip()}")
    try:
        pw = pwd.getpwnam(OTHER_USER)
        yield pw.pw_uid, pw.pw_gid, _python_for(pw)
    finally:
        _remove_user(OTHER_USER)


def _python_for(pw: pwd.struct_passwd) -> str:
    """An interpreter the user ``pw`` may run (skips the test when there is none)."""
    for python in dict.fromkeys([sys.executable, "/usr/bin/python3", shutil.which("python3")]):
        try:
            if python and subprocess.run([python, "-I", "-c", "pass"], user=pw.pw_uid,
                                         group=pw.pw_gid, extra_groups=[], cwd="/",
                                         capture_output=True).returncode == 0:
                return python
        except OSError:  # not executable by that user
            continue
    pytest.skip(f"no Python interpreter that {OTHER_USER} may run")


def as_other(user: tuple[int, int, str], code: str, *args: str) -> subprocess.Popen:
    """Run ``code`` as the other user (stdin, stdout and stderr piped)."""
    uid, gid, python = user
    return subprocess.Popen([python, "-I", "-c", textwrap.dedent(code), *args], user=uid,
                            group=gid, extra_groups=[], cwd="/", stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"PATH": "/usr/bin:/bin"})


@pytest.fixture
def shared_dir():
    """A directory every user may write, sticky, like /tmp."""
    d = tempfile.mkdtemp(prefix="dftrace-shared-", dir="/tmp")
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


#: How a program holding a drainer's socket name starts: it listens on that name
#: (``sys.argv[1]``), then says it is ready.
HOLD_NAME = """
    import json, os, select, socket, struct, sys
    name = sys.argv[1]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\\0" + name)
    listener.listen(16)
    print("ready", flush=True)
"""

#: Another user's process holding a drainer's socket name: it answers as a drainer
#: would (as process ``sys.argv[2]``) and reports what reached it when its stdin closes.
SQUATTER = HOLD_NAME + """
    pid = sys.argv[2]
    got = {"connections": 0, "bytes": 0, "fds": 0}
    conns = []
    while True:
        ready, _, _ = select.select([listener, sys.stdin, *conns], [], [], 30)
        if sys.stdin in ready or not ready:
            break
        for c in ready:
            if c is listener:
                conn, _ = listener.accept()
                got["connections"] += 1
                conns.append(conn)
                try:
                    conn.sendall(b"k" + pid.encode())
                except OSError:
                    pass
                continue
            try:
                msg, fds, _, _ = socket.recv_fds(c, 1 << 20, 4)
            except OSError:
                msg, fds = b"", []
            got["bytes"] += len(msg)
            got["fds"] += len(fds)
            if not msg:
                conns.remove(c)
                c.close()
    print(json.dumps(got), flush=True)
"""

VICTIM = """
    import os, sys
    import dftrace
    from dftrace import ai
    secret = sys.argv[2]
    s = dftrace.initialize(log_file=sys.argv[1], writer="process")
    for i in range(int(sys.argv[3])):
        with ai.compute.forward(args={"i": i, "token": secret}):
            pass
    print(os.environ.get("DFTRACE_DRAINER", ""), flush=True)
    dftrace.finalize()
"""


def _job_drainer_name(job: str) -> str:
    from dftrace._core.drain import registration

    saved = {v: os.environ.pop(v, None) for v in registration._JOB_VARS}
    os.environ["TORCHELASTIC_RUN_ID"] = job
    try:
        return registration._job_name()
    finally:
        os.environ.pop("TORCHELASTIC_RUN_ID")
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v


@needs_ring
@pytest.mark.needs("second-user")
@pytest.mark.parametrize("how", ["job-name", "recorded-name", "recorded-name-and-pid"])
def test_another_user_holding_the_drainer_name_gets_nothing(tmp_path, other_user, how):
    """Another user binds the drainer's name first: the job's name (computable from
    the launcher's job id) or the name left in DFTRACE_DRAINER (a drainer that
    died, its name taken over; the name alone as earlier versions recorded it, or
    with the pid, here the squatter's own). The traced process sends it nothing
    (no registration, no ring), writes its complete trace through a drainer of its
    own, and its children are not sent to the squatter."""
    job = f"job-{uuid.uuid4().hex}"
    name = _job_drainer_name(job) if how == "job-name" else f"dftrace-drainer-{uuid.uuid4().hex[:12]}"
    squatter = as_other(other_user, SQUATTER, name, "1")
    try:
        assert squatter.stdout.readline().strip() == "ready", squatter.stderr.read()
        env = {"job-name": {"TORCHELASTIC_RUN_ID": job},
               "recorded-name": {"DFTRACE_DRAINER": name},
               "recorded-name-and-pid": {"DFTRACE_DRAINER": f"{name}:{squatter.pid}"}}[how]
        secret = uuid.uuid4().hex
        script = write_script(tmp_path, VICTIM)
        out = subprocess.run([sys.executable, script, str(tmp_path / "t" / "t"), secret, "3000"],
                             capture_output=True, text=True, timeout=120, env=clean_env(**env))
        squatter.stdin.close()
        got = json.loads(squatter.stdout.readline())
    finally:
        squatter.kill()
        squatter.wait()
    assert got["bytes"] == 0 and got["fds"] == 0, got
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "dftrace:" not in out.stderr, out.stderr
    recorded = out.stdout.split()[0]
    assert not recorded.startswith(name + ":")  # what children inherit is its own drainer
    (path,) = files(tmp_path / "t")
    assert_valid([path])
    assert len(spans(testing.read_events(path), "forward")) == 3000


#: A process of this user holding the job's drainer name (so that it passes the
#: credential checks), answering ``sys.argv[2]``'s way; it never reads the ring.
FAKE_DRAINER = HOLD_NAME + """
    mode = sys.argv[2]
    conn, _ = listener.accept()
    msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
    if mode == "registration":
        conn.sendall(b"k" + b"not-a-pid")
    else:
        conn.sendall(b"k" + str(os.getpid()).encode())
    buf = b""
    while True:
        data = conn.recv(65536)
        if not data:
            break
        buf += data
        while buf[:1] in (b"w", b"s") or (buf[:1] == b"f" and len(buf) >= 5
                                           and len(buf) >= 5 + struct.unpack("<I", buf[1:5])[0]):
            kind = buf[:1]
            buf = buf[1:] if kind != b"f" else buf[5 + struct.unpack("<I", buf[1:5])[0]:]
            if kind == b"w":
                continue
            if mode == "unknown":
                conn.sendall(b"Zzz")
            elif kind == b"s":  # a flush answered as the protocol says
                conn.sendall(b"y" + struct.pack("<Q", 0))
            else:
                body = b"{not json" if mode == "json" else json.dumps(
                    {"paths": 5, "lost": "many", "failed": None, "written": -1}).encode()
                conn.sendall(b"d" + struct.pack("<I", len(body)) + body)
"""


@needs_ring
@pytest.mark.parametrize("mode", ["registration", "json", "fields", "unknown"])
def test_a_drainer_answering_nonsense_raises_nothing_and_loses_nothing(tmp_path, mode):
    """Whatever the process at the job's drainer name answers (a registration reply
    that is not ``k`` + its pid, an account of the file that is not JSON or has
    wrong fields, bytes of no answer), the program sees no
    exception, its exit status is its own, and every span is in its trace
    (written by a drainer of its own, or by itself with one warning)."""
    job = f"job-{uuid.uuid4().hex}"
    name = _job_drainer_name(job)
    fake = subprocess.Popen([sys.executable, "-c", textwrap.dedent(FAKE_DRAINER), name, mode],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert fake.stdout.readline().strip() == "ready"
        script = write_script(tmp_path, """
            import sys
            import dftrace
            from dftrace import ai
            dftrace.initialize(log_file=sys.argv[1], writer="process")
            for i in range(3000):
                with ai.compute.forward(args={"i": i}):
                    pass
            dftrace.session().writer.flush()
            for i in range(3000, 5000):
                with ai.compute.forward(args={"i": i}):
                    pass
        """)
        out = subprocess.run([sys.executable, script, str(tmp_path / "t" / "t")],
                             capture_output=True, text=True, timeout=120,
                             env=clean_env(TORCHELASTIC_RUN_ID=job))
    finally:
        fake.kill()
        fake.wait()
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("dftrace:") == (0 if mode == "registration" else 1), out.stderr
    paths = files(tmp_path / "t")
    assert_valid(paths)
    got = sorted(e["args"]["i"] for e in spans(testing.read_events(tmp_path / "t"), "forward"))
    assert got == list(range(5000))


# -- the ring ---------------------------------------------------------------------------

@needs_ring
def test_the_producer_never_reads_addresses_from_the_ring(tmp_path):
    """The ring's header, rewritten while the process records (as anything holding
    the ring could), changes nothing: the process keeps its own layout, records
    every span, and the drainer writes them all."""
    script = write_script(tmp_path, """
        import struct, sys
        import dftrace
        from dftrace import ai
        from _ring_tamper import rewrite_header
        s = dftrace.initialize(log_file=sys.argv[1], writer="process")
        for i in range(5000):
            with ai.compute.forward(args={"i": i}):
                pass
        rewrite_header(s.writer._mm)
        for i in range(5000, 30000):  # more slots taken, and a kind not seen before
            with ai.compute.backward(args={"i": i}):
                pass
    """)
    out = subprocess.run([sys.executable, script, str(tmp_path / "t" / "t")], capture_output=True,
                         text=True, timeout=120, env=clean_env())
    assert out.returncode == 0, out.stderr
    assert "dftrace:" not in out.stderr, out.stderr
    (path,) = files(tmp_path / "t")
    assert_valid([path])
    events = testing.read_events(path)
    assert len(spans(events, "forward")) == 5000
    assert len(spans(events, "backward")) == 25000


@needs_ring
def test_a_hostile_ring_is_dropped_and_the_drainer_serves_the_others(tmp_path):
    """A producer sharing the job's drainer rewrites its ring (the header's layout,
    a slot's record count, a record's args offset and length): the drainer drops
    that producer and goes on serving the others, whose traces are complete."""
    job = f"job-{uuid.uuid4().hex}"
    honest = write_script(tmp_path, """
        import sys
        import dftrace
        from dftrace import ai
        s = dftrace.initialize(log_file=sys.argv[1], writer="process", flush_interval=0.05)
        for i in range(2000):
            with ai.compute.forward(args={"i": i}):
                pass
        s.writer.flush()
        print(s.writer.drainer_pid, flush=True)
        sys.stdin.readline()
        for i in range(2000, 4000):
            with ai.compute.forward(args={"i": i}):
                pass
        s.writer.flush()
        print(s.writer.drainer_pid, flush=True)
    """, "honest.py")
    hostile = write_script(tmp_path, """
        import struct, sys
        import dftrace
        from dftrace import ai
        from dftrace._core import _speedups as sp
        from _ring_tamper import corrupt_first_slot, rewrite_header
        s = dftrace.initialize(log_file=sys.argv[1], writer="process", flush_interval=60)
        for i in range(5000):  # the first slot is sealed
            with ai.compute.forward:
                pass
        rewrite_header(s.writer._mm)
        corrupt_first_slot(s.writer._mm, sp.SHM_FIXED_BYTES)
        s.writer.flush()
        print(s.writer.drainer_pid, flush=True)
    """, "hostile.py")
    env = clean_env(TORCHELASTIC_RUN_ID=job)
    a = subprocess.Popen([sys.executable, honest, str(tmp_path / "honest" / "t")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    drainer = int(a.stdout.readline())
    b = subprocess.run([sys.executable, hostile, str(tmp_path / "hostile" / "t")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert b.returncode == 0, b.stderr
    assert "Traceback" not in b.stderr, b.stderr
    assert f"the trace drainer (pid {drainer}) dropped this process's ring" in b.stderr
    assert int(b.stdout) == drainer
    out, err = a.communicate("\n", timeout=120)
    assert a.returncode == 0, err
    assert int(out) == drainer
    assert "dftrace:" not in err, err  # the honest process never lost its drainer
    (path,) = files(tmp_path / "honest")
    assert_valid([path])
    got = [e["args"]["i"] for e in spans(testing.read_events(path), "forward")]
    assert got == list(range(4000))


@needs_ring
def test_the_drainer_refuses_a_ring_whose_size_is_not_sealed():
    """A memfd its producer could still shrink under the drainer's mapping (SIGBUS)
    is refused; a sealed one is taken."""
    import fcntl

    from dftrace._core.drain.drainer import _sealed_size

    fd = os.memfd_create("t", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 1 << 20)
        with pytest.raises(ValueError, match="not sealed"):
            _sealed_size(fd)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                    | fcntl.F_SEAL_SEAL)
        assert _sealed_size(fd) == 1 << 20
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 4096)
    finally:
        os.close(fd)


def _attached_ring() -> mmap.mmap:
    sp = _engine.speedups
    mm = mmap.mmap(-1, sp.SHM_FIXED_BYTES + 4 * sp.SHM_SLOT_BYTES)
    sp.shm_attach(mm, os.getpid(), b"", b"", 0, 0)
    return mm


@needs_ring
def test_a_reader_refuses_a_ring_whose_layout_does_not_fit():
    """Layouts pointing outside the region are refused at attach (RingError)."""
    sp = _engine.speedups
    for field, value in (("nslots", 0xFFFFFFFF), ("slots_off", 1 << 44), ("slot_size", 8),
                         ("kinds_cap", 1 << 40), ("open_off", 1 << 44), ("open_cap", 1 << 40)):
        mm = _attached_ring()
        try:
            sp.shm_detach()
            fmt = "<I" if field == "nslots" else "<Q"
            struct.pack_into(fmt, mm, HDR[field], value)
            with pytest.raises(sp.RingError):
                sp.ShmReader(mm)
        finally:
            mm.close()


@needs_ring
def test_a_reader_refuses_records_pointing_outside_their_slot():
    """A slot claiming more records than it holds, or a record whose args lie
    outside its slot: drain raises RingError (the drainer drops the producer), and
    reads nothing out of bounds."""
    sp = _engine.speedups
    for offset, value in ((SLOT_N, 0xFFFFFFFF), (REC0_AOFF, 0xFFFFFF00), (REC0_ALEN, 1 << 20)):
        mm = _attached_ring()
        try:
            assert sp.shm_append_line(b'{"x":1}\n')
            sp.shm_finish()
            sp.shm_detach()
            reader = sp.ShmReader(mm)
            struct.pack_into("<I", mm, sp.SHM_FIXED_BYTES + offset, value)
            with pytest.raises(sp.RingError):
                reader.drain(100, b"", b"", 0, 0, True)
            reader.close()
        finally:
            mm.close()


@needs_ring
def test_a_reader_writes_a_rewritten_open_span_table_as_lines_only():
    """A producer that fills its open-span table with random bytes before it dies:
    the drainer's reader writes at most one JSON line per slot, each one that parses,
    with no args but `incomplete`, and reads nothing out of bounds."""
    import orjson

    sp = _engine.speedups
    mm = _attached_ring()
    try:
        sp.shm_detach()
        reader = sp.ShmReader(mm)
        off = struct.unpack_from("<Q", mm, HDR["open_off"])[0]
        cap = struct.unpack_from("<Q", mm, HDR["open_cap"])[0]
        mm[off:off + cap * 64] = os.urandom(cap * 64)
        lines, n, _ = reader.open_spans(b',"pid":1,"tid":', b',"args":{"level":', 0, 0, 1 << 62)
        assert 0 < n <= cap
        for line in lines.splitlines():
            event = orjson.loads(line)
            assert set(event["args"]) <= {"level", "p_idx", "count", "incomplete"}
            assert event["args"]["incomplete"] is True
        reader.close()
    finally:
        mm.close()


@needs_ring
@pytest.mark.parametrize("alen", [0, 8, 24])
def test_a_reader_writes_a_forged_file_io_record_as_one_line(alen):
    """A record a producer marks as a file-I/O call, whose raw values are missing or
    shorter than a call's and whose errno bits are out of range: the reader writes
    one line that parses, with the call's values only where they were all there, and
    reads nothing out of bounds."""
    import orjson

    sp = _engine.speedups
    mm = _attached_ring()
    try:
        assert sp.shm_append_line(b'{"x":1}\n')  # a record with 8 bytes of args
        sp.shm_finish()
        sp.shm_detach()
        reader = sp.ShmReader(mm)
        struct.pack_into(REC_LAYOUT, mm, sp.SHM_FIXED_BYTES + REC0, 1_000, 3_000, 7, 0xDEADBEEF,
                         0, (F_IO << 24) | 0xFFFFFF, 42, 4096, 0, alen)
        data, n = reader.drain(100, b',"pid":1,"tid":', b',"ph":"X","args":{"hhash":"h","level":',
                               0, 0, True)
        (line,) = data.splitlines()
        event = orjson.loads(line)
        assert (n, event["id"], event["tid"], event["args"]["fhash"]) == (1, 7, 42, "00000000deadbeef")
        assert ("ret" in event["args"]) == (alen == 24)
        assert "level" not in event["args"] and "p_idx" not in event["args"]
        reader.close()
    finally:
        mm.close()


# -- trace files ------------------------------------------------------------------------

@pytest.mark.needs("second-user")
@pytest.mark.parametrize("writer", ["thread", pytest.param("process", marks=RING_MARKS)])
@pytest.mark.parametrize("reader", [True, False], ids=["read", "unread"])
def test_a_fifo_planted_by_another_user_gets_nothing(tmp_path, other_user, shared_dir,
                                                     writer, reader):
    """Another user creates a FIFO at the trace file's name in a shared sticky
    directory (read by them, or never read): the trace goes to the next free name,
    a regular file of the traced user's, complete; the FIFO gets no byte and
    nothing blocks on it."""
    script = write_script(tmp_path, """
        import os, sys
        import dftrace
        from dftrace import ai
        print(os.getpid(), flush=True)
        sys.stdin.readline()
        s = dftrace.initialize(log_file=sys.argv[1], writer=sys.argv[2])
        for i in range(2000):
            with ai.compute.forward(args={"i": i}):
                pass
        dftrace.finalize()
        print(*s.paths, flush=True)
    """)
    victim = subprocess.Popen([sys.executable, script, os.path.join(shared_dir, "t"), writer],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=clean_env())
    pid = int(victim.stdout.readline())
    fifo = os.path.join(shared_dir, f"t-{_safe_host(socket.gethostname())}-{pid}.pfw.zst")
    planter = as_other(other_user, """
        import os, select, sys
        os.mkfifo(sys.argv[1], 0o666)
        os.chmod(sys.argv[1], 0o666)
        fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK) if sys.argv[2] == "1" else None
        print("ready", flush=True)
        got = 0
        while True:
            watch = [sys.stdin] + ([fd] if fd is not None else [])
            ready, _, _ = select.select(watch, [], [], 60)
            if sys.stdin in ready or not ready:
                break
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            got += len(data)
            if not data:
                select.select([sys.stdin], [], [], 0.05)
        print(got, flush=True)
    """, fifo, "1" if reader else "0")
    try:
        assert planter.stdout.readline().strip() == "ready", planter.stderr.read()
        out, err = victim.communicate("\n", timeout=120)
        planter.stdin.close()
        got = int(planter.stdout.readline())
    finally:
        planter.kill()
        planter.wait()
        victim.kill()
    assert victim.returncode == 0, err
    assert got == 0
    (path,) = out.split()
    assert path != fifo and path.endswith(".1.pfw.zst")
    st = os.lstat(path)
    assert st.st_uid == os.geteuid() and not os.path.islink(path)
    assert_valid([path])
    assert len(spans(testing.read_events(path), "forward")) == 2000
