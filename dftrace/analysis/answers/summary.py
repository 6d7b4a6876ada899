"""The answers: turning combined aggregates into a :class:`Summary`.

A Summary is plain data (dicts, lists, numbers) so it serialises to JSON as is;
the terminal table, ``--json`` and the HTML report all render from it. Times are
integer microseconds. Percentiles use the nearest-rank method: p95 is the smallest
value with at least 95 % of the observations at or below it. Those of steps are
exact; those of span durations (categories, data-loader waits) come from a
mergeable sketch (``reduce.sketch``): exact below ``EXACT_BELOW_US``, within
``RELATIVE_ERROR`` above, as the overview states.
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import orjson

from ..read.sources import DEFAULT_PARTITION_BYTES, PathsLike
from ..read.trace import TraceTable
from ..reduce.aggregate import aggregate_loaded
from ..reduce.combine import Combined, combine
from ..reduce.index import partials_of
from ..runtime.executor import default_executor
from ..runtime.heap import hand_back, heap_for_answers
from ..runtime.progress import phase
from . import breakdown, durations, gpu, io, overview, runs, steps, stragglers
from .context import Context, Stage, from_aggregates
from .steps import RANK_STEPS_LIMIT, UnitSteps, steps_of
from .units import count_of, format_us


@dataclass
class Summary:
    """Everything ``dftrace summary`` and ``dftrace report`` show, as plain data."""

    #: Files, processes, ranks, hosts, events, time span, broken lines, ...
    overview: dict[str, Any]
    #: Per input file: lines, events, broken lines (first ones with reasons), cut-off.
    files: list[dict[str, Any]]
    #: Per process (rank order): label, rank, host, pid, time span, spans, dropped, and how
    #: it ended when the trace says (``ended``: "killed by signal 9"; None when finalized).
    processes: list[dict[str, Any]]
    #: Per (category, name): count, total, self time (``self_us``: the time its spans
    #: were the innermost on their thread), mean, min, p50, p95, max, and the standard
    #: deviation of the durations (``std_us``; None for a single span).
    categories: list[dict[str, Any]]
    #: Per epoch: ranks, steps, slowest rank and its time, median rank time.
    epochs: list[dict[str, Any]]
    #: Ranks the others waited for in collectives, worst first (empty for one rank):
    #: rank, host, last_arrivals, caused_wait_us, compute_us_per_step, held_steps, ...
    stragglers: list[dict[str, Any]]
    #: Collectives matched across ranks: count, arrival skew, the worst ones.
    collectives: dict[str, Any]
    #: Separate runs found among the files (clock anchors far apart, other hosts and
    #: command lines); empty when the files are of one run.
    runs: list[dict[str, Any]]
    #: Per (epoch, step): ranks, min/median/max step time, slowest rank, max/median;
    #: past STEPS_LIMIT steps, every Nth step and the slowest ones (``steps_thinned``).
    steps: list[dict[str, Any]]
    #: Step times over all ranks and steps: count, mean, p50, p95, max.
    step_stats: dict[str, Any]
    #: Per (rank, epoch, step): start (from its run's start), duration, wait in collectives.
    rank_steps: list[dict[str, Any]]
    #: True when ``rank_steps`` keeps a subset of the steps (RANK_STEPS_LIMIT; how, in
    #: ``rank_steps_thinned``).
    rank_steps_sampled: bool
    #: Busy, exclusive and overlapped time per activity group, overall and per process.
    breakdown: dict[str, Any]
    #: Per ``<leaf>.iter``/``<leaf>.block`` pair: time waiting for items vs using them.
    dataloader: list[dict[str, Any]]
    #: Slowest vs median rank per step.
    imbalance: dict[str, Any]
    #: Duration histograms (log-spaced bins) of the names with the most total time.
    distributions: list[dict[str, Any]]
    #: Per (rank, device) of PyTorch profiler traces: GPU idle/compute/non-compute
    #: time, communication/computation overlap, idle time by cause, top kernels.
    gpu: list[dict[str, Any]]
    #: Per step of each process with dftrace steps and a PyTorch profiler trace of its
    #: GPU: GPU busy share, GPU time of the kernels launched in the step, host time
    #: in calls waiting for the GPU (sync_wait_us), the clock join's error bound.
    gpu_steps: list[dict[str, Any]]
    #: Per (cat, name) of dftrace's spans in processes with a profiler trace: spans, the
    #: kernels launched inside them and those kernels' GPU time, most GPU time first.
    gpu_spans: list[dict[str, Any]] = field(default_factory=list)
    #: Traced file I/O (cat POSIX and STDIO; see ``answers.io``): bytes, calls and time by
    #: kind, sizes, shares, per file, rank and step, in data loading and checkpoints,
    #: findings; empty without I/O events.
    io: dict[str, Any] = field(default_factory=dict)
    #: How ``rank_steps`` was thinned when it keeps a subset: every Nth step (``every``)
    #: of all ``steps``, and the ``slowest`` steps (by their slowest rank) besides;
    #: empty when it keeps every rank-step.
    rank_steps_thinned: dict[str, int] = field(default_factory=dict)
    #: How ``steps`` was thinned when it keeps a subset (as ``rank_steps_thinned`` says
    #: of ``rank_steps``); empty when it keeps every step.
    steps_thinned: dict[str, int] = field(default_factory=dict)

    def step_count(self) -> int:
        """The number of steps, also where ``steps`` keeps a subset of them."""
        return self.steps_thinned.get("steps", len(self.steps))

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict."""
        return asdict(self)

    def __repr__(self) -> str:
        """One line: what was read, the steps, and the straggler if one stands out
        (the whole answer is ``to_dict()``; in a notebook the tables show)."""
        return f"<Summary: {'; '.join(headline(self))}>"

    def _repr_html_(self) -> str:
        """The headline and the main tables, for Jupyter."""
        return _summary_html(self)

    def to_json(self, indent: bool = True) -> str:
        """The summary as JSON text."""
        return self.to_json_bytes(indent).decode()

    def to_json_bytes(self, indent: bool = True) -> bytes:
        """The summary as JSON text, UTF-8 encoded."""
        option = orjson.OPT_INDENT_2 if indent else 0
        # The dataclass itself, not a deep copy of it (the answers of a long run are big).
        return orjson.dumps(self, option=option | orjson.OPT_SERIALIZE_NUMPY)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        """Rebuild a summary from :meth:`to_dict` / ``dftrace summary --json`` output
        (fields an older version did not write come back empty)."""
        return cls(**{f.name: data[f.name] if f.name in data else _empty_field(f.type) for f in fields(cls)})


