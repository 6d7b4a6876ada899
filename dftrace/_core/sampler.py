"""Resource counters: CPU %, memory and I/O of this process, sampled in the background.

Off by default (``sample_interval=0``): then no thread is started and nothing is
imported. With ``sample_interval=S`` (``DFTRACE_SAMPLE_INTERVAL``) a daemon thread
reads the process's counters every ``S`` seconds through psutil and records them
as counter events (``"ph":"C"``) in category ``sys``, one event per group:

* ``cpu``: ``percent``, CPU use since the previous sample (100 = one core busy);
* ``memory``: ``rss_bytes``, ``vms_bytes``, resident and virtual size;
* ``io``: ``read_bytes``, ``write_bytes`` (and ``read_count``, ``write_count`` where
  the OS gives them), totals since the process started;
* ``threads``: ``count``, threads of the process.

Perfetto draws each ``name``/arg pair as a counter track of the process. A counter
the platform cannot provide (``io`` in some containers) is left out, once and for
good; a sampler that fails stops with one warning and never disturbs the run.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ..format import names as fmt
from . import engine as _engine
from .state import STATE
from .records import COUNTER

__all__ = ["Sampler", "start", "CATEGORY"]

#: The category of resource counters (the one DFAnalyzer reads system metrics from).
CATEGORY = fmt.CAT_SYSTEM


class Sampler:
    """A daemon thread that records this process's resource counters."""

    def __init__(self, interval: float):
        import psutil  # only when sampling is on

        self.interval = interval
        self.samples = 0
        self._proc = psutil.Process(os.getpid())
        self._pid = os.getpid()
        self._stop = threading.Event()
        self._io = hasattr(self._proc, "io_counters")
        self._proc.cpu_percent(None)  # the first reading only sets the baseline
        self._thread = threading.Thread(target=self._run, name="dftrace-sampler", daemon=True)
        self._thread.start()

    def _record(self, name: str, args: dict[str, Any]) -> None:
        _engine.record_special(COUNTER, {"name": name, "cat": CATEGORY, "args": args,
                                      "hhash": False}, self._pid)

    def sample(self) -> None:
        """Take one sample now (the thread calls this every interval)."""
        p = self._proc
        with p.oneshot():
            cpu = p.cpu_percent(None)
            mem = p.memory_info()
            threads = p.num_threads()
            io = None
            if self._io:
                try:
                    io = p.io_counters()
                except Exception:  # AccessDenied / not provided here: skip for good
                    self._io = False
        self._record("cpu", {"percent": cpu})
        self._record("memory", {"rss_bytes": mem.rss, "vms_bytes": mem.vms})
        self._record("threads", {"count": threads})
        if io is not None:
            args = {"read_bytes": io.read_bytes, "write_bytes": io.write_bytes}
            for extra in ("read_count", "write_count"):
                v = getattr(io, extra, None)
                if v is not None:
                    args[extra] = v
            self._record("io", args)
        self.samples += 1

    def _run(self) -> None:
        try:
            self.sample()
            while not self._stop.wait(self.interval):
                self.sample()
        except Exception as exc:
            STATE.warn_once("sampler", f"resource sampling stopped: {exc!r}")

    def stop(self) -> None:
        """Stop sampling after one last sample, so the run's end is covered."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        try:
            self.sample()
        except Exception:
            pass


def start(interval: float) -> Sampler | None:
    """A running sampler, or None when ``interval`` is 0 (off) or it cannot start."""
    if not interval:
        return None
    try:
        return Sampler(interval)
    except Exception as exc:
        STATE.warn_once("sampler", f"resource sampling is off: {exc!r}")
        return None
