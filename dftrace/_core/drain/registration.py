"""Finding the drainer of ``writer="process"`` and handing it this process's ring.

A drainer is looked for where the environment recorded one (``DFTRACE_DRAINER``,
``NAME:PID``, inherited by child processes), then under the job's name (one drainer
per job and host), and else started by this process. Who answers is checked before
anything is sent: the socket's abstract name could be bound by any local user, so
the peer's kernel credentials (``SO_PEERCRED``) must name this user and, when
known, the drainer's pid. The registration message carries the memfd of the ring
(see :mod:`.process_writer`) as ancillary data; the drainer answers ``k`` + its pid.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
from typing import Any

__all__ = ["DrainerUnavailable", "ENV_VAR", "MAX_ANSWER", "installed_module_argv", "register",
           "reap"]

#: The drainer's socket name and pid (``NAME:PID``), inherited by child processes.
ENV_VAR = "DFTRACE_DRAINER"
#: How long initialize waits for a drainer it started to accept the ring.
START_TIMEOUT_S = 5.0
#: How long a running drainer (the job's, or the one recorded in DFTRACE_DRAINER)
#: has to accept the ring; one that does not (held by storage that hangs) is
#: passed over for a drainer of this process's own.
REGISTER_TIMEOUT_S = 2.0
#: The largest answer accepted from the drainer.
MAX_ANSWER = 1 << 20

_started: list[subprocess.Popen] = []  # drainers this process started (reaped when done)


class DrainerUnavailable(Exception):
    """Shared memory or a drainer process cannot be had here (``platform``: this
    platform or build has no shared ring at all)."""

    def __init__(self, message: str, platform: bool = False):
        # platform: this platform, build or process cannot have a shared ring at all
        # (the default writer then falls back without a word).
        super().__init__(message)
        self.platform = platform


class _Impostor(ConnectionError):
    """The process answering at the drainer's name is not this user's drainer."""


def _connect(name: str, pid: int | None) -> tuple[socket.socket, int]:
    """Connect to the drainer named ``name`` and check who answers: a process of
    this user (and process ``pid`` when given). Returns the socket and its pid."""
    from .drainer import peer_of

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect("\0" + name)
        peer_pid, peer_uid = peer_of(sock)
        if peer_uid != os.geteuid():
            raise _Impostor(f"the socket {name!r} is held by uid {peer_uid}")
        if pid is not None and peer_pid != pid:
            raise _Impostor(f"the socket {name!r} is held by pid {peer_pid}, not {pid}")
    except OSError:
        sock.close()
        raise
    return sock, peer_pid


#: Variables naming the job a process belongs to: processes of one job that are not
#: each other's children (torchrun ranks, srun tasks) share a drainer through them.
_JOB_VARS = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID")


def _job_name() -> str:
    """The drainer name of this job on this host ("" when no launcher names the job)."""
    import hashlib

    for var in _JOB_VARS:
        job = os.environ.get(var, "").strip()
        if job:
            digest = hashlib.blake2b(f"{var}={job}".encode(), digest_size=8).hexdigest()
            return f"dftrace-drainer-{os.geteuid()}-{digest}"
    return ""


#: Runs a module of the dftrace this process imported, whatever the working directory
#: holds: ``python -m`` would put the working directory first on ``sys.path``, so a
#: directory holding a ``dftrace`` folder (a clone) would run that one instead.
_RUN_INSTALLED = (
    "import os, runpy, sys\n"
    "if sys.path and sys.path[0] in ('', os.getcwd()): del sys.path[0]\n"
    "sys.path.insert(0, sys.argv.pop(1))\n"
    "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)\n")


def installed_module_argv(module: str, *args: str) -> list[str]:
    """The command that runs ``module`` of this very dftrace installation with ``args``."""
    here = os.path.abspath(__file__)  # <root>/dftrace/_core/drain/registration.py
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here))))
    return [sys.executable, "-c", _RUN_INSTALLED, root, module, *args]


def _recorded() -> tuple[str, int] | None:
    """The drainer recorded in the environment (``NAME:PID``), None when none is
    (a value of another form is removed)."""
    value = os.environ.get(ENV_VAR, "")
    name, _, pid = value.rpartition(":")
    if (name.startswith("dftrace-drainer-") and len(name) < 100 and pid.isascii()
            and pid.isdigit() and 0 < int(pid) < 1 << 31
            and all(c.isascii() and (c.isalnum() or c == "-") for c in name)):
        return name, int(pid)
    os.environ.pop(ENV_VAR, None)
    return None


def _start_drainer(name: str) -> subprocess.Popen:
    """Start a drainer in a session of its own (a Ctrl-C or a SIGTERM sent to the
    job's process group does not end it before it has written its producers' files).
    When another process of the job started one of the same name first, this one
    exits at once and the other answers."""
    env = dict(os.environ)
    env["DFTRACE_ENABLE"] = "0"  # the drainer itself is never traced
    env.pop(ENV_VAR, None)
    try:
        proc = subprocess.Popen(
            installed_module_argv("dftrace._core.drain.drainer", name, str(os.getpid())),
            # No standard stream of the job: a launcher reading the job's output must
            # not wait for the drainer (which may be held by hung storage). Failures
            # reach the producer in the answer to its finalize.
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        raise DrainerUnavailable(f"cannot start the drainer: {exc}") from None
    _started.append(proc)
    return proc


def reap() -> None:
    for proc in list(_started):
        if proc.poll() is not None:
            _started.remove(proc)


def _own_umask() -> int:
    """This process's umask (read without changing it where /proc tells it)."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8) & 0o777
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask & 0o777