def _empty_field(annotation: Any) -> Any:
    return [] if str(annotation).startswith("list") else {}


def summarize(
    source: PathsLike | TraceTable,
    *,
    executor: Any = None,
    partition_bytes: int = DEFAULT_PARTITION_BYTES,
    progress: bool | None = None,
    index: bool = True,
) -> Summary:
    """Summarise trace files (or an already loaded :class:`TraceTable`).

    Files are cut into partitions; each is parsed and reduced to partial aggregates
    where it is read (a thread here, or a Dask worker with a :class:`DaskExecutor`),
    and the partials are combined exactly here. Only the columns the summary needs
    are decoded. With ``index``, the partials of each file are kept in the index
    (see ``reduce.index``) and taken from there while the file is unchanged.
    """
    skipped: list[str] = []
    duplicates: list[dict[str, str]] = []
    if isinstance(source, TraceTable):
        # One partition, reduced where the files' partitions are.
        partials = default_executor(executor).map(aggregate_loaded, [source])
    else:
        partials = partials_of(source, skipped, executor, partition_bytes, progress, index, duplicates)
    with phase("combining the parts", progress):
        combined = combine(partials)
    del partials  # the per-partition tables are merged: free them before the answers are built
    if isinstance(source, TraceTable):
        combined.files = list(source.files)
    with phase("building the answers", progress), heap_for_answers():
        summary = build_summary(combined)
    summary.overview["skipped_files"] = skipped
    summary.overview["duplicate_files"] = duplicates
    summary.gpu_spans = gpu.spans_answer(source, combined, executor=executor, partition_bytes=partition_bytes,
                                         progress=progress)
    return summary


# --- building ------------------------------------------------------------------------


