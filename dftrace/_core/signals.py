"""Finishing the trace when the process is told to stop by a signal.

A process ended by a signal whose action is the default (``SIGTERM`` from a batch
scheduler, ``kill``, a container runtime) never runs ``atexit``, so without help
its last flush interval of events and the closing ``]`` are lost. Handlers are
installed by :func:`dftrace.initialize` (never by ``import dftrace`` alone) and
change nothing the application can observe:

* signal with the default action (SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, and SIGINT
  when its action is the default one): finish the trace, then restore the default
  action and send the signal again, so the process ends exactly as it would have
  (same signal, same exit status, same core-dump rule);
* signal with a handler of the application's (installed before ``initialize``):
  write the buffered events to disk (bounded wait), then call that handler,
  whatever it does (raise, exit, ``os._exit``, or nothing and carry on tracing);
* signal ignored (``SIG_IGN``) or handled outside Python (a handler installed in
  C, such as ``faulthandler.register(signal.SIGUSR1)`` to dump a hung job's
  stacks; seen on Linux, where the OS tells which signals are caught): left alone.

``SIGINT`` normally has Python's own handler, which raises ``KeyboardInterrupt``;
the exception unwinds the program and ``atexit`` completes the trace, so that
handler is left in place.

A Python-level handler runs only when the main thread next executes Python code.
When the main thread is blocked inside C (a collective that never completes, a
native wait), a default-action signal would wait for it forever. So this module
also watches the signal wakeup fd (:func:`signal.set_wakeup_fd`): Python's C-level
handler writes the signal number there at once, whatever the main thread does. A
small daemon thread reads it; if a terminating signal is not taken up by the
main thread within :data:`MAIN_GRACE_S` while the main thread's Python frame has
not moved, that thread finishes the trace and ends the process with the signal.
A wakeup fd set before ours (by the application) keeps receiving every byte. An
application or library (asyncio) that sets its own wakeup fd after ours replaces
it; then only the Python-level handlers above apply.

Where no thread can be had (``RLIMIT_AS``, a pids limit), the handlers work
without the watcher (one warning says so).

A PyTorch DataLoader worker's SIGTERM is handled in C by PyTorch, which ends the
worker at once: with status 0 when its parent sent it (how the parent shuts down
persistent workers, and any worker still alive at its exit), else by the signal.
Nothing of the worker's trace would be finished (its I/O counters, the calls read
since the last drain, its spans still open). Once PyTorch has set its handlers in a
worker (:func:`take_over_torch_worker_handlers`), the SIGTERM is handled here as a
default-action one, and the worker then ends as PyTorch would have ended it (the
sender's pid kept by the C engine: ``note_signal_sender``).

The module does not import the session: :func:`install` takes the callbacks it
needs.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .state import STATE, limit_refused

__all__ = ["install", "uninstall", "installed", "redeliver_pending", "after_fork",
           "run_on_main_thread", "MAIN_GRACE_S", "take_over_torch_worker_handlers", "sent_by_parent",
           "ended_by_its_parent"]

_NAMES = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")

#: How long the signal watcher leaves a terminating signal to the main thread's
#: Python-level handler before it finishes the trace itself.
MAIN_GRACE_S = 0.1

#: signal number -> the handler that was there before ours
_previous: dict[int, Any] = {}


class _WorkerExit:
    """The handler before ours where PyTorch's DataLoader worker handler was: leave
    with status 0 at a signal from the parent, else die of it."""


WORKER_EXIT = _WorkerExit()
#: signals that arrived while this thread was inside initialize()/finalize()
_pending: list[int] = []


class _Callbacks:
    """What the session gives this module (so that it imports no session code)."""

    #: finish(signum): close open spans, write everything and the ``]`` (bounded)
    finish: Callable[[int], None] = staticmethod(lambda signum: None)
    #: flush(): write the buffered events now (bounded)
    flush: Callable[[], None] = staticmethod(lambda: None)
    #: busy(): True while the calling thread is inside initialize()/finalize()
    busy: Callable[[], bool] = staticmethod(lambda: False)
    #: active(): True while any thread is inside initialize()/finalize()
    active: Callable[[], bool] = staticmethod(lambda: False)
    #: deadline(): seconds finishing may take (the session's shutdown_timeout)
    deadline: Callable[[], float] = staticmethod(lambda: 5.0)


CALLBACKS = _Callbacks()

# Whoever takes this lock (the main thread's handler or the watcher) ends the process.
_ending = threading.Lock()


def _caught_signals() -> int:
    """The signals this process catches (through Python or not), as a bit mask (bit
    ``n - 1`` for signal ``n``), read from the OS; -1 where it does not tell."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"SigCgt:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return -1


