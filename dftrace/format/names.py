"""The names and codes that appear in trace files: categories, suffixes, phase codes
(DFTracer's integer ones too), metadata event names, args and the file-name pattern.
Public as :mod:`dftrace.format`."""

from __future__ import annotations

import os
import re
from typing import Any, NamedTuple

# --- categories ----------------------------------------------------------------------

CAT_COMPUTE = "compute"
CAT_DATA = "data"
CAT_DATALOADER = "dataloader"
CAT_COMM = "comm"
CAT_DEVICE = "device"
CAT_CHECKPOINT = "checkpoint"
CAT_PIPELINE = "pipeline"
#: The categories of the ``ai`` tree, in the order reports list them.
AI_CATEGORIES = (
    CAT_PIPELINE,
    CAT_COMPUTE,
    CAT_DATA,
    CAT_DATALOADER,
    CAT_COMM,
    CAT_DEVICE,
    CAT_CHECKPOINT,
)
#: Resource samples (counter events: cpu_percent, rss_bytes, ...).
CAT_SYSTEM = "sys"
#: dftrace's own bookkeeping events (clock anchor, dropped counts).
CAT_TRACER = "dftrace"
#: DFTracer's bookkeeping category (its ``start``/``end`` events and metadata).
CAT_DFTRACER = "dftracer"

#: ``.iter()`` writes ``<leaf>.iter`` (time to obtain an item) and ``<leaf>.block``
#: (time the loop body held it); ``.init`` writes ``<leaf>.init``.
ITER_SUFFIX = ".iter"
BLOCK_SUFFIX = ".block"
#: A loop body's span is ``<leaf>.block``, or ``<name>.yield`` in DFTracer's own
#: ``dft_fn.iter`` (and dftrace's spelling of it, ``dftrace.logger``).
LOOP_BODY_SUFFIXES = (BLOCK_SUFFIX, ".yield")
INIT_SUFFIX = ".init"
#: The call that found a loader's pass over (the ``next()`` that raised
#: ``StopIteration``, or the pass let go early) is ``<leaf>.end``.
END_SUFFIX = ".end"
#: A collective's span from an asynchronous call to its completion is ``<leaf>.done``;
#: the time DDP's backward waits for its gradient buckets is ``all_reduce.wait``.
DONE_SUFFIX = ".done"
WAIT_SUFFIX = ".wait"
#: Epoch spans are ``cat == "pipeline"`` with one of these names.
EPOCH_NAMES = ("epoch", "epoch.block")
#: An evaluation's spans (validation, testing) are ``cat == "pipeline"`` with one of
#: these names: what they hold is no training step's, whatever it is numbered.
EVALUATION_NAMES = ("evaluate", "test")

# --- phases --------------------------------------------------------------------------

PH_COMPLETE = "X"
PH_COUNTER = "C"
PH_METADATA = "M"
PH_INSTANT = "i"
#: DFTracer's aggregated records; no Chrome-trace viewer knows this phase.
PH_AGGREGATED = "A"
#: DFTracer 2.2 writes ``ph`` as an integer (``TracePhaseType``): these are its codes.
DFTRACER_PHASES = {1: PH_COMPLETE, 2: PH_COUNTER, 3: PH_AGGREGATED, 4: PH_METADATA}


def normalize_phase(ph: Any) -> str | None:
    """Return the Chrome-trace phase letter for ``ph``, mapping DFTracer's integers."""
    if isinstance(ph, str):
        return ph
    if isinstance(ph, int) and not isinstance(ph, bool):
        return DFTRACER_PHASES.get(ph)
    return None


# --- metadata event names ------------------------------------------------------------

