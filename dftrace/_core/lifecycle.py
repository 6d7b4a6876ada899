"""How a tracing session starts and ends: initialise, finalise; fork and exit hooks.

There is at most one session per process. ``initialize`` resolves the configuration,
starts the writer and opens the gate so nodes record; the writer creates
``<prefix>[-rank<R>]-<host>-<pid>.pfw.zst`` (with the metadata header) at its first
write. ``finalize`` (also run at interpreter exit, when a ``multiprocessing`` child
ends and when a signal ends the process, see ``_signals``) closes open spans, has
the writer write everything and the closing ``]``, and returns within
``shutdown_timeout`` whatever the storage does; spans still open on other threads
get a short grace period, and those that outlive it are written as incomplete where
the ring's open-span table holds them (the default writer), else counted in a
``dropped`` line (reason ``late``).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from typing import Any

from .._install_hint import pip_install
from . import tree as _tree
from . import buffer as _buffer, engine as _engine, generators as _generators, iterators as _iterators, \
    kept_styles as _kept
from .records import META
from .state import STATE, limit_refused
from . import nvtx_ranges as _nvtx, sampler as _sampler, signals as _signals, spans_at_end as _at_end
from .drain import process_writer as _process_writer
from .config import Config, ConfigError, auto_unless_set, env_enable
from .writer import Patience

from .session import Session, _clean, _in_main_interpreter

__all__ = ["initialize", "finalize", "session", "autostart"]


_lock = threading.RLock()


_session: Session | None = None


_atexit_registered = False


_fork_hook_registered = False


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
    configuration, or in a sub-interpreter: dftrace records in the main one). Calling it
    again while a session runs returns that session; a ``rank=`` given then is its rank
    from then on (a child forked from a traced parent, where the parent's session
    carried on, learning its rank).

    From a thread other than the main one, the signal handlers (which only the main
    thread may install) are installed by the main thread the next time it runs
    Python code."""
    global _session, _busy
    config = Config.resolve(options)
    with _lock:
        if _session is not None and _session.pid == os.getpid():
            if options.get("rank") is not None and config.rank is not None:
                _session.set_rank(config.rank, "initialize")
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
            s = Session(config, finalize, writer_asked=asked)
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
    if it is), and Keras' ``fit``/``evaluate``/``predict`` given the Keras callback
    once Keras' models are."""
    from .after_import import when_imported

    when_imported("torch", "dftrace.torch._auto:install")
    when_imported("keras.src.models.model", "dftrace._hooks:give_keras_callbacks")


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
                   f"({_clean(str(exc))}): {pip_install('nvtx')}")
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


#: Called at the start of each finalize (each with nothing, never raising out): what
#: an integration holds that is not a span yet (asynchronous work still in flight).
_AT_END: list[Any] = []


def at_end(fn: Any) -> None:
    """Have ``fn()`` called when a session ends, before the writer stops (once each)."""
    if fn not in _AT_END:
        _AT_END.append(fn)


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
            s.say_dataloader_worker()  # a worker with no worker_init_fn of ours says so too
            for fn in list(_AT_END):
                try:
                    fn()
                except Exception as exc:
                    STATE.warn_once("at-end", f"finalize: {exc!r}")
            # What finalize ends on this thread ends at one time: a signal's, or now.
            t_here = _signalled_at if _signalled_at is not None else _engine.clock()
            stuck = _at_end.stacks_stuck_here()
            here = {stk.tid for stk in list(_engine.STACKS.values()) if id(stk) in stuck}
            unwound = _signal_unwound | _at_end.calls_unwound(
                [(stk, i) for i in list(STATE.open_spans)
                 if id(stk := STATE.open_spans.get(i)) in stuck])
            _kept.close_all_open(t_here)
            # Loops still suspended (a signal or an exit inside a for loop leaves its
            # generator holding the loop body's span): their bodies, incomplete.
            _iterators.close_open_blocks(t_here)
            _generators.close_open_generators(t_here)  # generators left suspended
            _engine.use_nvtx(False)
            _session = None
            _set_gate()
            if s.sampler is not None:
                s.sampler.stop()
            if s.io is not None:
                s.io.stop()
            late = _at_end.late_spans(s.writer, deadline, here, t_here, unwound)

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
            if (not done and isinstance(s.writer, _process_writer.ProcessWriter)
                    and s.writer.fallback is None):
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
            if STATE.dropped:  # the trace counts them: said here too, once
                STATE.warn_once("dropped", f"{STATE.dropped} events were dropped, the buffer full ("
                                + ("on_full=drop" if s.config.on_full == "drop" else "the writer made no "
                                   "progress") + f"); {s.path} counts them")
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


