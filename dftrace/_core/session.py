"""A tracing session: initialise, write the file header, finalise; fork and exit hooks.

There is at most one session per process. ``initialize`` resolves the configuration,
starts the writer and opens the gate so nodes record; the writer creates
``<prefix>[-rank<R>]-<host>-<pid>.pfw.zst`` (with the metadata header) at its first
write. ``finalize`` (also run at interpreter exit, when a ``multiprocessing`` child
ends and when a signal ends the process, see ``_signals``) closes open spans, has
the writer write everything and the closing ``]``, and returns within
``shutdown_timeout`` whatever the storage does; spans still open on other threads
get a short grace period, and those that outlive it are counted in a ``dropped``
line (reason ``late``).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from . import tree as _tree
from . import buffer as _buffer, engine as _engine, iterators as _iterators
from .state import STATE, limit_refused
from . import nvtx_ranges as _nvtx, sampler as _sampler, shm as _shm, signals as _signals
from .registration import DrainerUnavailable
from .clock_anchor import ANCHOR_ENV, anchor_value, job_anchor
from .config import RANK_MAX, Config, ConfigError, auto_unless_set, env_enable
from .ranks import detect_rank
from .records import META, Encoder
from .._version import __version__
from ..format import names as fmt
from .sink import FileSink
from .writer import Patience, Writer

if TYPE_CHECKING:
    from .io_tracing import IOTracer

__all__ = ["Session", "initialize", "finalize", "session", "detect_rank"]

_lock = threading.RLock()
_session: Session | None = None
#: How long initialize() waits for the trace directory to be checked (created,
#: writable) before it goes on without the answer.
DIR_CHECK_S = 2.0
#: ``<host>:<log_file prefix>`` whose directory a parent process checked, or gave up
#: checking on storage that did not answer (exported with the configuration).
CHECKED_ENV = "DFTRACE_CHECKED_PREFIX"
_atexit_registered = False
_fork_hook_registered = False


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


class Session:
    """One process's tracing session (what ``initialize`` returns)."""

    def __init__(self, config: Config, min_id: int = 0, checked_prefix: str | None = None,
                 writer_asked: bool = True, anchor: tuple[int, int] | None = None):
        self.config = config
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
        self.writer: Writer | _shm.ProcessWriter = self._start_writer()
        self.finalized = False
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

    def _start_writer(self) -> Writer | _shm.ProcessWriter:
        unavailable = None
        if self.config.writer == "process":
            try:
                return _shm.ProcessWriter(self)
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
        try:
            prefix = os.path.abspath(os.path.expanduser(self.config.log_file))
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
        """The file being written (the latest part when rotating)."""
        return self.sink.path

    @property
    def paths(self) -> list[str]:
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
        for k, v in exported.items():
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
        finalize(self)

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


def session() -> Session | None:
    """The active session of this process, if any."""
    return _session


def _set_gate() -> None:
    _tree.GATE._on = _session is not None or STATE.memory_traces > 0
    _tree.refresh_all()


