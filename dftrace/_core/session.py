"""A tracing session: what one process's trace is (its file's name and header, its
writer, its rank) and the facts of the process it records (host, command line,
versions). How a session starts and ends, in the process and its children, is
``lifecycle``."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import engine as _engine
from .state import STATE
from . import sampler as _sampler
from .drain import process_writer as _process_writer
from .drain.registration import DrainerUnavailable
from .clock_anchor import ANCHOR_ENV, anchor_value, job_anchor
from .config import DEFAULT_STEM, RANK_MAX, Config, ConfigError
from .ranks import detect_rank
from .records import META, Encoder
from .._version import __version__
from ..format import names as fmt
from .sink import FileSink
from .writer import Writer

if TYPE_CHECKING:
    from .io_tracing import IOTracer

__all__ = ["Session", "detect_rank"]

#: How long initialize() waits for the trace directory to be checked (created,
#: writable) before it goes on without the answer.
DIR_CHECK_S = 2.0
#: ``<host>:<log_file prefix>`` whose directory a parent process checked, or gave up
#: checking on storage that did not answer (exported with the configuration).
CHECKED_ENV = "DFTRACE_CHECKED_PREFIX"


def _clean(value: Any) -> Any:
    """``value`` with every string valid UTF-8: bytes that were not UTF-8 (file
    names, arguments, variables decoded with surrogateescape) and lone surrogates
    become U+FFFD."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            pass
        try:
            raw = value.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raw = value.encode("utf-8", "surrogatepass")
        return raw.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _hostname() -> str:
    try:
        return os.uname().nodename
    except AttributeError:  # not a POSIX system
        import socket

        return socket.gethostname()


def _in_main_interpreter() -> bool:
    """False in a sub-interpreter (``concurrent.interpreters``, ``_interpreters``)."""
    try:
        import _interpreters as interpreters  # Python 3.13
    except ImportError:
        try:
            import _xxsubinterpreters as interpreters  # Python 3.10 to 3.12
        except ImportError:  # built without them: there is one interpreter
            return True
    return bool(interpreters.get_current() == interpreters.get_main())


def hostname_hash(host: str) -> str:
    import hashlib  # at initialize, not at import

    return hashlib.blake2b(host.encode(), digest_size=8).hexdigest()


def _safe_host(host: str) -> str:
    return "".join(c if c.isascii() and (c.isalnum() or c in "_.") else "_" for c in host) or "host"


def _dataloader_worker() -> tuple[Any, Any]:
    """(worker id, number of workers) where this process is a PyTorch DataLoader
    worker, else (None, None): torch's worker info while its loop runs, and after it
    (torch clears that at its end) the arguments its process was started with."""
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    if info is not None:
        return info.id, info.num_workers
    mp = sys.modules.get("multiprocessing")
    process = mp.current_process() if mp is not None else None
    target = getattr(process, "_target", None)
    if getattr(target, "__module__", None) != "torch.utils.data._utils.worker":
        return None, None
    import inspect

    given = inspect.signature(target).bind_partial(*process._args, **process._kwargs).arguments  # type: ignore
    return given.get("worker_id"), given.get("num_workers")