def _wanted(sig: int, current: Any, caught: int) -> bool:
    if current is None or current is signal.SIG_IGN:
        return False  # set outside Python, or ignored: nothing of ours to do
    if sig == signal.SIGINT and current is signal.default_int_handler:
        return False  # KeyboardInterrupt unwinds and atexit finishes the trace
    if current is signal.SIG_DFL and caught > 0 and caught >> (sig - 1) & 1:
        # Python says "default" but the OS has a handler: one installed in C after
        # Python started (faulthandler.register, a native library). Left alone.
        return False
    return current is signal.SIG_DFL or callable(current)


def install(finish: Callable[[int], None], flush: Callable[[], None], busy: Callable[[], bool],
            active: Callable[[], bool], deadline: Callable[[], float]) -> bool:
    """Install the handlers and the watcher. Main thread only: elsewhere nothing
    happens and False is returned (see :func:`run_on_main_thread`)."""
    CALLBACKS.finish, CALLBACKS.flush, CALLBACKS.busy = finish, flush, busy
    CALLBACKS.active, CALLBACKS.deadline = active, deadline
    from .after_import import when_imported

    when_imported("torch.utils.data._utils.signal_handling", take_over_torch_worker_handlers)
    if threading.current_thread() is not threading.main_thread():
        return False
    caught = _caught_signals()
    for name in _NAMES:
        sig = getattr(signal, name, None)
        if sig is None or sig in _previous:
            continue
        try:
            current = signal.getsignal(sig)
            if not _wanted(sig, current, caught):
                continue
            signal.signal(sig, _handler)
            _previous[sig] = current
        except (ValueError, OSError, RuntimeError):
            pass  # not the main interpreter, or a platform without this signal
    _Watcher.start()
    return True


def take_over_torch_worker_handlers(module: Any) -> None:
    """``module`` is ``torch.utils.data._utils.signal_handling``: its
    ``_set_worker_signal_handlers``, which each DataLoader worker calls first thing,
    is followed by :func:`_take_over_worker_sigterm`. Needs the C engine (which tells
    who sent a signal); without it PyTorch's handler stays."""
    from .engine import speedups

    original = getattr(module, "_set_worker_signal_handlers", None)
    if original is None or getattr(original, "_dftrace_follows", False) or speedups is None \
            or not hasattr(speedups, "note_signal_sender"):
        return

    def _set_worker_signal_handlers(*args: Any, **kwargs: Any) -> Any:
        done = original(*args, **kwargs)
        _take_over_worker_sigterm(speedups)
        return done

    _set_worker_signal_handlers._dftrace_follows = True  # type: ignore[attr-defined]
    _set_worker_signal_handlers.__wrapped__ = original  # type: ignore[attr-defined]
    module._set_worker_signal_handlers = _set_worker_signal_handlers


def _take_over_worker_sigterm(speedups: Any) -> None:
    """In a DataLoader worker's main thread, once PyTorch's handlers are set: SIGTERM
    finishes the trace, then ends the worker as PyTorch's handler would."""
    try:
        if threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGTERM, _handler)
        _previous[signal.SIGTERM] = WORKER_EXIT
        speedups.note_signal_sender(int(signal.SIGTERM))
        _Watcher.start()
    except Exception:
        pass


#: The names multiprocessing gives its pools' worker processes.
_POOL_WORKERS = ("ForkPoolWorker", "SpawnPoolWorker", "ForkServerPoolWorker")


def ended_by_its_parent(signum: int) -> bool:
    """Whether ``signum`` is how this worker's parent ends it, a normal end and not a
    process killed: a multiprocessing pool's ``terminate()`` (``with Pool()`` leaves so:
    a SIGTERM to each worker), or a DataLoader worker's shut-down (``sent_by_parent``)."""
    if sent_by_parent(signum):
        return True
    process = sys.modules.get("multiprocessing.process")
    try:
        return signum == signal.SIGTERM and process is not None and \
            process.current_process().name.startswith(_POOL_WORKERS)
    except Exception:
        return False


def sent_by_parent(signum: int) -> bool:
    """Whether ``signum`` ends a DataLoader worker as its parent's shutdown does (a
    SIGTERM from the parent, or from a sender not known): a normal end."""
    if _previous.get(signum) is not WORKER_EXIT:
        return False
    from .engine import speedups

    try:
        sender = speedups.signal_sender(signum) if speedups is not None else 0
    except Exception:
        sender = 0
    return sender in (0, os.getppid())


def uninstall() -> None:
    """Put back the handlers that were there before :func:`install`."""
    if threading.current_thread() is not threading.main_thread():
        return  # ours stay; they only chain to the previous ones without a session
    for sig, prev in list(_previous.items()):
        if prev is WORKER_EXIT:
            continue  # PyTorch's handler cannot be put back from Python; ours ends the worker as it did
        try:
            if signal.getsignal(sig) is _handler:
                signal.signal(sig, prev)
        except (ValueError, OSError, RuntimeError):
            continue
        del _previous[sig]
    _Watcher.stop()