def initialize(**options: Any) -> Session | None:
    """Start tracing in this process. Keyword arguments override ``DFTRACE_*``
    variables (see docs/configuration.md); an invalid value raises ``ConfigError``
    naming the setting. Returns the :class:`Session` (None when tracing is off by
    configuration, or in a sub-interpreter: dftrace records in the main one). Calling it again while a session runs returns that session.

    From a thread other than the main one, the signal handlers (which only the main
    thread may install) are installed by the main thread the next time it runs
    Python code."""
    global _session, _busy
    config = Config.resolve(options)
    with _lock:
        if _session is not None and _session.pid == os.getpid():
            return _session
        if config.enable is False:
            _tree.set_off_for_good(True)
            return None
        if not _in_main_interpreter():
            # A sub-interpreter shares the process but not its C engine, writer,
            # signal handlers or fork hooks (nor, in isolated ones, subprocesses and
            # most C extensions): the process's trace is its main interpreter's.
            _tree.set_off_for_good(True)
            STATE.warn_once("interpreter", "tracing is off in this sub-interpreter of process "
                            f"{os.getpid()}: dftrace records in the main interpreter only")
            return None
        nvtx = _nvtx_ready(config, asked="nvtx" in options and options["nvtx"] is not None)
        _busy += 1
        s = None
        try:
            _load_unwinder()
            asked = (options.get("writer") is not None
                     or os.environ.get("DFTRACE_WRITER", "").strip() != "")
            s = Session(config, writer_asked=asked)
            # The header now, on this thread: the file is only created at the first
            # flush, but what the header imports (psutil) must not wait until the
            # interpreter exits (an import on the writer's thread then makes a
            # KeyboardInterrupt exit with status 1 instead of dying of SIGINT).
            s.sink.header()
            if config.auto:
                _trace_automatically()
            _tree.set_off_for_good(False)
            _tree.set_max_arg_length(config.max_arg_length)
            STATE.set_limits(config.batch_size, config.buffer_limit, config.on_full == "drop")
            STATE.max_open_spans = config.max_open_spans
            if not STATE.memory_traces:  # a running in-memory trace's events are in the buffer
                _buffer.discard_buffered()  # leftovers of an earlier session (late events) are not ours
            STATE.dropped = 0
            STATE.open_refused = 0
            _buffer.attach(s.writer)
            _session = s
            if config.inherit:
                s.export_env()
            _register_hooks()
            if not _install_signals():
                _signals.run_on_main_thread(_install_signals_if_active)
            _set_gate()
            _engine.use_nvtx(nvtx)
            s.sampler = _sampler.start(config.sample_interval)
            if config.io:
                from .io_tracing import start as start_io  # only where file I/O is traced

                s.io = start_io(s)
        except Exception as exc:
            limit = limit_refused(exc)
            if limit is None:
                raise
            # A limit of the system (threads, memory, processes, file descriptors),
            # not a setting: the program runs untraced, as it would without dftrace.
            _abandon(s)
            STATE.warn_once("refused", f"{limit}: tracing is off in this process "
                            f"(pid {os.getpid()}): {_clean(str(exc))}")
            return None
        finally:
            _busy -= 1
    _signals.redeliver_pending()
    return s


_unwinder: Any = None


def _load_unwinder() -> None:
    """Load glibc's unwinder (libgcc_s) now. glibc opens it the first time a thread
    ends: where no file descriptor is left then (RLIMIT_NOFILE), it aborts the
    process, and the threads dftrace starts end at finalize."""
    global _unwinder
    if _unwinder is not None or not sys.platform.startswith("linux"):
        return
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return
        import ctypes

        _unwinder = ctypes.CDLL("libgcc_s.so.1")
    except (OSError, ValueError, AttributeError, ImportError):
        _unwinder = False  # not glibc's, or not to be had: nothing to do


def _abandon(s: Session | None) -> None:
    """Undo what initialize() did of a session it could not complete."""
    if s is None:
        return
    if _session is s:
        finalize(s)
    elif s.writer is not None:
        try:
            s.writer.stop(0.0)
        except Exception:
            pass


def _trace_automatically() -> None:
    """``auto=True``: the hooks of ``dftrace.torch._auto`` once torch is imported (now,
    if it is)."""
    from .._after_import import when_imported

    when_imported("torch", "dftrace.torch._auto:install")


def _nvtx_ready(config: Config, asked: bool) -> bool:
    """Whether spans open NVTX ranges in this session: ``nvtx`` is on and a tool
    (Nsight Systems) receives them. Without the ``nvtx`` package, ``nvtx=True`` given
    to initialize() is a ConfigError; ``DFTRACE_NVTX=1`` from the environment warns
    once and tracing goes on without ranges."""
    if not config.nvtx:
        return False
    try:
        return _nvtx.load()
    except Exception as exc:
        setting = "nvtx=True (env DFTRACE_NVTX)" if asked else "DFTRACE_NVTX=1"
        problem = (f"{setting} needs NVIDIA's nvtx package, which does not load here "
                   f"({_clean(str(exc))}): {_nvtx.INSTALL}")
    if asked:
        raise ConfigError(problem)
    STATE.warn_once("nvtx", problem + "; tracing goes on without NVTX ranges")
    return False


