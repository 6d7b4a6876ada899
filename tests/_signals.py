"""The signal dispositions of a program started from a terminal, for the processes
tests start and signal."""

from __future__ import annotations

import signal

#: Signals a program started from a terminal has at their default action.
_DEFAULT_SIGNALS = ("SIGINT", "SIGHUP", "SIGTERM", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")


def default_signals() -> None:
    """In a child before exec: the signal dispositions of a program started from a
    terminal. A test runner started under ``nohup`` (SIGHUP ignored) or in the
    background (SIGINT ignored) passes those on to its children, and the tests that
    signal them need the default actions."""
    for name in _DEFAULT_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
