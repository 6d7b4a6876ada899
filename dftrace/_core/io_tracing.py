"""File I/O tracing (``io=True``, ``DFTRACE_IO=1``, ``dftrace run --io``).

The C module ``dftrace._core._io`` writes wrappers of libc's file calls (the open
family, close, read/write and their p/v forms, lseek, fsync, ftruncate, the stat
family, mmap, dup, fcntl, unlink, rename, mkdir, and STDIO's fopen ... fclose) into
the GOT of every loaded object: the interpreter, C extensions, libraries loaded
later. A call on a traced file writes a 64-byte binary record into a ring; this
module's thread drains the ring every ``DRAIN_INTERVAL`` seconds and hands the calls
to the engine as trace records with their values raw, which the writer makes lines
(``cat`` POSIX or STDIO, the call's name, args ``fhash``, ``ret``, ``count``,
``offset``), with one ``FH`` metadata record per file naming its path. Each file's counters are kept whatever is written, and written
at the end as ``io_file`` metadata records, with one ``io`` record of the totals.

Which files: ``data_dir`` (colon-separated prefixes, matched on the absolute,
normalised path; ``all`` or unset: every file) minus the built-in exclusions: the
kernel's (``/proc``, ``/sys``, ``/dev``), the interpreter's and its packages',
Python sources and caches, the directories of ``sys.path`` and those above the
interpreter's themselves (the import system's look-ups), and the trace files.

Children: a forked child keeps the wrappers and drains into its own file; a
spawned Python child (spawn, forkserver, subprocess) starts them from the
environment (``DFTRACE_IO=1``). A program that is not Python runs untouched.

A program that ends with ``os._exit`` skips ``atexit``: ``os._exit`` is wrapped so
that the calls recorded since the last drain, and the counters, are handed on first
(``_exit_after_the_last_drain``).
"""

from __future__ import annotations

import os
import site
import sys
import threading
import time
from typing import Any

from ..format import names as fmt
from .records import META, kind_id
from .state import STATE

__all__ = ["IOTracer", "start", "DRAIN_INTERVAL", "RING_SLOTS"]

#: Seconds between drains of the ring.
DRAIN_INTERVAL = 0.05
#: Records the ring holds (64 bytes each): 2.6 M calls/s drained without a drop.
RING_SLOTS = 1 << 17
#: Endings of paths never traced: Python's sources, caches and extension modules.
EXCLUDED_ENDINGS = [".py", ".pyc", ".pth", ".so", "/__pycache__"]
#: Prefixes never traced: the kernel's files.
KERNEL_PREFIXES = ["/proc/", "/sys/", "/dev/"]


def _dir_prefix(path: str) -> str:
    p = os.path.abspath(path)
    return p if p.endswith("/") else p + "/"


def traced_prefixes(data_dir: str | None) -> list[str]:
    """The absolute prefixes ``data_dir`` names (empty: every file). A prefix that is
    a symbolic link is matched both as given and as resolved."""
    if not data_dir or data_dir.strip().lower() == "all":
        return []
    out: list[str] = []
    for part in data_dir.split(":"):
        if not part.strip():
            continue
        for p in (os.path.abspath(part), os.path.realpath(part)):
            if p not in out:
                out.append(p)
    return out


def excluded_prefixes(trace_prefix: str) -> list[str]:
    """The prefixes never traced: the kernel's, the interpreter's and its packages',
    dftrace's own, and the trace files' (``<prefix>-...``)."""
    dirs = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    try:
        dirs += site.getsitepackages()
    except Exception:
        pass
    user = getattr(site, "USER_SITE", None)
    if user:
        dirs.append(user)
    out = list(KERNEL_PREFIXES)
    for d in dirs:
        p = _dir_prefix(d)
        if p not in out and p != "/":
            out.append(p)
    out.append(os.path.abspath(trace_prefix) + "-")
    return out


#: The directories of the import path of the process that started tracing, handed to
#: its children: a child started afresh (spawn, forkserver, a Python subprocess)
#: starts tracing before the interpreter puts its own first entry on ``sys.path``,
#: and before multiprocessing gives it its parent's path.
IMPORT_DIRS_ENV = "DFTRACE_IMPORT_DIRS"