def _install_signals() -> bool:
    return _signals.install(_finish_on_signal, flush_now, busy_here, lambda: _busy > 0,
                            _shutdown_timeout)


def _install_signals_if_active() -> None:
    s = _session
    if s is not None and s.pid == os.getpid():
        _install_signals()


def _shutdown_timeout() -> float:
    s = _session
    return s.config.shutdown_timeout if s is not None else 5.0


#: initialize()/finalize() calls under way in this process (any thread)
_busy = 0


def finalize(target: Session | None = None) -> None:
    """Stop tracing: close spans left open by ``start()`` (``args.incomplete``),
    flush every buffered event and write the closing ``]``. Idempotent; also runs
    at interpreter exit. Returns within the session's ``shutdown_timeout`` even when
    the storage stalls: the file is then abandoned with a warning counting the
    events not written."""
    global _session, _busy
    interrupted: BaseException | None = None
    if _session is None or _session.pid != os.getpid():
        # Nothing of this process's (or the parent's session, in the child of a
        # fork() made from C, whose _lock may have been copied held).
        return
    with _lock:
        s = _session
        if s is None or (target is not None and target is not s) or s.pid != os.getpid():
            return
        _busy += 1
        deadline = time.monotonic() + s.config.shutdown_timeout
        try:
            _engine.close_all_open()
            # Loops still suspended (a signal or an exit inside a for loop leaves its
            # generator holding the loop body's span): their bodies, incomplete.
            _iterators.close_open_blocks(_engine.clock())
            _engine.use_nvtx(False)
            _session = None
            _set_gate()
            if s.sampler is not None:
                s.sampler.stop()
            if s.io is not None:
                s.io.stop()
            late = _wait_for_open_spans(deadline)

            def trailer(count_buffer_full: bool = True) -> bytes:
                """The last lines: the counts of what was dropped (those the
                buffer dropped only with ``count_buffer_full``: a drainer counts
                them itself, from the ring) and the closing bracket."""
                out = b""
                if count_buffer_full and STATE.dropped:
                    out += s._meta("dropped", {"count": STATE.dropped,
                                               "reason": "buffer full"})
                if STATE.open_refused:
                    out += s._meta("dropped", {"count": STATE.open_refused,
                                               "reason": "open spans"})
                if late:
                    out += s._meta("dropped", {"count": late, "reason": "late"})
                return out + b"]\n"

            done = False
            # Slow is not stuck: the writer may take shutdown_timeout without progress
            # (what is left of it after the open spans' wait), FINISH_CAP_S in all.
            patience = Patience(max(0.0, deadline - time.monotonic()))
            while True:  # an exception (KeyboardInterrupt) in the wait must not end it
                try:
                    done = s.writer.stop(s.config.shutdown_timeout, trailer, patience)
                    break
                except BaseException as exc:
                    interrupted = interrupted or exc
                    if patience.exhausted():
                        break
            lost = s.sink.events_lost
            if patience.reason == "too slow":
                why = (f"the writer was still writing after {patience.elapsed:.0f} s "
                       f"(at {s.writer.events_written / max(patience.elapsed, 1e-9):,.0f} events/s: "
                       "too slow for the load, the storage still answering)")
            else:
                why = (f"no progress for shutdown_timeout={s.config.shutdown_timeout:g} s "
                       "(storage stalled)")
            if not done and isinstance(s.writer, _shm.ProcessWriter) and s.writer.fallback is None:
                STATE.warn_once(
                    "shutdown-drainer",
                    f"the trace drainer (pid {s.writer.drainer_pid}) has not finished writing "
                    f"{s.path}: {why}; it writes the rest when it can")
            elif not done:
                lost += _buffer.buffered()
                STATE.warn_once(
                    "shutdown-stalled",
                    f"writing {s.path} did not finish: {why}; the file is "
                    f"abandoned and {lost} events were not written")
            elif lost:  # each failure was said when it happened: these are the counts in all
                failed = s.sink.failed
                STATE.warn_once(
                    "events-lost", f"{lost} events could not be written to {s.path}"
                    + (" (it was deleted)" if failed == "deleted" else f" ({failed})" if failed else "")
                    + (f"; the record of the loss is in {s.sink.loss_record}"
                       if s.sink.loss_record else ""))
            s.events_lost = lost
        except BaseException as exc:
            if isinstance(exc, Exception):
                STATE.warn_once("finalize", f"finalize failed: {exc!r}")
            else:
                interrupted = interrupted or exc
        finally:
            s.finalized = True
            _buffer.detach(s.writer)
            s.restore_env()
            _signals.uninstall()
            _busy -= 1
    _signals.redeliver_pending()
    if interrupted is not None:
        raise interrupted