#: How long the rest of the registration's answer may take once its first byte came
#: (a drainer sends it whole): a peer that stops half-way is no drainer.
ANSWER_REST_S = 0.1


def _handshake(sock: socket.socket, peer_pid: int, payload: bytes, fd: int,
               deadline: float) -> None:
    """Hand the ring over and check the answer: exactly ``k`` + the drainer's pid.
    A wrong byte ends the wait at once: only silence (a drainer held by its storage
    accepts nothing) waits until ``deadline``."""
    expected = b"k" + str(peer_pid).encode()
    sock.settimeout(max(0.1, deadline - time.monotonic()))
    socket.send_fds(sock, [payload], [fd])
    reply = b""
    while len(reply) < len(expected):
        try:
            more = sock.recv(len(expected) - len(reply))
        except TimeoutError:
            if not reply:
                raise
            more = b""
        if not more or not expected.startswith(reply + more):
            reply += more
            raise _ProtocolError(f"the drainer answered {reply[:32]!r} to the registration")
        reply += more
        sock.settimeout(ANSWER_REST_S)
    sock.settimeout(None)


def register(session: Any, fd: int) -> tuple[socket.socket, int]:
    """Connect to the job's drainer (starting one when there is none) and hand it
    the ring. Returns the socket and the drainer's pid."""
    enc = session.encoder
    cfg = session.config
    msg = json.dumps({
        "pid": session.pid, "base": session.base, "compression": cfg.compression,
        "level": cfg.compression_level, "max_size": cfg.max_file_size,
        "flush_interval": cfg.flush_interval, "batch_size": cfg.batch_size,
        "pid_piece": enc.pid_piece.decode("latin-1"),
        "hh_piece": enc.hh_piece.decode("latin-1"), "offset_ns": enc.offset_ns,
        "min_id": enc.min_id, "hhash": session.hhash, "umask": _own_umask(),
        "header": session.sink.header().decode("latin-1"),
    }).encode()
    payload = struct.pack("<I", len(msg)) + msg
    problems: list[str] = []

    def attempt(name: str, pid: int | None, deadline: float) -> tuple[socket.socket, int] | bool:
        """The registered socket and the drainer's pid; False when nobody listens
        at ``name``; True when something answered that is not our drainer (another
        user, another pid, an answer of another protocol)."""
        try:
            sock, peer_pid = _connect(name, pid)
        except (ConnectionRefusedError, FileNotFoundError) as exc:
            problems.append(str(exc))
            return False
        except OSError as exc:
            problems.append(str(exc))
            return True
        try:
            _handshake(sock, peer_pid, payload, fd, deadline)
        except (OSError, _ProtocolError) as exc:
            problems.append(str(exc) or type(exc).__name__)
            sock.close()
            return True
        os.environ[ENV_VAR] = f"{name}:{peer_pid}"
        return sock, peer_pid

    recorded = _recorded()
    if recorded is not None:
        got = attempt(*recorded, time.monotonic() + REGISTER_TIMEOUT_S)
        if not isinstance(got, bool):
            return got
        os.environ.pop(ENV_VAR, None)  # gone, or not ours: children must not use it
    job = _job_name()
    got = attempt(job, None, time.monotonic() + REGISTER_TIMEOUT_S) if job else False
    if not isinstance(got, bool):
        return got
    # Start one: under the job's name when nobody holds it (another rank may win the
    # race to bind it: any process of this user answering there is the job's
    # drainer); a private one when there is no job, or something that is not this
    # user's drainer holds the job's name.
    private = not job or got is True
    name = f"dftrace-drainer-{os.getpid()}-{os.urandom(6).hex()}" if private else job
    proc = _start_drainer(name)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        # A private drainer must be the very process started.
        got = attempt(name, proc.pid if private else None, deadline)
        if not isinstance(got, bool):
            return got
        if got or (private and proc.poll() is not None):
            break
        time.sleep(0.01)
    raise DrainerUnavailable(f"no drainer answered ({problems[-1] if problems else 'timeout'})")



class _ProtocolError(Exception):
    """The drainer answered something that is not an answer of the protocol."""


class _Rejected(_ProtocolError):
    """The drainer stopped serving this process (its ring was found inconsistent)."""