def _first_path_entry() -> list[str]:
    """What the interpreter puts first on ``sys.path`` (maybe not yet: tracing starts
    at interpreter start for a child): the script's directory, or the current one for
    ``-c``, ``-m`` and the prompt; none with ``-P``."""
    if getattr(sys.flags, "safe_path", False):
        return []
    script = sys.argv[0] if sys.argv else ""
    if script in ("", "-c", "-m"):
        return [os.getcwd()]
    return [os.path.dirname(os.path.abspath(script)), os.path.dirname(os.path.realpath(script))]


def import_dirs(excluded: list[str]) -> list[str]:
    """Directories never traced themselves (their files may be): those of
    ``sys.path``, which the import system looks up (with the entry the interpreter
    puts first, and those of the parent's path: ``IMPORT_DIRS_ENV``), and each
    directory above an excluded prefix (the interpreter's, its packages'), which
    resolving a module's real path looks up, component by component."""
    out: list[str] = []
    try:
        first = _first_path_entry()
    except Exception:
        first = []
    inherited = [p for p in os.environ.get(IMPORT_DIRS_ENV, "").split(os.pathsep) if p]
    for p in [*sys.path, *first, *inherited]:
        try:
            a = os.path.abspath(p or ".")
        except Exception:
            continue
        if a not in out:
            out.append(a)
    for prefix in excluded:
        if prefix in KERNEL_PREFIXES or not prefix.endswith("/"):  # the trace files'
            continue
        d = prefix.rstrip("/")
        while d and d != "/":
            if d not in out:
                out.append(d)
            d = os.path.dirname(d)
    return out[:64]


#: The tracer of this process, for ``os._exit`` (see ``_exit_after_the_last_drain``).
_tracer: IOTracer | None = None
#: ``os._exit`` as the interpreter gave it.
_os_exit = os._exit


def _exit_after_the_last_drain(*args: Any, **kwargs: Any) -> Any:
    """``os._exit``, once this process's tracer has drained its last calls and written
    its counters, and the writer has them (a process that ends this way skips
    ``atexit``; the writer thread's file then has no closing ``]``). Where the tracer is
    another process's (a child forked from C, which no Python at-fork hook reached),
    or stopped already, ``os._exit`` alone."""
    if _tracer is not None:
        try:
            _tracer.end_before_exit()
        except BaseException:
            pass
    return _os_exit(*args, **kwargs)


_exit_after_the_last_drain.__wrapped__ = _os_exit  # type: ignore[attr-defined]