META_PROCESS_NAME = "process_name"
META_THREAD_NAME = "thread_name"
META_PROCESS_SORT_INDEX = "process_sort_index"
META_THREAD_SORT_INDEX = "thread_sort_index"
#: The only metadata names Perfetto acts on.
PERFETTO_METADATA = frozenset(
    {META_PROCESS_NAME, META_THREAD_NAME, META_PROCESS_SORT_INDEX, META_THREAD_SORT_INDEX}
)
#: Hostname hash: ``args.name`` is the host, ``args.value`` the hash events carry.
META_HOSTNAME_HASH = "HH"
META_FILE_HASH = "FH"
META_STRING_HASH = "SH"
#: Process information: ``args`` has cmdline, cwd, python, hostname, rank, ...
META_PROCESS_INFO = "PR"
#: Custom metadata: ``args.name`` / ``args.value`` (value written as a string).
META_CUSTOM = "CM"
#: Wall and monotonic clocks read at one instant: ``args.wall_ns``, ``args.mono_ns``.
META_CLOCK_ANCHOR = "clock_anchor"
#: Events the writer had to drop: ``args.count``.
META_DROPPED = "dropped"
#: Written by the process writer when a traced process ended without finalize:
#: ``args.how`` ("killed by signal 9", "exited with status 3 without finalize").
META_PROCESS_END = "process_end"

# --- args ----------------------------------------------------------------------------

ARG_HOSTNAME_HASH = "hhash"
ARG_LEVEL = "level"
ARG_PARENT = "p_idx"
ARG_EPOCH = "epoch"
ARG_STEP = "step"
ARG_COUNT = "count"
ARG_INCOMPLETE = "incomplete"
#: Args that analysis lifts into columns of their own.
COMMON_ARGS = (ARG_EPOCH, ARG_STEP, ARG_COUNT, ARG_LEVEL, ARG_PARENT, ARG_INCOMPLETE)

#: asyncio tasks are recorded on virtual thread ids from here up.
VIRTUAL_TID_BASE = 0x40000000
#: Perfetto stores pid and tid as uint32 and turns larger values into 0.
UINT32_MAX = 2**32 - 1

# --- files ---------------------------------------------------------------------------

#: Suffixes of the files dftrace writes (and DFTracer's ``.pfw`` / ``.pfw.gz``).
TRACE_SUFFIXES = (".pfw", ".pfw.gz", ".pfw.zst")
#: Strict Chrome-trace JSON, as written by ``dftrace convert`` and ``dftrace merge``.
CHROME_SUFFIXES = (".json", ".json.gz")

_FILENAME = re.compile(
    r"^(?P<prefix>.*?)(?:-rank(?P<rank>\d+))?-(?P<host>[^/]+?)-(?P<pid>\d+)(?:\.\d+)?"
    r"(?:\.part(?P<part>\d+))?\.pfw(?:\.gz|\.zst)?$"
)


class TraceFileName(NamedTuple):
    """The parts of ``<prefix>[-rank<R>]-<host>-<pid>[.part<N>].pfw[.gz|.zst]``."""

    prefix: str
    rank: int | None
    host: str
    pid: int
    part: int


def parse_trace_filename(name: str | os.PathLike[str]) -> TraceFileName | None:
    """Split a dftrace file name into its parts, or return None if it does not match.

    Hosts may contain dashes; the rank, when present, is the ``rank<R>`` component
    that follows the prefix. The file's metadata is authoritative; this is the
    fallback for files that lost their first lines.
    """
    match = _FILENAME.match(os.path.basename(os.fspath(name)))
    if match is None:
        return None
    rank = match["rank"]
    return TraceFileName(
        prefix=match["prefix"],
        rank=int(rank) if rank is not None else None,
        host=match["host"],
        pid=int(match["pid"]),
        part=int(match["part"] or 0),
    )


def is_trace_file(name: str | os.PathLike[str]) -> bool:
    """Tell whether a file name has a trace suffix (pfw, Chrome JSON, or ``.jsonl``)."""
    base = os.path.basename(os.fspath(name))
    return base.endswith(TRACE_SUFFIXES + CHROME_SUFFIXES + (".jsonl",))
