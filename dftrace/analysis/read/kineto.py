"""Reading PyTorch profiler (Kineto) traces into the events table and the GPU activity table.

A Kineto trace (``torch.profiler`` with ``tensorboard_trace_handler`` or
``export_chrome_trace``, plain or gzip) is one JSON object: ``traceEvents`` plus
``deviceProperties``, ``distributedInfo``, ``baseTimeNanoseconds``, ``host_name``, ...
It is recognised by content, never by file name, and read whole (one partition).

What becomes of it:

- every complete, instant and counter event of the host process becomes a row of
  the events table; GPU activity (kernels, memory copies and sets: events carrying
  ``args.stream``) is put on the host process with ``tid`` = the CUDA stream, and
  thread names ``GPU <device> stream <stream>``. Flow arrows (``ph`` s/f/t) and the
  profiler's own bookkeeping (``pid`` that is not a number) are left out;
- times: Kineto writes ``ts`` in microseconds relative to ``baseTimeNanoseconds``
  (older traces: since the Unix epoch, with no base); the events table has them as
  integer microseconds since the epoch like every other trace;
- ``ProfilerStep#N`` spans carry ``step`` N;
- the rank is ``distributedInfo.rank``; the host is ``host_name`` (which
  ``profile_steps`` writes), else the host in the name of the dftrace file the
  document was written beside, else the file name's stem (so ranks of one job
  never merge into one process);
- the GPU activity table (:func:`activity_schema`) keeps, at nanosecond resolution,
  what the GPU answers need: device-side activity, the runtime/driver calls that
  launched it (joined by ``correlation``) and the ``ProfilerStep#N`` spans.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from typing import Any

import orjson

from ... import format as fmt

#: How much decoded text is looked at to recognise a Kineto document.
SNIFF_BYTES = 1 << 20
# Bytes read (and decoded) first, enough to see how the text starts.
_FIRST_PIECE = 4096
#: Host-side categories whose events carry the ``correlation`` of what they launched.
LAUNCH_CATS = ("cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver")
#: Device-side categories of GPU activity (newer and older Kineto spellings).
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset", "cuda_sync")
#: Categories of the profiler's own events (host and device side).
PROFILER_CATS = ("cpu_op", "user_annotation", "python_function", "gpu_user_annotation", *LAUNCH_CATS, *GPU_CATS)
_PROFILER_STEP = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
_FLOW_PHASES = ("s", "f", "t")


def looks_like_document(head: bytes) -> bool:
    """Tell from the first decoded bytes of a file whether it is a Kineto-style
    document (one JSON object holding ``traceEvents``) rather than one event per line."""
    text = head.lstrip()
    if not text.startswith(b"{") or b'"traceEvents"' not in head:
        return False
    first_line = text.split(b"\n", 1)[0].strip().rstrip(b",")
    try:
        first = orjson.loads(first_line)
    except orjson.JSONDecodeError:
        return True  # a pretty-printed object: its first line is not a whole event
    return isinstance(first, dict) and "traceEvents" in first


def is_document_file(path: str | os.PathLike[str]) -> bool:
    """Whether the file at ``path`` (plain, gzip or zstd) is a Kineto-style document.

    Looks at the first bytes only: a file whose text does not start with ``{`` (every
    dftrace file starts with ``[``) is ruled out before anything is decompressed."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_FIRST_PIECE)
            factory = fmt.member_decoder(raw)
            decoder = factory() if factory is not None else None
            head = raw if decoder is None else decoder.decompress(raw)
            if head.lstrip()[:1] not in (b"", b"{"):
                return False
            rest = fh.read(SNIFF_BYTES - _FIRST_PIECE if decoder is None else SNIFF_BYTES // 4)
            head += rest if decoder is None else decoder.decompress(rest)
    except Exception:  # noqa: BLE001 - unreadable, or a damaged stream: not a document
        return False
    return looks_like_document(head[:SNIFF_BYTES])


_INT64 = range(-(2**63), 2**63)


def _int(value: Any) -> int | None:
    """An integer that fits a 64-bit column, else None."""
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value in _INT64 else None


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def profiler_step(name: Any) -> int | None:
    """N of a ``ProfilerStep#N`` name, else None."""
    match = _PROFILER_STEP.match(name) if isinstance(name, str) else None
    return int(match.group(1)) if match else None


class KinetoDocument:
    """One parsed Kineto trace: its events, time base, rank, host and profiled pid."""

    def __init__(self, doc: dict[str, Any], path: str):
        events = doc.get("traceEvents")
        self.events: list[Any] = events if isinstance(events, list) else []
        base = _int(doc.get("baseTimeNanoseconds"))
        self.base_ns = base or 0
        info = doc.get("distributedInfo")
        self.rank = _int(info.get("rank")) if isinstance(info, dict) else None
        self.host_pid = self._host_pid()
        host = doc.get("host_name")
        self.host = host if isinstance(host, str) and host else _host_from_name(path, self.host_pid)

    def _host_pid(self) -> int:
        """The profiled process: the pid labelled CPU, else the one most CPU-side events have."""
        counts: Counter[int] = Counter()
        for event in self.events:
            if not isinstance(event, dict):
                continue
            pid = _int(event.get("pid"))
            if pid is None:
                continue
            args = event.get("args")
            if event.get("ph") == fmt.PH_METADATA:
                if event.get("name") == "process_labels" and isinstance(args, dict) and args.get("labels") == "CPU":
                    return pid
                continue
            if not (isinstance(args, dict) and "stream" in args) and event.get("cat") not in GPU_CATS:
                counts[pid] += 1
        return counts.most_common(1)[0][0] if counts else 0

    def ns(self, ts: float | int) -> int:
        """A Kineto time (µs, relative to the base) as nanoseconds since the epoch."""
        return self.base_ns + us_to_ns(ts)


def us_to_ns(us: float | int) -> int:
    """Microseconds as whole nanoseconds, without the float error of ``us * 1000``
    (epoch microseconds times 1000 exceed a double's exact integers)."""
    if isinstance(us, int):
        return us * 1000
    whole = math.floor(us)
    return int(whole) * 1000 + round((us - whole) * 1000)


#: ``profile_steps``' file names: the dftrace file's name, then the profiled steps.
_WINDOW_NAME = re.compile(r"^(?P<stem>.+)\.steps-\d+-\d+\.pt\.trace\.json(\.gz|\.zst)?$")


def _host_from_name(path: str, pid: int) -> str:
    """The host of a document that does not name it: the host in the name of the
    dftrace file it was written beside (``profile_steps``' naming, when that file's
    pid is the profiled one), else the file name's first component (so ranks of one
    job never merge into one process)."""
    base = os.path.basename(path)
    window = _WINDOW_NAME.match(base)
    if window is not None:
        parsed = fmt.parse_trace_filename(window["stem"] + ".pfw")
        if parsed is not None and parsed.pid == pid:
            return parsed.host
    return base.split(".", 1)[0] or "unknown"


#: Columns of the GPU activity table, at nanosecond resolution. ``stream`` is set for
#: device-side activity and null for host-side rows (launches and profiler steps).
ACTIVITY_COLUMNS = ("pid", "tid", "cat", "name", "start_ns", "end_ns", "device", "stream",
                    "correlation", "external_id", "step")


def read_document(data: bytes, path: str) -> tuple[KinetoDocument | None, str | None]:
    """Parse a whole Kineto document; (None, why) when it is not one."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return None, f"not a JSON document: {exc}"
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return None, "JSON object without a traceEvents list"
    return KinetoDocument(doc, path), None


def split_events(doc: KinetoDocument) -> dict[str, Any]:
    """Walk the events once: rows of the events table, of the activity table,
    metadata records and the events that could not be read.

    Returns a dict with ``rows`` (column -> list), ``activity`` (column -> list),
    ``meta`` (records) and ``broken`` ((event number, reason) pairs).
    """
    rows: dict[str, list[Any]] = {k: [] for k in ("tid", "cat", "name", "ph", "ts", "dur", "step", "args")}
    activity: dict[str, list[Any]] = {k: [] for k in ACTIVITY_COLUMNS}
    broken: list[tuple[int, str]] = []
    lanes: dict[int, int | None] = {}
    thread_names: dict[int, str] = {}
    process_name: str | None = None
    host_pid = doc.host_pid
    for number, event in enumerate(doc.events, 1):
        if not isinstance(event, dict):
            broken.append((number, "event is not a JSON object"))
            continue
        ph = event.get("ph")
        if not isinstance(ph, str) or not ph:
            broken.append((number, "event without ph"))
            continue
        pid = _int(event.get("pid"))
        if ph in _FLOW_PHASES or isinstance(event.get("pid"), str):
            continue  # flow arrows and the profiler's own tracks ("Spans", "Traces")
        if pid is None:
            broken.append((number, "event without an integer pid"))
            continue
        args = event.get("args")
        args = args if isinstance(args, dict) else {}
        if ph == fmt.PH_METADATA:
            name = args.get("name")
            if pid == host_pid and isinstance(name, str):
                if event.get("name") == "process_name":
                    process_name = name
                elif event.get("name") == "thread_name" and _int(event.get("tid")) is not None:
                    thread_names[_int(event.get("tid"))] = name
            continue
        ts = _number(event.get("ts"))
        if ts is None:
            broken.append((number, "event without a numeric ts"))
            continue
        dur = _number(event.get("dur"))
        if dur is not None and dur < 0:
            broken.append((number, f"negative dur {dur!r}"))
            continue
        start_ns = doc.ns(ts)
        end_ns = None if dur is None else start_ns + us_to_ns(dur)
        if start_ns not in _INT64 or (end_ns is not None and end_ns not in _INT64):
            broken.append((number, "ts or dur out of range"))
            continue
        stream = _int(args.get("stream"))
        on_device = pid != host_pid
        tid = _int(event.get("tid"))
        device = None
        if on_device:
            # the stream's lane (events without args.stream, GPU annotations, sit on their tid)
            device = _int(args.get("device"))
            device = pid if device is None else device
            tid = stream if stream is not None else tid
            if tid is not None:
                lanes.setdefault(tid, device)
        cat = event.get("cat") if isinstance(event.get("cat"), str) else ""
        name = event.get("name") if isinstance(event.get("name"), str) else ""
        step = profiler_step(name) if not on_device else None
        rows["tid"].append(tid)
        rows["cat"].append(cat)
        rows["name"].append(name)
        rows["ph"].append(ph)
        start_us = (start_ns + 500) // 1000
        rows["ts"].append(start_us)
        rows["dur"].append(None if end_ns is None else (end_ns + 500) // 1000 - start_us)
        rows["step"].append(step)
        rows["args"].append(args)
        correlation = _int(args.get("correlation"))
        if end_ns is None or ph != fmt.PH_COMPLETE:
            continue
        if (on_device and stream is not None) or (correlation is not None and cat in LAUNCH_CATS) or step is not None:
            activity["pid"].append(host_pid)
            activity["tid"].append(tid)
            activity["cat"].append(cat)
            activity["name"].append(name)
            activity["start_ns"].append(start_ns)
            activity["end_ns"].append(end_ns)
            activity["device"].append(device)
            activity["stream"].append(stream if on_device else None)
            activity["correlation"].append(correlation)
            activity["external_id"].append(_int(args.get("External id")))
            activity["step"].append(step)
    meta = _meta_records(doc, process_name, thread_names, lanes)
    return {"rows": rows, "activity": activity, "meta": meta, "broken": broken}


def _meta_records(doc: KinetoDocument, process_name: str | None, thread_names: dict[int, str],
                  lanes: dict[int, int | None]) -> list[dict[str, Any]]:
    """Metadata records in dftrace's vocabulary: process info (rank, host), the
    process name, the host threads' and the GPU streams' names."""
    pid = doc.host_pid
    info: dict[str, Any] = {"hostname": doc.host, "source": "pytorch-profiler"}
    if doc.rank is not None:
        info["rank"] = doc.rank
    records = [{"pid": pid, "tid": None, "name": fmt.META_PROCESS_INFO, "cat": None, "args": info}]
    if process_name:
        records.append({"pid": pid, "tid": None, "name": fmt.META_PROCESS_NAME, "cat": None,
                        "args": {"name": process_name}})
    for tid, name in sorted(thread_names.items()):
        if tid not in lanes:
            records.append({"pid": pid, "tid": tid, "name": fmt.META_THREAD_NAME, "cat": None, "args": {"name": name}})
    for stream, device in sorted(lanes.items()):
        records.append({"pid": pid, "tid": stream, "name": fmt.META_THREAD_NAME, "cat": None,
                        "args": {"name": f"GPU {device} stream {stream}"}})
    return records


def validate_document(path: str | os.PathLike[str]) -> list[fmt.Violation]:
    """Check a PyTorch profiler trace: one JSON object with a ``traceEvents`` list of
    objects, each with a ``ph``; events with a numeric ``ts`` that fits the time
    columns; complete events with a numeric ``dur >= 0``; GPU activity with integer
    ``device``, ``stream`` and ``correlation``. Violations (rule ``kineto``) concern
    the file as a whole and name the event as ``traceEvents[i]``."""
    decoded = fmt.read_trace_bytes(path)
    doc, error = read_document(decoded.data, os.fspath(path))
    if doc is None:
        return [fmt.Violation(0, "kineto", error + (f" ({decoded.cut_off})" if decoded.cut_off else ""))]
    found = list(split_events(doc)["broken"])
    for number, event in enumerate(doc.events, 1):
        if not isinstance(event, dict) or event.get("ph") != fmt.PH_COMPLETE:
            continue
        if _number(event.get("dur")) is None:
            found.append((number, f"complete event with dur {event.get('dur')!r}"))
        args = event.get("args")
        if event.get("cat") in GPU_CATS and isinstance(args, dict):
            found.extend((number, f"GPU activity without an integer {key}")
                         for key in ("device", "stream", "correlation") if _int(args.get(key)) is None)
    return [fmt.Violation(0, "kineto", f"traceEvents[{number - 1}]: {reason}") for number, reason in sorted(found)]


def activity_schema() -> dict[str, Any]:
    """The GPU activity table's columns (:data:`ACTIVITY_COLUMNS`) with their polars types."""
    import polars as pl  # here: detecting a document needs no polars (``dftrace validate``)

    text = {"cat", "name"}
    return {c: pl.String if c in text else pl.Int32 if c == "device" else pl.Int64 for c in ACTIVITY_COLUMNS}


def fill_partition(result: Any, data: bytes, wanted: dict[str, Any], schema: dict[str, Any]) -> None:
    """Fill a ``PartitionData`` from a whole Kineto document.

    ``wanted`` is the decoder's column -> source map, ``schema`` the event columns'
    types (``host_key`` included). Sets ``events``, ``meta``, ``activity`` and the
    broken-event counts; an unreadable document is one broken line.
    """
    import polars as pl

    from .schema import coerce_value
    from .schema import HOST_KEY

    result.n_lines = 1
    result.closed = result.cut_off is None
    doc, error = read_document(data, result.partition.path)
    if doc is None:
        result.note_broken(1, error if result.cut_off is None else f"{error} ({result.cut_off})")
        return
    split = split_events(doc)
    for number, reason in split["broken"]:
        result.note_broken(number, reason)
    rows = split["rows"]
    n = len(rows["ts"])
    columns: dict[str, pl.Series] = {}
    for column, dtype in schema.items():
        if column == HOST_KEY:
            values: list[Any] = [""] * n
        elif column == "pid":
            values = [doc.host_pid] * n
        elif column == "args":
            values = [orjson.dumps(a).decode() if a else None for a in rows["args"]]
        elif column in rows:
            values = rows[column]
        elif wanted.get(column) is not None and wanted[column][0] == "args" and column not in _COLUMNS_NOT_ARGS:
            key = wanted[column][1]
            values = [coerce_value(a.get(key), dtype) for a in rows["args"]]
        else:
            values = [None] * n
        columns[column] = pl.Series(column, values, dtype=dtype)
    result.events = pl.DataFrame(columns)
    result.meta = split["meta"]
    activity = split["activity"]
    result.activity = pl.DataFrame(
        {**activity, HOST_KEY: [""] * len(activity["pid"])},
        schema={**activity_schema(), HOST_KEY: pl.String},
    )


# Event columns dftrace decodes from its own args (``args.step``, ``args.level``,
# ...): a Kineto event has none of them, except ``step`` which comes from the name.
_COLUMNS_NOT_ARGS = ("parent_id", "level", "epoch", "step", "count", "incomplete", "group", "seq")


def first_events(path: str | os.PathLike[str], limit: int) -> list[dict[str, Any]]:
    """A sample of the events of a Kineto document that become rows (to see their
    args): the first ``limit``, and the first of each category."""
    doc, _ = read_document(fmt.read_trace_bytes(path).data, os.fspath(path))
    if doc is None:
        return []
    rows = [e for e in doc.events if isinstance(e, dict) and _int(e.get("pid")) is not None
            and e.get("ph") not in _FLOW_PHASES]
    firsts = {e.get("cat"): e for e in reversed(rows)}
    return rows[:limit] + list(firsts.values())