def busy_here() -> bool:
    """True when the calling thread is inside initialize() or finalize()."""
    return _lock._is_owned()  # type: ignore[attr-defined]


def flush_now(timeout: float = 1.0) -> None:
    """Have the writer write the buffered events now and wait for it (at most
    ``timeout`` seconds, less when the session's shutdown_timeout is shorter)."""
    s = _session
    if s is not None and s.pid == os.getpid() and s.writer is not None:
        s.writer.sync(min(timeout, s.config.shutdown_timeout))


#: When a signal's finalize began (its thread's spans end then), else None.
_signalled_at: int | None = None
#: The calls a signal's closing of its thread's spans unwound (see ``calls_unwound``).
_signal_unwound: set[int] = set()


def _finish_on_signal(signum: int) -> None:
    """Finalize before a signal ends the process: the spans this thread (and its
    event loop's tasks) have open will never end, so write them as incomplete."""
    global _signalled_at, _signal_unwound
    if _session is None or _session.pid != os.getpid():
        return
    t1 = _engine.clock()
    stuck = _at_end.stacks_stuck_here()
    closing = [(stk, i) for stk in list(_engine.STACKS.values()) if id(stk) in stuck
               for i in list(stk) if i in stk.open]
    _signal_unwound = _at_end.calls_unwound(closing)
    for stk, i in reversed(closing):
        _engine.close_kept(stk, i, t1, incomplete=True)
    if not _signals.ended_by_its_parent(signum):
        say_how_it_ended(f"killed by signal {signum}")  # what it dies of once the trace is whole
    _signalled_at = t1
    try:
        finalize()
    except BaseException:
        pass
    finally:
        _signalled_at = None
        _signal_unwound = set()


def say_how_it_ended(how: str) -> None:
    """The program ends otherwise than by returning: its trace says how (``process_end``,
    as the drainer writes for a killed process), once, so that its end is not read as
    a normal one (a rank that crashed while the others waited)."""
    s = _session
    if s is None or s.pid != os.getpid() or s.end_said:
        return
    s.end_said = True
    try:
        _engine.record_special(META, {"name": "process_end", "args": {"how": how}}, s.pid)
    except Exception:
        pass


def say_it_raised(exc: BaseException) -> None:
    """The program ends by ``exc``, which nothing caught (a ``SystemExit`` is an exit)."""
    if not isinstance(exc, SystemExit):
        said = str(exc).strip().splitlines()
        say_how_it_ended(f"raised {type(exc).__name__}" + (f": {said[0][:200]}" if said else ""))


def _ended_the_program(exc: BaseException) -> bool:
    """Whether ``exc`` (``sys.last_value``) is what ended the program: raised through
    its main module's top level, outside an interactive session (a notebook or a
    prompt keeps the last error of a cell or line, which ended nothing)."""
    tb = exc.__traceback__
    return (tb is not None and not hasattr(sys, "ps1") and "IPython" not in sys.modules
            and tb.tb_frame.f_code.co_name == "<module>" and tb.tb_frame.f_globals.get("__name__") == "__main__")


def _finalize_at_exit() -> None:
    """The atexit hook: finalize, undisturbed by a Ctrl-C pressed meanwhile (which
    is sent again once the file is complete, as the program would have seen it).
    A program ending by an exception it did not catch says so first."""
    if _session is None:
        return
    uncaught = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if isinstance(uncaught, BaseException) and _ended_the_program(uncaught):
        say_it_raised(uncaught)
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
    if isinstance(parent.writer, _process_writer.ProcessWriter):
        parent.writer.forget()
    parent.writer = None  # type: ignore[assignment]
    _session = None
    try:
        first_id = _engine.new_id()
        s = Session(parent.config, finalize, first_id, parent.prefix, parent.writer_asked,
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
