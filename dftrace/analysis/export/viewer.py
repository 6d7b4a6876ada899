"""``dftrace view``: a trace opened in Perfetto's UI in one command.

The trace is served over HTTP on 127.0.0.1 (port 9001 by default, the one Perfetto's
own ``open_trace_in_ui`` uses) with a CORS header for the UI's origin, and the UI is
opened at ``<ui>/#!/?url=http://127.0.0.1:<port>/<name>``: the browser fetches the
file from this machine, or, on a remote one, through an SSH tunnel of that port.
Nothing is uploaded: the UI loads the trace into its in-browser engine.

What is served: a ``.pftrace`` as it is, and a single Chrome JSON or pfw file that
Perfetto reads (plain or gzip) up to :data:`SERVE_AS_IS_BYTES`; anything else (a
directory, several files, a big or zstd-compressed file, Parquet) is merged (ranks in
order, each host's clocks aligned) into a ``.pftrace`` in a temporary folder, removed
when the command ends, or written where ``output`` says and kept.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import urllib.parse
import webbrowser
from collections.abc import Iterator, Sequence
from typing import Any

from ..answers.units import count_of
from .perfetto import PERFETTO, SUFFIXES
from .streamed import merge_files

#: Perfetto's hosted UI.
DEFAULT_UI = "https://ui.perfetto.dev"
DEFAULT_PORT = 9001
#: A single JSON or pfw file up to this size on disk is served as it is; a bigger
#: one is converted (Perfetto's JSON import holds the whole text and offers less).
SERVE_AS_IS_BYTES = 64 << 20
_AS_IS = (*SUFFIXES, ".json", ".json.gz", ".pfw", ".pfw.gz")


def _served_as_is(paths: Sequence[str]) -> str | None:
    """The one file of ``paths`` when the UI can open it as it is, else None."""
    if len(paths) != 1 or not os.path.isfile(paths[0]):
        return None
    path = paths[0]
    if path.endswith(SUFFIXES) or (path.endswith(_AS_IS) and os.path.getsize(path) <= SERVE_AS_IS_BYTES):
        return path
    return None


def _stem(paths: Sequence[str]) -> str:
    """A name for the converted trace: the input's, without its suffixes."""
    name = os.path.basename(os.path.normpath(paths[0])) if len(paths) == 1 else "trace"
    name = name.split(".")[0] or "trace"
    return name + SUFFIXES[0]


@contextlib.contextmanager
def viewable(paths: Sequence[str], output: str | None = None, **options: Any) -> Iterator[str]:
    """The file to serve for ``paths``: one the UI opens as it is, or a ``.pftrace``
    merged from them (at ``output``, else in a temporary folder removed on exit).
    ``options`` go to the merge (executor, partition_bytes, progress)."""
    as_is = None if output else _served_as_is(paths)
    if as_is is not None:
        yield as_is
        return
    folder = None if output else tempfile.mkdtemp(prefix="dftrace-view-")
    target = output or os.path.join(folder, _stem(paths))  # type: ignore[arg-type]
    try:
        print(f"converting to {target}{' (removed when this command ends)' if folder else ''}", flush=True)
        written = merge_files(list(paths), target, to=PERFETTO, **options)
        print(f"wrote {os.path.getsize(target) / 1e6:.1f} MB: {count_of(written.events, 'event')} of "
              f"{count_of(written.trace.processes.height, 'process', 'processes')}", flush=True)
        yield target
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