#: How long finalize waits for spans still open on other threads: those that end
#: in time are written, the rest are counted in a ``dropped`` line (reason "late").
LATE_GRACE_S = 0.2


def _stacks_stuck_here() -> set[int]:
    """Stacks that cannot move while this thread is in finalize: its own, and
    those of the tasks of the event loop it runs (if any)."""
    out = set()
    own = _engine.LOCAL.thread_stk
    if own is not None:
        out.add(id(own))
    loop = _engine._get_running_loop()
    if loop is not None:
        for stk in list(_engine.STACKS.values()):
            try:
                if stk.owner is not None and stk.owner.get_loop() is loop:
                    out.add(id(stk))
            except Exception:
                pass
    return out


def _open_span_count(exclude: set[int] = frozenset()) -> int:  # type: ignore[assignment]
    # Every stack starts with one root link; the rest are ids of open spans.
    return sum(len(stk) - 1 for stk in list(_engine.STACKS.values()) if id(stk) not in exclude)


def _wait_for_open_spans(deadline: float) -> int:
    """Give spans still open on other threads a moment to end (the writer writes
    them); return how many spans are still open anywhere (they will end too late)."""
    stuck = _stacks_stuck_here()
    until = min(deadline, time.monotonic() + LATE_GRACE_S)
    while _open_span_count(stuck) and time.monotonic() < until:
        time.sleep(0.005)
    return _open_span_count()


def busy_here() -> bool:
    """True when the calling thread is inside initialize() or finalize()."""
    return _lock._is_owned()  # type: ignore[attr-defined]


def flush_now(timeout: float = 1.0) -> None:
    """Have the writer write the buffered events now and wait for it (at most
    ``timeout`` seconds, less when the session's shutdown_timeout is shorter)."""
    s = _session
    if s is not None and s.pid == os.getpid() and s.writer is not None:
        s.writer.sync(min(timeout, s.config.shutdown_timeout))


def _finish_on_signal(signum: int) -> None:
    """Finalize before a signal ends the process: the spans this thread (and its
    event loop's tasks) have open will never end, so write them as incomplete."""
    if _session is None or _session.pid != os.getpid():
        return
    t1 = _engine.clock()
    stuck = _stacks_stuck_here()
    for stk in list(_engine.STACKS.values()):
        if id(stk) not in stuck:
            continue
        for i in reversed(list(stk)):
            if i in stk.open:
                _engine.close_kept(stk, i, t1, incomplete=True)
    try:
        finalize()
    except BaseException:
        pass


def _finalize_at_exit() -> None:
    """The atexit hook: finalize, undisturbed by a Ctrl-C pressed meanwhile (which
    is sent again once the file is complete, as the program would have seen it)."""
    if _session is None:
        return
    swapped = None
    on_main = threading.current_thread() is threading.main_thread()
    got: list[int] = []
    if on_main:
        try:
            current = signal.getsignal(signal.SIGINT)
            if callable(current):
                swapped = current
                signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
        except (ValueError, OSError, RuntimeError):
            swapped = None
    try:
        finalize()
    except BaseException:
        pass
    finally:
        if swapped is not None:
            try:
                signal.signal(signal.SIGINT, swapped)
            except (ValueError, OSError, RuntimeError):
                pass
            if got:
                os.kill(os.getpid(), signal.SIGINT)