class Session:
    """One process's tracing session (what ``initialize`` returns)."""

    def __init__(self, config: Config, ending: Callable[[Session], None], min_id: int = 0,
                 checked_prefix: str | None = None, writer_asked: bool = True,
                 anchor: tuple[int, int] | None = None):
        self.config = config
        #: What ends this session (``lifecycle.finalize``: the lifecycle that started it).
        self._ending = ending
        #: ``writer`` was set (argument or DFTRACE_WRITER), not left to its default.
        self.writer_asked = writer_asked
        self.pid = os.getpid()
        self.hostname = _clean(_hostname())
        self.hhash = hostname_hash(self.hostname)
        rank, local_rank = detect_rank(strict=config.rank is None)
        self.rank = config.rank if config.rank is not None else rank
        self.local_rank = local_rank
        # One monotonic clock, anchored once to wall time: the job's anchor (its
        # first traced process's, from a parent on this host), else now. A wall
        # clock stepped during the run then moves no process's times.
        self.wall_ns, self.mono_ns = anchor or job_anchor(self.hostname)
        self.offset_ns = self.wall_ns - self.mono_ns
        self.encoder = Encoder(self.pid, self.hhash, self.offset_ns, config.max_arg_length)
        #: span ids at or below this were started before a fork (the parent's)
        self.encoder.min_id = min_id
        #: The absolute log_file prefix, its directory checked (a forked child
        #: reuses the parent's: no call on the storage, which may hang).
        self.prefix = checked_prefix or self._checked_prefix()
        rank = f"-rank{self.rank}" if self.rank is not None else ""
        self.base = f"{self.prefix}{rank}-{_safe_host(self.hostname)}-{self.pid}"
        # What the header says about the process, as it is now (the file and its
        # header are written at the first flush, on the writer's thread).
        self._thread = (threading.get_native_id(), threading.current_thread().name)
        self._context = _context()
        self.sink = FileSink(self.base, config.compression, config.compression_level,
                             config.max_file_size, self._header, meta=self._meta)
        self.sampler: _sampler.Sampler | None = None
        self.io: IOTracer | None = None  # file I/O tracing (io=True)
        self.writer: Writer | _process_writer.ProcessWriter = self._start_writer()
        self.finalized = False
        self._worker_said = False  # say_dataloader_worker() wrote its record
        self.end_said = False  # lifecycle.say_how_it_ended() wrote its record
        #: Events lost to the storage (write failed, file deleted, shutdown gave up).
        self.events_lost = 0
        self._saved_env: dict[str, str | None] = {}

    def set_rank(self, rank: int, source: str) -> None:
        """The process's global rank, learned after ``initialize()`` (from
        torch.distributed once a process group exists, or from a trainer): written
        to the trace as a process-info record, which the analysis takes over a rank
        the file name or header gave."""
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank <= RANK_MAX \
                or rank == self.rank:
            return
        self.rank = rank
        _engine.record_special(META, {"name": "PR", "args": {"hhash": self.hhash, "rank": rank,
                                                     "rank_source": _clean(str(source))}})

    def say_dataloader_worker(self, worker_id: Any = None) -> None:
        """This process is a PyTorch DataLoader worker: its file says so once, in a
        ``CM`` record ``dataloader.worker`` (the analysis counts its file I/O as data
        loading). Without ``worker_id``, asked of torch: nothing where this process is
        no worker (or torch was never imported)."""
        if self._worker_said:
            return
        try:
            found, num_workers = _dataloader_worker()
        except Exception:
            found = num_workers = None
        worker_id = found if worker_id is None else worker_id
        if worker_id is None:
            return
        self._worker_said = True
        args: dict[str, Any] = {"name": "dataloader.worker", "value": str(worker_id)}
        if num_workers is not None:
            args["num_workers"] = int(num_workers)
        _engine.record_special(META, {"name": "CM", "args": args}, self.pid)

    def _start_writer(self) -> Writer | _process_writer.ProcessWriter:
        unavailable = None
        if self.config.writer == "process":
            try:
                return _process_writer.ProcessWriter(self)
            except DrainerUnavailable as exc:
                # The default says nothing where the platform has no shared ring (not
                # Linux, no C engine): the thread writer is the writer there.
                if self.writer_asked or not exc.platform:
                    unavailable = exc
        # Where no thread can be had either, initialize() says why in one warning.
        writer = Writer(self.encoder, self.sink, self.config.flush_interval)
        if unavailable is not None:
            STATE.warn_once(
                "writer-process", f"writer='process' (env DFTRACE_WRITER) is not "
                f"available here: {unavailable}; this process writes its trace itself "
                "(writer='thread')")
        return writer

    # -- naming --------------------------------------------------------------
    def _checked_prefix(self) -> str:
        """The absolute log_file prefix, its directory created and writable. The
        check runs in a short-lived process of its own, given DIR_CHECK_S: a call
        on storage that does not answer (a hung mount) holds whatever thread makes
        it, even at exit, so no thread of this process makes it. Storage that does
        not answer in time is left to the writer, with one warning."""
        shown = _clean(self.config.log_file)
        log_file = self.config.log_file
        if log_file.endswith(("/", os.sep)):  # a directory: the files go in it
            log_file = os.path.join(log_file, DEFAULT_STEM)
        try:
            prefix = os.path.abspath(os.path.expanduser(log_file))
        except (OSError, ValueError) as exc:  # the working directory is gone
            raise ConfigError(f"log_file (env DFTRACE_LOG_FILE)={shown!r}: {exc}") from None
        if os.environ.get(CHECKED_ENV) == f"{self.hostname}:{prefix}":
            return prefix  # checked by the parent, on this host
        d = os.path.dirname(prefix)
        problem = _check_dir(d)
        if problem is _NO_ANSWER:
            STATE.warn_once(
                "dir-check", f"the trace directory {_clean(d)!r} did not answer within "
                f"{DIR_CHECK_S:g} s (storage hung?); tracing goes on and the file is "
                "written when the storage answers")
        elif problem:
            raise ConfigError(f"log_file (env DFTRACE_LOG_FILE)={shown!r}: {problem}")
        return prefix

    @property
    def process_name(self) -> str:
        if self.config.process_name:
            return _clean(self.config.process_name)
        if self.rank is not None:
            return f"rank {self.rank} · {self.hostname} · pid {self.pid}"
        return f"{self.hostname} · pid {self.pid}"

    @property
    def path(self) -> str:
        """The file being written (the latest part when rotating). With the process
        writer, the first file's name until the session ends (the drainer names them)."""
        return self.sink.path

    @property
    def paths(self) -> list[str]:
        """Every file of the session; with the process writer, known when it ends."""
        return list(self.sink.paths)

    # -- header --------------------------------------------------------------
    def _meta(self, name: str, args: dict[str, Any], tid: int | None = None) -> bytes:
        ev = {"name": name, "cat": fmt.CAT_TRACER, "pid": self.pid,
              "tid": self.pid if tid is None else tid, "ph": fmt.PH_METADATA, "args": args}
        import orjson

        try:
            return orjson.dumps(ev, default=str) + b"\n"
        except TypeError:  # a string that is not valid UTF-8
            return orjson.dumps(_clean(ev), default=lambda v: _clean(str(v))) + b"\n"

    def _header(self) -> bytes:
        tid, thread_name = self._thread
        sort_index = self.rank if self.rank is not None else self.pid
        lines = [
            b"[\n",
            self._meta(fmt.META_PROCESS_NAME, {"name": self.process_name}),
            self._meta(fmt.META_PROCESS_SORT_INDEX, {"sort_index": sort_index}),
            self._meta(fmt.META_THREAD_NAME, {"name": _clean(thread_name)}, tid),
            self._meta(fmt.META_HOSTNAME_HASH, {"hhash": self.hhash, "name": self.hostname, "value": self.hhash}),
            self._meta(fmt.META_CLOCK_ANCHOR, {"hhash": self.hhash, "wall_ns": self.wall_ns,
                                        "mono_ns": self.mono_ns, "clock": "perf_counter_ns",
                                        "time_metric": "us"}),
            self._meta("PR", {"hhash": self.hhash, **process_info(self)}),
        ]
        return b"".join(lines)

    # -- environment export ----------------------------------------------------
    def export_env(self) -> None:
        exported = self.config.to_env()
        if not self.writer_asked:
            del exported["DFTRACE_WRITER"]  # children take the default too (quiet where it can't be had)
        # Children started afresh (spawn, subprocess) on this host trust this
        # check of the directory instead of making it again on the storage.
        exported[CHECKED_ENV] = f"{self.hostname}:{self.prefix}"
        exported[ANCHOR_ENV] = anchor_value(self.hostname, self.wall_ns, self.mono_ns)
        self.export(exported)

    def export(self, values: dict[str, str]) -> None:
        """Set ``values`` in the environment children inherit, until ``restore_env``."""
        for k, v in values.items():
            self._saved_env.setdefault(k, os.environ.get(k))
            os.environ[k] = v

    def restore_env(self) -> None:
        for k, old in self._saved_env.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old
        self._saved_env.clear()

    # -- end ----------------------------------------------------------------
    def finalize(self) -> None:
        """Close open spans, flush, write the closing bracket (idempotent)."""
        self._ending(self)

    def __repr__(self) -> str:
        return f"<dftrace.Session {self.path} {'finalized' if self.finalized else 'active'}>"