def installed() -> dict[int, Any]:
    """Signals handled now, each with the handler it chains to."""
    return {s: p for s, p in _previous.items() if signal.getsignal(s) is _handler}


def redeliver_pending() -> None:
    """Send again the signals deferred while initialize()/finalize() ran (unless
    the process is already ending of an earlier signal)."""
    if _ending.locked():
        return
    while _pending:
        os.kill(os.getpid(), _pending.pop(0))


def after_fork() -> None:
    """In a forked child: the watcher thread is gone and its pipe is shared with the
    parent; give the child a pipe and a watcher of its own."""
    global _ending
    _ending = threading.Lock()
    _Watcher.after_fork()


def _terminating(signum: int) -> bool:
    return signum in _previous and _previous[signum] in (signal.SIG_DFL, WORKER_EXIT) and \
        signal.getsignal(signum) is _handler


#: True while the handler writes the buffered events before calling the
#: application's handler: signals arriving meanwhile wait for that handler.
_chaining = False


def _handler(signum: int, frame: Any) -> Any:
    global _chaining
    prev = _previous.get(signum, signal.SIG_DFL)
    if _chaining:  # the application's handler for an earlier signal comes first
        _pending.append(signum)
        return None
    if CALLBACKS.busy():
        # The signal interrupted initialize()/finalize() on this thread; running
        # finalize now would see half a session. They send it again when done.
        if prev in (signal.SIG_DFL, WORKER_EXIT):
            _pending.append(signum)
            return None
        return prev(signum, frame) if callable(prev) else None
    if prev in (signal.SIG_DFL, WORKER_EXIT):
        _end_with(signum, on_main=True)
        return None
    _chaining = True
    try:
        CALLBACKS.flush()
    except BaseException:
        pass
    finally:
        _chaining = False
    try:
        return prev(signum, frame) if callable(prev) else None
    finally:
        redeliver_pending()


def _end_with(signum: int, on_main: bool) -> None:
    """Finish the trace, then die of ``signum`` as the default action would."""
    if not _ending.acquire(blocking=False):
        if not on_main:
            return  # the main thread is already at it
        # The watcher is finishing the trace and will end the process; wait for it
        # (bounded), then end it here if it has not.
        deadline = time.monotonic() + CALLBACKS.deadline() + 2.0
        while time.monotonic() < deadline:
            time.sleep(0.01)
    else:
        try:
            CALLBACKS.finish(signum)
        except BaseException:
            pass
    _die(signum)


def _die(signum: int) -> None:
    if sent_by_parent(signum):
        os._exit(0)  # as PyTorch's worker handler leaves at its parent's SIGTERM
    if threading.current_thread() is threading.main_thread():
        try:
            signal.signal(signum, signal.SIG_DFL)
        except (ValueError, OSError, RuntimeError):
            pass
    else:  # signal.signal() is for the main thread; the C library has no such rule
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.signal.restype = ctypes.c_void_p
            libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
            libc.signal(signum, None)  # None: NULL, which is SIG_DFL
        except Exception:
            os._exit(128 + signum)  # the nearest we can get: the shell's status
    os.kill(os.getpid(), signum)
    if threading.current_thread() is not threading.main_thread():
        time.sleep(5.0)  # the signal ends the process; nothing after it may run
        os._exit(128 + signum)


def _main_frame_key() -> Any:
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    return None if frame is None else (id(frame), frame.f_lasti)


def _identity(fd: int) -> tuple[int, int] | None:
    """What ``fd`` refers to now (None: it is closed)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _pipe_out_of_the_way() -> tuple[int, int]:
    """A pipe (its write end non-blocking) at numbers a program seldom reaches: one
    that closes every fd it did not open (a daemon's ``closerange``) and opens files
    again gets the lowest free numbers, never ours (see ``_Watcher._run``)."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        import fcntl
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        top = 1024 if soft == resource.RLIM_INFINITY else min(soft, 1024)
        if top > 256:
            moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, top - 16) for fd in (r, w)]
            for fd in (r, w):
                os.close(fd)
            r, w = moved
    except Exception:
        pass
    return r, w


