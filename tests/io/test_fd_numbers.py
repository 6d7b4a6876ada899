"""The fd table against what the program did with its fd numbers: a directory listed
through a copy of its fd (os.listdir(fd), os.scandir(fd), shutil.rmtree), whose copy
libc closes inside closedir, then a pipe given the same number; directories opened
and closed by os.scandir(path); and writes on an O_APPEND fd, which go to the file's
end wherever its position was."""

from __future__ import annotations

import os

from _io_util import NEEDS_IO, READS, START, WRITES, IOTrace, run_traced

pytestmark = NEEDS_IO

#: A directory listed by fd, twice (listdir, scandir): each time CPython copies the
#: fd (fcntl F_DUPFD_CLOEXEC) and closedir closes the copy; then pipes, a socket pair
#: and a file's bytes, each fd number checked against the copies'.
LISTED_BY_FD = START + """
    import socket
    listed = os.path.join(data, "listed")
    os.makedirs(listed, exist_ok=True)
    for i in range(3):
        data_file(os.path.join("listed", f"{i}.bin"), b"l" * 10)
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    fd = os.open(listed, os.O_RDONLY)
    names = os.listdir(fd)
    entries = [e.name for e in os.scandir(fd)]
    os.close(fd)
    with os.scandir(listed) as it:                       # opendir(path) ... closedir
        by_path = sorted(e.name for e in it)
    missing = os.path.join(data, "missing")
    try:                                                 # a probe of a directory not there
        os.listdir(missing)
    except FileNotFoundError:
        pass
    r, w = os.pipe()
    os.write(w, b"x" * 1000)
    got = len(os.read(r, 1000))
    a, b = socket.socketpair()
    a.sendall(b"y" * 500)
    got += len(b.recv(500))
    read = len(open(os.path.join(listed, "0.bin"), "rb").read())
    print(json.dumps({"listed": listed, "missing": missing, "names": len(names) + len(entries) + len(by_path),
                      "pipe_and_socket": got, "read": read, "fds": [r, w, a.fileno(), b.fileno()]}))
"""


def test_a_listed_directorys_fd_number_is_not_its_next_owner(tmp_path, monkeypatch):
    """A pipe or socket given the number of a directory fd's copy that libc closed
    in closedir moves no bytes of the directory's: the directory has none, and its
    opens (opendir) and closes (closedir) are its metadata calls; an opendir of a
    directory that is not there is none."""
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, LISTED_BY_FD)
    assert truth["names"] == 9 and truth["pipe_and_socket"] == 1500
    trace = IOTrace(tmp_path / "trace")
    listed = truth["listed"]
    assert trace.bytes(listed, READS | WRITES) == 0, trace.calls(listed)
    calls = trace.calls(listed)
    assert calls["opendir"] == 1 and calls["closedir"] == 3  # scandir(path)'s, and the fd copies'
    assert trace.bytes(os.path.join(listed, "0.bin"), READS) == truth["read"] == 10
    # a directory that is not there is no listing (libraries probe many: torch's import)
    assert trace.of(truth["missing"]) == []
    # the one file read is all that moved bytes: the pipe's and the socket's are no file's
    moved = sum(e["args"]["ret"] for e in trace.events if e["name"] in READS | WRITES and e["args"]["ret"] > 0)
    assert moved == truth["read"]


#: Writes on an O_APPEND fd (at the file's end, 10 bytes long), a seek to its start,
#: a write (at the end all the same) and a pwrite at 0 (at the end: Linux); Python's
#: append mode; append mode switched on and off by fcntl(F_SETFL) on a plain fd, with
#: a seek after it.
APPENDED = START + """
    import fcntl
    log = data_file("app.log", b"1" * 10)
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    fd = os.open(log, os.O_RDWR | os.O_APPEND)
    os.write(fd, b"2" * 20)
    os.write(fd, b"3" * 30)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, b"4" * 5)
    os.pwrite(fd, b"5" * 5, 0)
    os.close(fd)
    with open(log, "ab", buffering=0) as f:
        f.write(b"6" * 30)
    fd = os.open(log, os.O_WRONLY)
    fcntl.fcntl(fd, fcntl.F_SETFL, os.O_APPEND)
    os.write(fd, b"7" * 10)
    fcntl.fcntl(fd, fcntl.F_SETFL, 0)
    os.write(fd, b"8" * 10)  # where the append left the position: not known here
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, b"9" * 10)
    os.close(fd)
    size = os.path.getsize(log)
    os.truncate(log, 50)
    print(json.dumps({"log": log, "size": size}))
"""


def test_writes_on_an_append_fd_have_no_made_up_offset(tmp_path, monkeypatch):
    """A write in append mode lands at the file's end, which the tracer does not know
    (another process may have written there): its offset is unknown (left out), not
    the fd's position counted from 0 or set by a seek (Python's append mode seeks to
    the end as it opens), nor a pwrite's (Linux appends it). Append mode switched off
    leaves the position unknown until a seek."""
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, APPENDED)
    assert truth["size"] == 120
    trace = IOTrace(tmp_path / "trace")
    calls = [(e["name"], e["args"].get("offset"), e["args"]["ret"]) for e in sorted(trace.of(truth["log"]),
                                                                                    key=lambda e: e["ts"])
             if e["name"] in READS | WRITES]
    # an unknown offset is left out of the event's args
    assert calls == [("write", None, 20), ("write", None, 30), ("write", None, 5), ("pwrite", None, 5),
                     ("write", None, 30), ("write", None, 10), ("write", None, 10), ("write", 0, 10)]
    # os.truncate(path): a call on the path, the length it set as its offset (as ftruncate's)
    assert [e["args"].get("offset") for e in trace.of(truth["log"]) if e["name"] == "truncate"] == [50]