_NO_ANSWER = "no answer"

#: The directory check, run by /bin/sh in a process of its own (see _check_dir):
#: exit 3 when the directory cannot be created, 4 when it is not writable.
_DIR_CHECK = 'mkdir -p -- "$1" 2>/dev/null || exit 3; [ -w "$1" ] && [ -x "$1" ] || exit 4'


def _check_dir(d: str) -> str | None:
    """Create directory ``d`` when missing and check that it is writable: None when
    it is, what is wrong otherwise, _NO_ANSWER when the storage did not answer
    within DIR_CHECK_S. The calls on the storage are made by a child process (a
    shell: a couple of milliseconds), so that no thread of this process waits on
    storage that hangs; the reason of a failure, once the storage has answered,
    and the whole check where no shell can be started, here."""
    import subprocess

    try:
        named = os.path.abspath(d)  # by its name: the storage is not asked here
    except OSError:  # the working directory deleted
        named = d
    for kernel in ("/proc", "/sys"):  # writable to root by the mode bits, no file can be made there
        if named == kernel or named.startswith(kernel + "/"):
            return f"directory {_clean(d)!r} is in {kernel}, the kernel's: no file can be written there"
    code = None
    try:
        proc = subprocess.Popen(["/bin/sh", "-c", _DIR_CHECK, "sh", d], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                close_fds=True)
    except (OSError, ValueError, subprocess.SubprocessError):
        proc = None
    if proc is not None:
        try:
            code = proc.wait(timeout=DIR_CHECK_S)
        except subprocess.TimeoutExpired:
            proc.kill()  # it ends when the storage answers; never waited for
            return _NO_ANSWER
        if code == 0:
            return None
        if code == 4:
            return f"directory {_clean(d)!r} is not writable"
    try:
        os.makedirs(d, exist_ok=True)
    except (OSError, ValueError) as exc:
        return (f"cannot create directory {_clean(d)!r}: "
                f"{getattr(exc, 'strerror', None) or exc}")
    return None if os.access(d, os.W_OK | os.X_OK) else f"directory {_clean(d)!r} is not writable"


