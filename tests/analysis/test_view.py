"""``dftrace view``: the trace served on loopback to Perfetto's UI, the URL that opens it,
the SSH tunnel for a remote machine, and the ways it ends (Ctrl-C, or --once after the
UI fetched the trace)."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import tracegen
from _signals import default_signals

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis.commands import main  # noqa: E402
from dftrace.analysis.export import viewer  # noqa: E402

RANKS = 2


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("view") / "traces"
    directory.mkdir()
    tracegen.write_run(directory, ranks=RANKS)
    return directory


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _View:
    """``dftrace view ARGS`` in a process of its own, SIGINT at its default (Python's
    handler) whatever this test run ignores; its output read line by line as it comes."""

    def __init__(self, *args: str, env: dict[str, str] | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dftrace", "view", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})},
            preexec_fn=default_signals)
        self.lines: queue.Queue[str] = queue.Queue()
        self.said: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.put(line.rstrip("\n"))

    def lines_until(self, prefix: str) -> list[str]:
        """The lines it prints up to the first that starts with ``prefix``."""
        lines: list[str] = []
        while True:
            try:
                line = self.lines.get(timeout=120)
            except queue.Empty:
                raise AssertionError(f"no line starting {prefix!r} came; it said {self.said + lines}") from None
            lines.append(line)
            if line.startswith(prefix):
                self.said += lines
                return lines

    def end(self, interrupt: bool = True) -> tuple[int, str, str]:
        """Its exit code, the rest of its output and its errors, after Ctrl-C (or none)."""
        if interrupt:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        rest = []
        while not self.lines.empty():
            rest.append(self.lines.get())
        return self.proc.returncode, "\n".join(rest), self.proc.stderr.read()  # type: ignore[union-attr]


def test_view_converts_a_directory_serves_it_with_cors_and_stops_on_ctrl_c(traces):
    """A directory is merged into a .pftrace in a temporary folder; the URL that opens it
    in ui.perfetto.dev is printed with the tunnel to make from another machine; the file
    is served to the UI's origin (and nothing else is); Ctrl-C ends the command with
    exit code 0, no traceback, and the temporary folder gone."""
    port = _free_port()
    view = _View(str(traces), "--no-browser", "--port", str(port), env={"SSH_CONNECTION": "10.0.0.2 5 10.0.0.1 22"})
    try:
        lines = view.lines_until("Ctrl-C stops")
        url = f"http://127.0.0.1:{port}/traces.pftrace"
        assert f"open https://ui.perfetto.dev/#!/?url={url}" in lines
        assert f"on another machine, forward the port first: ssh -L {port}:127.0.0.1:{port} {socket.gethostname()}" \
            in lines
        converted = re.match(r"converting to (\S+) \(removed when this command ends\)$", lines[0])
        assert converted and converted.group(1).endswith("/traces.pftrace")
        assert lines[1].endswith(f"MB: {RANKS * len(tracegen.training_process(1).events)} events of {RANKS} processes")
        with urllib.request.urlopen(url, timeout=60) as reply:
            assert reply.headers["Access-Control-Allow-Origin"] == "https://ui.perfetto.dev"
            assert reply.read() == Path(converted.group(1)).read_bytes()
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/etc/passwd", timeout=60)
        assert missing.value.code == 404
        assert view.lines_until("the UI fetched") == ["the UI fetched traces.pftrace"]
    finally:
        code, out, err = view.end()
    assert code == 0 and "Traceback" not in err, err
    assert out == "stopped" and not os.path.exists(converted.group(1))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_view_ended_by_a_signal_removes_its_folder_and_dies_of_it(traces, signum):
    """SIGTERM (a job's end, ``kill``) and SIGHUP (a closed terminal) end the command as
    they would, its temporary folder removed first."""
    view = _View(str(traces), "--no-browser", "--port", str(_free_port()))
    try:
        lines = view.lines_until("Ctrl-C stops")
        converted = re.match(r"converting to (\S+) \(removed when this command ends\)$", lines[0])
        assert converted and os.path.exists(converted.group(1))
        view.proc.send_signal(signum)
    finally:
        code, _, err = view.end(interrupt=False)
    assert code == -signum and "Traceback" not in err, err
    assert not os.path.exists(os.path.dirname(converted.group(1)))


def test_view_once_serves_a_pftrace_as_it_is_and_exits_after_the_fetch(traces, tmp_path):
    """A .pftrace is served as it is (nothing converted), to the origin of a UI of one's
    own (--ui); with --once the command ends by itself once the file was fetched."""
    trace = tmp_path / "job.pftrace"
    assert main(["convert", str(traces), "-o", str(trace)]) == 0
    port = _free_port()
    view = _View(str(trace), "--once", "--no-browser", "--port", str(port), "--ui", "http://localhost:10000/perfetto/")
    try:
        lines = view.lines_until("serving until the UI has fetched it")
        assert lines[0] == f"serving {trace} at http://127.0.0.1:{port}/job.pftrace"
        assert lines[1] == f"open http://localhost:10000/perfetto/#!/?url=http://127.0.0.1:{port}/job.pftrace"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/job.pftrace", timeout=60) as reply:
            assert reply.headers["Access-Control-Allow-Origin"] == "http://localhost:10000"
            assert reply.read() == trace.read_bytes()
        assert view.lines_until("the UI fetched") == ["the UI fetched job.pftrace"]
    finally:
        code, out, err = view.end(interrupt=False)
    assert code == 0 and out == "" and "Traceback" not in err, err


def test_view_names_the_way_out_when_the_port_is_taken(traces, tmp_path, capsys):
    """A port already in use is an error (exit code 2) that says what may hold it and
    what to do."""
    trace = tmp_path / "job.pftrace"
    assert main(["convert", str(traces), "-o", str(trace)]) == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["view", str(trace), "--no-browser", "--port", str(taken.getsockname()[1])]) == 2
    assert "another 'dftrace view' or a trace_processor may hold it; stop it, or use --port" in capsys.readouterr().err


def test_view_refuses_a_port_out_of_range_and_an_output_it_would_misname(traces, tmp_path, capsys):
    """--port 99999 or -1, and -o x.json (the file is Perfetto's protobuf), are one line
    and exit code 2 before anything is read or written (before: a traceback after the
    conversion; a protobuf file named .json)."""
    for args in (["--port", "99999"], ["--port=-1"], ["-o", str(tmp_path / "x.json")]):
        assert main(["view", str(traces), "--no-browser", "--once", *args]) == 2, args
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "x.json").exists()


def test_view_on_port_0_says_the_port_it_serves_on(traces, tmp_path):
    """--port 0 (any free port): the URL printed is the one served, which the UI can fetch."""
    trace = tmp_path / "job.pftrace"
    assert main(["convert", str(traces), "-o", str(trace)]) == 0
    view = _View(str(trace), "--once", "--no-browser", "--port", "0")
    try:
        first = view.lines_until("serving until the UI has fetched it")[0]
        url = first.rpartition(" at ")[2]
        assert ":0/" not in url, first
        with urllib.request.urlopen(url, timeout=60) as reply:
            assert reply.read() == trace.read_bytes()
    finally:
        code, out, err = view.end(interrupt=False)
    assert code == 0 and "Traceback" not in err, err


def test_view_decides_what_to_convert(traces, tmp_path, monkeypatch):
    """What the UI opens as it is is served as it is (a .pftrace; one small Chrome JSON
    or plain or gzip pfw file); a directory, several files, zstd or a big file are
    converted."""
    files = sorted(str(p) for p in traces.iterdir())
    small = tmp_path / "small.json"
    assert main(["convert", str(traces), "-o", str(small)]) == 0
    assert viewer._served_as_is([str(small)]) == str(small)
    assert viewer._served_as_is([str(tmp_path / "x.pftrace")]) is None  # not there
    assert viewer._served_as_is([str(traces)]) is None
    assert viewer._served_as_is(files) is None
    assert viewer._served_as_is(files[:1]) is None  # .pfw.zst: the UI cannot read zstd
    monkeypatch.setattr(viewer, "SERVE_AS_IS_BYTES", small.stat().st_size - 1)
    assert viewer._served_as_is([str(small)]) is None


def test_a_missing_browser_never_fails_the_view(traces, tmp_path, monkeypatch):
    """Opening a browser that is not there, or that fails, leaves the command serving."""
    trace = tmp_path / "job.pftrace"
    assert main(["convert", str(traces), "-o", str(trace)]) == 0
    monkeypatch.setattr(viewer, "_remote", lambda: False)

    def no_browser(url: str) -> bool:
        raise RuntimeError("could not locate runnable browser")

    monkeypatch.setattr(viewer.webbrowser, "open", no_browser)
    server_started = viewer._TraceServer.__init__
    port = _free_port()

    def fetch_once_started(self, *args):
        server_started(self, *args)
        self.fetched.set()  # as if the UI had fetched it already

    monkeypatch.setattr(viewer._TraceServer, "__init__", fetch_once_started)
    assert viewer.serve(str(trace), port=port, once=True) == 0
