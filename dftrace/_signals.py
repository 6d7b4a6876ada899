"""Finishing the trace when the process is told to stop by a signal.

A process ended by a signal whose action is the default (``SIGTERM`` from a batch
scheduler, ``kill``, a container runtime) never runs ``atexit``, so without help
its last flush interval of events and the closing ``]`` are lost. Handlers are
installed by :func:`dftrace.initialize` (never by ``import dftrace`` alone) and
change nothing the application can observe:

* signal with the default action: finalize the trace, then restore the default
  action and send the signal again, so the process ends exactly as it would have
  (same signal, same exit status, same core-dump rule);
* signal with a handler of the application's (installed before ``initialize``):
  write the buffered events to disk, then call that handler, whatever it does
  (raise, exit, ``os._exit``, or nothing and carry on tracing);
* signal ignored (``SIG_IGN``) or handled outside Python: left alone.

``SIGINT`` normally has Python's own handler, which raises ``KeyboardInterrupt``;
the exception unwinds the program and ``atexit`` completes the trace, so that
handler is left in place (``asyncio.run`` and other libraries install their own
SIGINT handler only when they find Python's one there). SIGINT is taken over only
when its action is the default one.

Handlers run in the main thread when it next executes Python code, as every
Python-level signal handler does. :func:`uninstall` (run by ``finalize``) puts the
previous handlers back unless the application has replaced ours since.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

__all__ = ["install", "uninstall", "installed", "redeliver_pending"]

_NAMES = ("SIGTERM", "SIGINT", "SIGHUP")

#: signal number -> the handler that was there before ours
_previous: dict[int, Any] = {}
#: signals that arrived while this thread was inside initialize()/finalize()
_pending: list[int] = []


def _wanted(sig: int, current: Any) -> bool:
    if current is None or current is signal.SIG_IGN:
        return False  # set outside Python, or ignored: nothing of ours to do
    if sig == signal.SIGINT and current is signal.default_int_handler:
        return False  # KeyboardInterrupt unwinds and atexit finishes the trace
    return current is signal.SIG_DFL or callable(current)


def install() -> None:
    """Install the handlers (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for name in _NAMES:
        sig = getattr(signal, name, None)
        if sig is None or sig in _previous:
            continue
        try:
            current = signal.getsignal(sig)
            if not _wanted(sig, current):
                continue
            signal.signal(sig, _handler)
            _previous[sig] = current
        except (ValueError, OSError, RuntimeError):
            pass  # not the main interpreter, or a platform without this signal


def uninstall() -> None:
    """Put back the handlers that were there before :func:`install`."""
    if threading.current_thread() is not threading.main_thread():
        return  # ours stay; they only chain to the previous ones without a session
    for sig, prev in list(_previous.items()):
        try:
            if signal.getsignal(sig) is _handler:
                signal.signal(sig, prev)
        except (ValueError, OSError, RuntimeError):
            continue
        del _previous[sig]


def installed() -> dict[int, Any]:
    """Signals handled now, each with the handler it chains to."""
    return {s: p for s, p in _previous.items() if signal.getsignal(s) is _handler}


def redeliver_pending() -> None:
    """Send again the signals deferred while initialize()/finalize() ran."""
    while _pending:
        os.kill(os.getpid(), _pending.pop(0))


def _handler(signum: int, frame: Any) -> Any:
    from . import _runtime

    prev = _previous.get(signum, signal.SIG_DFL)
    if _runtime.busy_here():
        # The signal interrupted initialize()/finalize() on this thread; running
        # finalize now would see half a session. They send it again when done.
        if prev is signal.SIG_DFL:
            _pending.append(signum)
            return None
        return prev(signum, frame) if callable(prev) else None
    if prev is signal.SIG_DFL:
        try:
            _runtime.finalize_on_signal()
        except BaseException:
            pass
        try:
            signal.signal(signum, signal.SIG_DFL)
        except (ValueError, OSError):
            pass
        os.kill(os.getpid(), signum)
        return None
    try:
        _runtime.flush_now()
    except BaseException:
        pass
    if callable(prev):
        return prev(signum, frame)
    return None