class _Watcher:
    """The daemon thread that reads the signal wakeup fd (see the module doc)."""

    thread: threading.Thread | None = None
    pipe: tuple[int, int] | None = None
    chained = -1  # the wakeup fd that was set before ours (-1: none)

    @classmethod
    def start(cls) -> None:
        if cls.pipe is not None:
            return
        try:
            r, w = _pipe_out_of_the_way()
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError, AttributeError):
            return
        cls.pipe, cls.chained = (r, w), old
        ends = [_identity(r), _identity(w)]  # what the pipe's ends are (see _ours)
        cls.thread = threading.Thread(target=cls._run, args=(r, w, ends), name="dftrace-signals",
                                      daemon=True)
        try:
            cls.thread.start()
        except RuntimeError as exc:  # no thread to be had (RLIMIT_AS, a pids limit)
            cls.stop()
            cls.thread = None
            for fd in (r, w):
                os.close(fd)
            # The handlers stay: the trace is finished at a signal all the same,
            # unless the main thread is blocked in native code when it comes.
            STATE.warn_once("signal-watcher", f"{limit_refused(exc) or exc}: tracing goes on "
                            "without the signal watcher (a signal that arrives while the main "
                            "thread is blocked in native code waits for it)")

    @classmethod
    def stop(cls) -> None:
        pipe = cls.pipe
        if pipe is None:
            return
        try:
            current = signal.set_wakeup_fd(cls.chained)
            if current != pipe[1]:  # someone replaced ours since: leave theirs
                signal.set_wakeup_fd(current)
        except (ValueError, OSError):
            pass
        cls.pipe = None
        try:
            os.write(pipe[1], b"\0")  # wake the thread so it ends (and closes the pipe)
        except OSError:
            pass

    @classmethod
    def after_fork(cls) -> None:
        if cls.pipe is None:
            return
        r, w = cls.pipe
        chained = cls.chained
        cls.pipe = None
        cls.thread = None
        try:
            if threading.current_thread() is threading.main_thread():
                current = signal.set_wakeup_fd(chained)
                if current != w:
                    signal.set_wakeup_fd(current)
        except (ValueError, OSError):
            pass
        for fd in (r, w):
            try:
                os.close(fd)
            except OSError:
                pass
        if threading.current_thread() is threading.main_thread():
            cls.start()

    @classmethod
    def _ours(cls, r: int, w: int, ends: list[Any]) -> bool:
        """Whether the pipe's numbers still are the pipe: the program may have closed
        them (a daemon's ``closerange``). Then, where both numbers are free, a new
        pipe takes them (the wakeup fd stays a pipe of ours, never a file the program
        opens later); where not, they are the program's, never read nor closed."""
        if [_identity(r), _identity(w)] == ends:
            return True
        if _identity(r) is not None or _identity(w) is not None:
            return False
        try:
            nr, nw = os.pipe()
            os.set_blocking(nw, False)
            os.dup2(nr, r, inheritable=False)
            os.dup2(nw, w, inheritable=False)
            for fd in (nr, nw):
                os.close(fd)
        except OSError:
            return False
        ends[:] = [_identity(r), _identity(w)]
        return True

    @classmethod
    def _run(cls, r: int, w: int, ends: list[Any]) -> None:
        while True:
            if not cls._ours(r, w, ends):
                return
            try:
                data = os.read(r, 512)
            except InterruptedError:
                continue
            except OSError:
                return
            if not data and cls.pipe is not None and cls.pipe[0] == r:
                continue  # its write end was closed by the program: _ours() looks
            if not data or cls.pipe is None or cls.pipe[0] != r:
                break  # stopped (a later session has a pipe of its own)
            chained = cls.chained
            if chained >= 0:
                try:
                    os.write(chained, data)
                except OSError:
                    pass
            for signum in set(data):
                if signum and _terminating(signum):
                    cls._maybe_end(signum)
        if cls._ours(r, w, ends):
            for fd in (r, w):
                try:
                    os.close(fd)
                except OSError:
                    pass

    @classmethod
    def _maybe_end(cls, signum: int) -> None:
        """End the process with ``signum`` if the main thread cannot: it has not
        taken the signal up and its Python frame has not moved (it is in C)."""
        before = _main_frame_key()
        deadline = time.monotonic() + MAIN_GRACE_S
        while time.monotonic() < deadline:
            time.sleep(0.01)
            if _ending.locked():
                return  # the main thread's handler runs
        if (_main_frame_key() != before or _ending.locked() or CALLBACKS.active()
                or _chaining or signum in _pending):
            return  # the main thread runs Python code (or has deferred the signal)
        _end_with(signum, on_main=False)


def run_on_main_thread(fn: Callable[[], Any]) -> bool:
    """Have the main thread call ``fn`` the next time it runs Python code (for
    what only the main thread may do, like installing signal handlers). False when
    this Python cannot schedule it."""
    try:
        import ctypes

        proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)

        def call(_arg: Any) -> int:
            _scheduled.remove(cb)
            try:
                fn()
            except BaseException:
                pass
            return 0

        cb = proto(call)
        _scheduled.append(cb)  # kept alive until it has run
        add = ctypes.pythonapi.Py_AddPendingCall
        add.restype = ctypes.c_int
        add.argtypes = (proto, ctypes.c_void_p)
        if add(cb, None) != 0:
            _scheduled.remove(cb)
            return False
        return True
    except Exception:
        return False


_scheduled: list[Any] = []