def _context() -> dict[str, Any]:
    """Command line and working directory, read at initialize (cheap, never raises)."""
    try:
        cwd: str | None = os.getcwd()
    except OSError:  # deleted
        cwd = None
    try:
        argv = [str(a) for a in sys.argv] if sys.argv else []
    except Exception:
        argv = []
    return _clean({"cmdline": argv, "executable": sys.executable or "", "cwd": cwd})


def process_info(s: Session) -> dict[str, Any]:
    """What this process is: command line, directory, versions, affinity, host, rank."""
    info: dict[str, Any] = {
        **s._context,
        "python": sys.version.split()[0],
        "dftrace": __version__,
        "hostname": s.hostname,
        "ppid": os.getppid(),
        "rank": s.rank,
        "local_rank": s.local_rank,
        "data_dir": _clean(s.config.data_dir),
        "platform": sys.platform,
    }
    info["pid"] = s.pid
    info["cpu_count"] = os.cpu_count()
    try:
        info["cpu_affinity"] = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:  # what os cannot tell everywhere (macOS has no sched_getaffinity)
        import psutil

        proc = psutil.Process(s.pid)
        info["memory_total"] = psutil.virtual_memory().total
        info["start_time"] = proc.create_time()
        if "cpu_affinity" not in info and hasattr(proc, "cpu_affinity"):
            info["cpu_affinity"] = sorted(proc.cpu_affinity())
    except Exception:
        pass
    versions = {}
    for mod in ("numpy", "torch", "tensorflow", "keras", "lightning", "transformers"):
        m = sys.modules.get(mod)
        if m is not None:
            versions[mod] = str(getattr(m, "__version__", "?"))
    info["packages"] = versions
    return info