def _after_fork_child() -> None:
    """In a forked child: drop the parent's buffered events and frames, and trace
    into a file of the child's own (created at its first flush: a child that
    execs or records nothing leaves no file)."""
    global _session, _lock, _busy
    # A lock held by another thread of the parent at fork time would stay held here.
    _lock = threading.RLock()
    _busy = 0
    parent = _session
    STATE.after_fork()
    _signals.after_fork()
    if parent is None:
        return
    parent.sink.abandon()
    if isinstance(parent.writer, _shm.ProcessWriter):
        parent.writer.forget()
    parent.writer = None  # type: ignore[assignment]
    _session = None
    try:
        first_id = _engine.new_id()
        s = Session(parent.config, first_id, parent.prefix, parent.writer_asked,
                    (parent.wall_ns, parent.mono_ns))
        _buffer.attach(s.writer)
        _session = s
        _register_mp_finalizer()
        s.sampler = _sampler.start(s.config.sample_interval)
        if parent.io is not None:
            s.io = parent.io.in_child(s)
    except Exception as exc:
        STATE.warn_once("fork", f"tracing could not restart in the child: {exc!r}")
    _set_gate()


class _MPAnchor:
    """What multiprocessing's after-fork registry holds (it keeps weak references)."""


_MP_ANCHOR = _MPAnchor()
_mp_finalizer_pid = 0
_mp_afterfork_registered = False


def _register_mp_finalizer() -> None:
    # multiprocessing children (fork, spawn, forkserver) end through os._exit or
    # skip atexit; multiprocessing's own finalizers do run there
    # (Process._bootstrap -> util._exit_function). But _bootstrap clears that
    # registry before it runs the target, dropping a finalizer registered at fork
    # or at import; its after-fork callbacks run right after the clear, so one of
    # them registers the finalizer again.
    global _mp_finalizer_pid, _mp_afterfork_registered
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is None:
        return
    try:
        if _mp_finalizer_pid != os.getpid():
            mp_util.Finalize(None, finalize, exitpriority=-100)
            _mp_finalizer_pid = os.getpid()
        if not _mp_afterfork_registered:
            mp_util.register_after_fork(_MP_ANCHOR, _mp_child_started)
            _mp_afterfork_registered = True
    except Exception:
        pass


def _mp_child_started(_anchor: Any) -> None:
    global _mp_finalizer_pid
    _mp_finalizer_pid = 0
    _register_mp_finalizer()


def _register_hooks() -> None:
    global _fork_hook_registered
    _register_atexit()
    if not _fork_hook_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_child)
        _fork_hook_registered = True
    _register_mp_finalizer()


def _register_atexit() -> None:
    # At import: atexit runs hooks last-registered first, so the hooks a program
    # registers after ``import dftrace`` (even before initialize()) run before the
    # trace is completed, and their spans are written.
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_finalize_at_exit)
        _atexit_registered = True


def autostart() -> None:
    """At import: honour ``DFTRACE_ENABLE`` (1 starts a session, but in the ``dftrace``
    command's own commands, all but ``run``, which never trace themselves; 0
    switches off for good). Never raises: an unusable environment (a bad setting,
    bytes that are not UTF-8, a log directory that cannot be created) leaves this
    process untraced with one warning naming the cause."""
    _register_atexit()
    try:
        enable = env_enable()
        if enable is False:
            _tree.set_off_for_good(True)
        elif enable:
            from .own_command import is_own_command  # read only where DFTRACE_ENABLE=1

            # Tracing switched on from outside: what a program does without
            # annotations is traced too, unless DFTRACE_AUTO says otherwise.
            if not is_own_command():
                initialize(**auto_unless_set({}))
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        _tree.set_off_for_good(True)
        STATE.warn_once(
            "autostart", f"tracing is off in this process (pid {os.getpid()}): {_clean(str(exc))}")


def _reset() -> None:
    global _session
    _session = None  # a session inherited through fork (finalize ends only its own)
    _set_gate()


STATE.on_reset(_reset, order=10)