class IOTracer:
    """The wrappers bound in this process and the thread that drains their calls."""

    def __init__(self, session: Any, mod: Any, engine: Any, kids: tuple[int, ...]):
        global _tracer
        self._session = session
        self._mod = mod
        self._engine = engine
        self._kids = kids
        self._sink = engine.speedups.io_sink()
        self._max_rate = session.config.io_max_rate
        head = b'{"name":"%%s","cat":"%s","pid":%%d,"tid":%%d,"ph":"%s","args":{"%s":"%%s",' % (
            fmt.CAT_TRACER.encode(), fmt.PH_METADATA.encode(), fmt.ARG_HOSTNAME_HASH.encode())
        ids = (session.pid, session.pid, session.hhash.encode())
        self._fh_head = head % (fmt.META_FILE_HASH.encode(), *ids) + b'"name":'
        self._counters_head = head % (b"io_file", *ids)
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one drain at a time (the thread's, stop's)
        self.written = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="dftrace-io", daemon=True)
        self._thread.start()
        _tracer = self
        if os._exit is _os_exit:
            os._exit = _exit_after_the_last_drain

    def _run(self) -> None:
        while not self._stop.wait(DRAIN_INTERVAL):
            try:
                self.drain()
            except Exception as exc:
                STATE.warn_once("io-drain", f"file I/O tracing stopped: {exc!r}")
                return

    def drain(self) -> None:
        """Hand the calls recorded since the last drain to the engine."""
        with self._lock:
            now = time.monotonic()
            # at least one interval's worth: a drain sooner than the thread's (the
            # last one, at stop) does not fold a short program's burst
            window = max(now - self._last, DRAIN_INTERVAL)
            cap = -1 if not self._max_rate else max(1, int(self._max_rate * window))
            self._last = now
            self._mod.bind_new()
            lines, written, dropped = self._mod.drain(cap, self._fh_head, self._counters_head,
                                                      self._session.offset_ns, self._sink, self._kids)
            self.written += written
            self.dropped += dropped
            if lines:
                self._engine.record_special(META, {"lines": lines})

    def stop(self) -> None:
        """Unbind the wrappers, drain what is left and write the counters."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._mod.uninstall()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        try:
            self.drain()
        except Exception as exc:
            STATE.warn_once("io-drain", f"file I/O tracing: the last calls were lost: {exc!r}")
        self._write_counters()

    def end_before_exit(self) -> None:
        """Before ``os._exit``, in this tracer's own process: :meth:`stop`, and the
        writer given what it recorded (bounded)."""
        session = self._session
        if session.pid != os.getpid() or session.finalized:  # (a multiprocessing child's ended first)
            return
        self.stop()
        if session.writer is not None:  # the writer thread's file too
            session.writer.sync(min(1.0, session.config.shutdown_timeout))

    def _write_counters(self) -> None:
        record = self._engine.record_special
        lines = self._mod.counter_lines(self._session.offset_ns, self._counters_head)
        if lines:
            record(META, {"lines": lines})
        stats = self._mod.stats()
        lost = stats["dropped"] + self.dropped
        if not (stats["calls"] or lost or lines):  # no file call traced: a process that recorded
            return                                 # nothing writes no file (multiprocessing's helpers)
        record(META, {"name": "io", "args": {
            "calls": stats["calls"], "events": self.written,
            "aggregated_calls": stats["aggregated_calls"], "dropped": lost,
            "counter_cuts": stats["counter_cuts"]}})
        if lost:
            STATE.warn_once("io-dropped", f"file I/O tracing: {lost} calls were not recorded "
                            "(the ring or the buffer was full); the trace's io record counts them")

    def in_child(self, session: Any) -> IOTracer:
        """The tracer of a forked child (the wrappers stay bound; the ring is the
        child's from the fork on, its counters afresh: the C at-fork handler's)."""
        return IOTracer(session, self._mod, self._engine, self._kids)


def start(session: Any) -> IOTracer | None:
    """Bind the wrappers and start draining; None, with one warning, where file I/O
    cannot be traced (not Linux, the C engine off, the module not built)."""
    from . import engine as _engine

    if _engine.speedups is None:
        STATE.warn_once("io", "file I/O is not traced: it needs the C engine "
                        "(DFTRACE_NO_SPEEDUPS is set, or the engine was not built)")
        return None
    try:
        from . import _io
    except ImportError as exc:
        STATE.warn_once("io", f"file I/O is not traced in this process: {exc}")
        return None
    config = session.config
    names = _io.op_names()
    first_stdio = names.index("fopen")
    kids = tuple(kind_id(n, "STDIO" if i >= first_stdio else "POSIX") for i, n in enumerate(names))
    try:
        excluded = excluded_prefixes(session.prefix)[:64]
        _io.install(RING_SLOTS, traced_prefixes(config.data_dir)[:64], excluded,
                    EXCLUDED_ENDINGS, import_dirs(excluded), _engine.speedups.__file__)
    except (OSError, ValueError, RuntimeError) as exc:
        STATE.warn_once("io", f"file I/O is not traced in this process: {exc}")
        return None
    if config.inherit:
        paths = (os.path.abspath(p or ".") for p in sys.path if isinstance(p, str))
        session.export({IMPORT_DIRS_ENV: os.pathsep.join(p for p in paths if os.pathsep not in p)})
    try:
        return IOTracer(session, _io, _engine, kids)
    except RuntimeError as exc:  # no thread to be had
        _io.uninstall()
        STATE.warn_once("io", f"file I/O is not traced in this process: {exc}")
        return None