class _TraceServer(http.server.ThreadingHTTPServer):
    """Serves one file at ``/<name>`` to the UI's origin; sets ``fetched`` once the
    whole file has been sent."""

    daemon_threads = True

    def __init__(self, port: int, path: str, origin: str):
        self.path = path
        self.name = os.path.basename(path)
        self.origin = origin
        self.fetched = threading.Event()
        super().__init__(("127.0.0.1", port), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _TraceServer

    def _headers(self, status: int, length: int = 0) -> None:
        self.send_response(status)
        self.send_header("Access-Control-Allow-Origin", self.server.origin)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Length", str(length))
        if status == 200:
            self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()

    def do_OPTIONS(self) -> None:  # noqa: N802 (the http.server's name)
        self.send_response(204)
        self.send_header("Access-Control-Allow-Origin", self.server.origin)
        self.send_header("Access-Control-Allow-Methods", "GET, OPTIONS")
        self.send_header("Access-Control-Allow-Headers", "*")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        if urllib.parse.unquote(self.path.split("?")[0]) != "/" + self.server.name:
            self._headers(404)
            return
        size = os.path.getsize(self.server.path)
        self._headers(200, size)
        with open(self.server.path, "rb") as fh:
            shutil.copyfileobj(fh, self.wfile, 1 << 20)
        self.wfile.flush()
        self.server.fetched.set()

    def log_message(self, format: str, *args: Any) -> None:  # the UI's requests are not news
        pass


def _remote() -> bool:
    """Whether this looks like a machine the user reached over SSH, or one with no display."""
    if os.environ.get("SSH_CONNECTION") or os.environ.get("SSH_TTY"):
        return True
    return sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _origin(ui: str) -> str:
    parts = urllib.parse.urlsplit(ui)
    if not parts.scheme or not parts.netloc:
        raise ValueError(f"--ui wants the UI's URL, such as {DEFAULT_UI}; got {ui!r}")
    return f"{parts.scheme}://{parts.netloc}"


def ui_url(ui: str, port: int, name: str) -> str:
    """The UI's address that opens the trace served at ``port`` as ``name``."""
    return f"{ui.rstrip('/')}/#!/?url=http://127.0.0.1:{port}/{urllib.parse.quote(name)}"


def serve(path: str, *, port: int = DEFAULT_PORT, ui: str = DEFAULT_UI, browser: bool = True,
          once: bool = False) -> int:
    """Serve ``path`` to the UI at ``ui`` and open it there (``browser``; never
    failing where there is none); print the URL and, on a remote machine, the SSH
    tunnel to make. Serves until Ctrl-C, or with ``once`` until the UI has fetched
    the file. Returns the exit code."""
    try:
        server = _TraceServer(port, path, _origin(ui))
    except OSError as exc:
        raise OSError(f"cannot serve on 127.0.0.1:{port} ({exc.strerror or exc}): another 'dftrace view' or a "
                      f"trace_processor may hold it; stop it, or use --port") from None
    port = server.server_address[1]  # the one bound (port 0: any free one)
    url = ui_url(ui, port, server.name)
    thread = threading.Thread(target=server.serve_forever, name="dftrace-view", daemon=True)
    thread.start()
    try:
        print(f"serving {path} at http://127.0.0.1:{port}/{urllib.parse.quote(server.name)}")
        print(f"open {url}")
        if _remote():
            print(f"on another machine, forward the port first: ssh -L {port}:127.0.0.1:{port} {socket.gethostname()}")
        print("serving until the UI has fetched it" if once else "Ctrl-C stops", flush=True)
        if browser and not _remote():
            with contextlib.suppress(Exception):
                webbrowser.open(url)
        while not server.fetched.wait(0.2):
            pass
        print(f"the UI fetched {server.name}", flush=True)
        while not once:
            server.fetched.wait(3600)
    finally:
        server.shutdown()
        server.server_close()
    return 0


def view(paths: Sequence[str], *, port: int = DEFAULT_PORT, ui: str = DEFAULT_UI, browser: bool = True,
         once: bool = False, output: str | None = None, **options: Any) -> int:
    """``dftrace view``: ``paths`` made viewable (:func:`viewable`) and served
    (:func:`serve`). Ctrl-C ends it, with exit code 0."""
    _origin(ui)  # a wrong --ui, --port or -o fails before any work
    if not 0 <= port <= 65535:
        raise ValueError(f"--port wants a port from 0 to 65535 (0: any free one), got {port}")
    if output is not None and not output.endswith(".pftrace"):
        raise ValueError(f"-o {output}: the trace made for the UI is Perfetto's protobuf; name it FILE.pftrace")
    try:
        with _ended_by_signals():
            with viewable(paths, output, **options) as path:
                return serve(path, port=port, ui=ui, browser=browser, once=once)
    except KeyboardInterrupt:
        print("stopped", flush=True)
        return 0
    except _Ended as exc:  # the temporary folder is gone: end as the signal would have
        signal.signal(exc.signum, signal.SIG_DFL)
        os.kill(os.getpid(), exc.signum)
        return 128 + exc.signum


class _Ended(Exception):
    """SIGTERM or SIGHUP, raised where the command is, so that its files are removed."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _ended_by_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``_Ended`` meanwhile (their default would end the
    process without removing the temporary folder); on the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_ended(signum: int, frame: Any) -> None:
        raise _Ended(signum)

    before = {signum: signal.signal(signum, raise_ended) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