def build_summary(combined: Combined, *, rank_steps_limit: int | None = None,
                  steps: UnitSteps | None = None) -> Summary:
    """Compute every answer from combined aggregates, stage by stage (see ``context``).

    ``rank_steps`` keeps at most ``rank_steps_limit`` rows, by default
    RANK_STEPS_LIMIT. ``steps``: those :func:`steps_of` found in ``combined``, where
    the caller kept only some of them (the steps a live view shows); by default all
    of them. The whole files' steps are taken over: ``combined.modelled`` is None
    afterwards."""
    found = steps_of(combined) if steps is None else steps
    # The whole files' steps (the largest table) are held by the steps found alone from
    # here, and each stage lets the last one's tables go.
    combined.modelled = None
    limit = RANK_STEPS_LIMIT if rank_steps_limit is None else rank_steps_limit
    context = Context(combined, found.procs, found.runs, limit, process_steps=found.process_steps)
    del found
    fields: dict[str, Any] = {}
    for stage in STAGES:
        stage.enter(context)
        # The pages of the tables the last stage let go go back to the system.
        hand_back()
        for answer in stage.answers:
            for name, value in answer(context).items():
                if name == "overview" and name in fields:  # an answer's notes on the overview
                    fields[name].update(value)
                else:
                    fields[name] = value
    del context
    hand_back()
    return Summary(**fields)


#: The summary's stages (see ``context``): the answers that read each process's steps,
#: then (each unit's steps found) those that read each unit's, then those that read
#: the aggregates alone. Each answer returns some of the Summary's fields; what one
#: returns as ``overview`` is added to it.
STAGES = (
    Stage(steps.from_process_steps, (steps.epochs, gpu.steps_answer, io.answer)),
    Stage(steps.to_unit_steps, ()),
    Stage(steps.from_unit_steps, (stragglers.answer, steps.step_answers, runs.answer)),
    Stage(from_aggregates, (overview.answer, gpu.answer, durations.answer, breakdown.answer)),
)


# --- as a notebook shows it ------------------------------------------------------------

def headline(s: Summary) -> list[str]:
    """The summary in a few phrases: what was read, the steps, the straggler if one
    stands out (``Summary``'s one-line form and the MCP server's headline)."""
    o = s.overview
    events = o.get("events", 0)
    ranks = f"{count_of(o['ranks'], 'rank')}, " if o.get("ranks") else ""
    processes = count_of(o.get("processes", 0), "process", "processes")
    parts = [f"{processes} ({ranks}{count_of(o.get('hosts', 0), 'host')}), "
             f"{events:,} event{'' if events == 1 else 's'} over {format_us(o.get('wall_us'))}"]
    if s.step_stats:
        counts = _step_counts(s)
        ranks = f" ({counts[1]} rank-steps)" if len(counts) > 1 else ""
        parts.append(f"{counts[0]} steps{ranks}, median {format_us(s.step_stats['p50_us'])}")
    held = [r for r in s.stragglers if r.get("significant")]
    if held:
        parts.append(f"{held[0]['unit']} holds the others back "
                     f"({format_us(held[0]['caused_wait_us_per_step'])} per step)")
    return parts


def _step_counts(s: Summary) -> list[int]:
    """[steps], or [steps, rank-steps] where ranks make them differ."""
    steps, rank_steps = s.step_count(), s.step_stats["count"]
    return [steps] if rank_steps == steps else [steps, rank_steps]


def _html_table(title: str, headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<h4>{html.escape(title)}</h4><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _summary_html(s: Summary) -> str:
    parts = [f"<p><b>{html.escape('; '.join(headline(s)))}</b></p>"]
    if s.step_stats:
        st = s.step_stats
        counts = _step_counts(s)
        parts.append(_html_table("Steps", ["steps", "rank-steps"][:len(counts)] + ["p50", "p95", "mean", "max"], [[
            *counts, format_us(st["p50_us"]), format_us(st["p95_us"]), format_us(st["mean_us"]),
            format_us(st["max_us"])]]))
    top = sorted(s.categories, key=lambda c: -c["total_us"])[:10]
    if top:
        parts.append(_html_table("Where the time went (top 10 by total time)",
                                 ["category", "name", "count", "total", "p50", "p95", "self"],
                                 [[c["cat"], c["name"], c["count"], format_us(c["total_us"]), format_us(c["p50_us"]),
                                   format_us(c["p95_us"]), format_us(c.get("self_us"))] for c in top]))
    if s.stragglers:
        parts.append(_html_table("Ranks that held the others back", ["rank", "held steps", "wait caused / step",
                                                                     "significant"],
                                 [[r["unit"], f"{r['held_steps']} of {r['steps']}",
                                   format_us(r["caused_wait_us_per_step"]), "yes" if r["significant"] else "no"]
                                  for r in s.stragglers[:8]]))
    return "<div class='dftrace-summary'>" + "".join(parts) + "</div>"

