"""The step model: which stretch of each rank's time is which training step.

A step runs, on each process, from the first start of the step's own work (the
earliest span carrying its ``args.step``) to the first start of the next step's
work. Work means leaf activity: compute, communication, device transfers,
checkpoints, and data loading. Never part of a step:

- pipeline spans (train, epoch, evaluate, test, ``pipeline.*``) and loop bodies
  (``.block``), which enclose steps;
- any span that contains the starts of two or more other steps (a span around the
  whole loop that carries some step's number);
- data-loading spans that began before the previous step's work.

A step's data wait is the fetch of the batch it trains on, the same on every rank:
the fetch that ran before ``ai.update(step=k)`` was called carries the previous
step's number (whether sticky args are taken when a span starts or when it ends),
so a data-loading span of step k-1 that began once step k-1's work had ended
belongs to step k, which starts with it (one inside step k-1's own work stays there). The first step's fetch carries no step number, and
a fetch separated from the next step by a pipeline span (an evaluation) belongs
to no step.

The last step of an epoch (or of the run) ends with the last of its own spans, or
where the loop then found its loader's pass over (``fetch.end``, before the next
step: what the loop did after the step's last span is the step's, as it is for the
steps before), and a pipeline span that starts inside a step (an evaluation, the
next epoch) ends it there: evaluation after the last training step is not part of
that step. A
checkpoint span that carries no step (saved between steps, as the integrations'
are) ends the step whose work ended before it starts.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import polars as pl

from ... import format as fmt
from ..runtime import kernels
from .busy import each_process, time_within
from .data_waits import PASS_END, data_targets, fetch_rows, rows_apart, with_leading_data
from .step_numbers import (WORK_CATS, in_epoch_spans, numbers_of, same_numbers, skipped_steps, step_codes,
                           with_numbers_settled, with_runs_numbered)
from ..read.schema import FrameT, loop_body


def step_rows(spans: FrameT, by: list[str]) -> FrameT:
    """*by, epoch, step, cat, name, start, end, n: extents of the spans that carry
    ``args.step``, per name, and each fetch (``is_fetch``), whether it carries one or
    not, and each span with a step but no epoch, as a row of its own (``rows_apart``):
    what :func:`model_steps` works from. ``spans`` are complete events with an
    ``end`` column."""
    fetch = fetch_rows()
    apart = rows_apart()
    return (
        spans.filter(
            (pl.col("step").is_not_null() | fetch) & (pl.col("cat") != fmt.CAT_PIPELINE)
            & ~loop_body(pl.col("name")) & ~pl.col("name").str.ends_with(fmt.DONE_SUFFIX)
        )
        .group_by([*by, "epoch", "step", "cat", "name", pl.when(apart).then(pl.col("ts")).alias("_apart")])
        .agg(pl.col("ts").min().alias("start"), pl.col("end").max().alias("end"),
             pl.len().cast(pl.Int64).alias("n"))
        .drop("_apart")
    )


#: The names of the PyTorch profiler's step spans (``ProfilerStep#N``): the step
#: model leaves them out where a process has dftrace's own steps.
PROFILER_STEP_PREFIX = "ProfilerStep#"


def work_merged(rows: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """``rows`` (see :func:`step_rows`) with the rows of each step's work (one a name)
    merged into one, its category compute and its name null: the first start, last
    end and count of them all. Data loading and the profiler's steps keep their rows.

    The step model finds the same steps from them wherever no merged row holds the
    starts of two or more other steps (:func:`merged_work_encloses` says): it reads a
    step's work rows for their least start, greatest end and count, and leaves a row
    out only where it holds such starts, and a merged row holds every start its rows
    hold. A whole file's rows merged as each piece is read are a few rows a step
    rather than one a step and name."""
    if not rows.height:
        return rows
    merged = _is_merged_work(rows)
    if not merged.any():
        return rows
    work = (rows.filter(merged).group_by([*by, "epoch", "step"])
            .agg(pl.col("start").min(), pl.col("end").max(), pl.col("n").sum())
            .with_columns(pl.lit(fmt.CAT_COMPUTE, pl.String).alias("cat"), pl.lit(None, pl.String).alias("name")))
    return pl.concat([rows.filter(~merged), work.select(rows.columns).cast(rows.schema)], how="vertical")


def merged_work_encloses(rows: pl.DataFrame, by: list[str]) -> bool:
    """Whether a row of ``rows`` merged by :func:`work_merged` (a work row without a
    name) holds, strictly within it, the starts of two or more work rows of its
    process (``by``): the step model might leave the merged row out where it would
    have kept some of the rows merged into it, and the steps are found from the rows
    unmerged instead. The starts of every work row are looked at, not only each
    step's first: a merged row that holds none of them holds no step's first start."""
    return bool(processes_enclosed_by_merged_work(rows, by))


def processes_enclosed_by_merged_work(rows: pl.DataFrame, by: list[str]) -> list[tuple]:
    """The processes (their ``by`` values) where :func:`merged_work_encloses` holds.
    The rows are looked at through masks and row numbers, not copied (a million-step
    process has two million of them)."""
    if not rows.height or not rows.get_column("name").null_count():
        return []
    work = rows.get_column("cat").is_in(WORK_CATS).fill_null(False).to_numpy()
    merged = work & rows.get_column("name").is_null().to_numpy()
    if not merged.any():
        return []
    start, end = rows.get_column("start").to_numpy(), rows.get_column("end").to_numpy()
    if bool(by) and any(rows.get_column(key).n_unique() > 1 for key in by):
        grouped = rows.select(by).with_row_index("_row").group_by(by, maintain_order=True).agg("_row")
        places = [(key, at.to_numpy()) for key, at in zip(grouped.select(by).rows(), grouped.get_column("_row"))]
    else:
        places = [(tuple(rows.get_column(key)[0] for key in by), None)]  # a select copied every column
    found = []
    for key, at in places:
        own_work, own_merged, own_start, own_end = (
            (work, merged, start, end) if at is None else (work[at], merged[at], start[at], end[at]))
        if not own_merged.any():
            continue
        known = np.sort(own_start[own_work])
        inside = (np.searchsorted(known, own_end[own_merged], side="left")
                  - np.searchsorted(known, own_start[own_merged], side="right"))
        if (inside >= 2).any():
            found.append(key)
    return found


def _is_merged_work(rows: pl.DataFrame) -> pl.Series:
    return rows.select(pl.col("cat").is_in(WORK_CATS).fill_null(False) & ~rows_apart().fill_null(False)
                       & ~pl.col("name").str.starts_with(PROFILER_STEP_PREFIX).fill_null(False)).to_series()


def container_rows(spans: FrameT, by: list[str]) -> FrameT:
    """*by, name, start, end, after_work: the spans that end a step: the pipeline's own
    (train, epoch, evaluate, ...; loop bodies and item waits left out, but an epoch
    loop's body, ``epoch.block``: the next epoch), and, once the step's work has ended
    (``after_work``), checkpoints that carry no step; and the ends of loaders' passes
    (``PASS_END``), which end an epoch's last step."""
    between = (pl.col("cat") == fmt.CAT_CHECKPOINT) & pl.col("step").is_null()
    pass_end = (pl.col("cat") == fmt.CAT_DATALOADER) & (pl.col("name") == PASS_END)
    return spans.filter(
        ((pl.col("cat") == fmt.CAT_PIPELINE) & ((~loop_body(pl.col("name"))
                                                 & ~pl.col("name").str.ends_with(fmt.ITER_SUFFIX))
                                                | pl.col("name").is_in(fmt.EPOCH_NAMES))) | between | pass_end
    ).select(*by, "name", pl.col("ts").alias("start"), "end", between.alias("after_work"))


STEP_SCHEMA = {"proc": pl.Int32, "epoch": pl.Int64, "step": pl.Int64, "start": pl.Int64, "end": pl.Int64,
               "n": pl.Int64, "work": pl.Boolean}
#: The time of a process's compute and blocked intervals within each of its steps
#: (see ``with_step_times``).
STEP_TIME_SCHEMA = {"compute_us": pl.Int64, "blocked_us": pl.Int64}


def model_steps(rows: pl.DataFrame, containers: pl.DataFrame) -> pl.DataFrame:
    """proc, epoch, step, start, end, n, work: each process's steps.

    ``rows`` has the extents of each (proc, epoch, step, cat, name); ``containers``
    the pipeline spans (proc, name, start, end). ``work`` is false for processes
    whose steps are found from data loading alone (DataLoader workers).
    """
    rows = _outside_evaluations(rows, containers)
    if not rows.height:
        return pl.DataFrame(schema=STEP_SCHEMA)
    rows = with_numbers_settled(rows)
    pass_end, starts = pl.col("name") == PASS_END, lambda f: np.sort(f.get_column("start").to_numpy()).astype(np.int64)
    cuts = {  # per process: the pipeline spans' (start, end) by start; the starts of after_work, epochs, passes' ends
        proc: (frame.filter(~pl.col("after_work") & ~pass_end).sort("start").select("start", "end").to_numpy()
               .astype(np.int64), starts(frame.filter("after_work")),
               starts(frame.filter(pl.col("name").is_in(fmt.EPOCH_NAMES))), starts(frame.filter(pass_end)))
        for (proc,), frame in containers.with_columns(pl.col("after_work").fill_null(False))
        .partition_by("proc", as_dict=True).items()
    }
    none = (np.empty((0, 2), dtype=np.int64), *(np.empty(0, dtype=np.int64) for _ in range(3)))
    procs = rows.get_column("proc").unique(maintain_order=True).to_list()

    def one(proc: int) -> pl.DataFrame:
        # Each process's rows are cut out when its turn comes: a big run's rows are
        # not all copied at once.
        frame = rows.filter(pl.col("proc") == proc) if len(procs) > 1 else rows
        return _process_steps(proc, frame, *cuts.get(proc, none))

    # Processes are independent, and numpy and polars release the GIL for most of the work.
    with ThreadPoolExecutor(min(os.cpu_count() or 1, 8, len(procs))) as pool:
        out = list(pool.map(one, procs))
    return pl.concat(out, how="vertical") if out else pl.DataFrame(schema=STEP_SCHEMA)


def _outside_evaluations(rows: pl.DataFrame, containers: pl.DataFrame) -> pl.DataFrame:
    """``rows`` less those that start inside an evaluation's span of their process
    (``fmt.EVALUATION_NAMES``): a validation loop that numbers its own steps
    (``ai.update(step=j)`` inside ``ai.pipeline.evaluate``) makes no training step,
    and adds no work to one."""
    evaluations = containers.filter(pl.col("name").is_in(fmt.EVALUATION_NAMES))
    if not evaluations.height or not rows.height:
        return rows
    keep = np.ones(rows.height, dtype=bool)
    proc, start = rows.get_column("proc").to_numpy(), rows.get_column("start").to_numpy()
    for (p,), frame in evaluations.partition_by("proc", as_dict=True).items():
        spans = frame.sort("start").select("start", "end").to_numpy().astype(np.int64)
        reach = np.maximum.accumulate(spans[:, 1])  # the furthest end of the spans begun by then
        mine = np.flatnonzero(proc == p)
        at = np.searchsorted(spans[:, 0], start[mine], side="right") - 1
        keep[mine[(at >= 0) & (start[mine] < reach[np.maximum(at, 0)])]] = False
    return rows if keep.all() else rows.filter(pl.Series(keep))


def each_process_steps(rows: pl.DataFrame, containers: pl.DataFrame, modelled: pl.DataFrame | None,
                       epochs: pl.DataFrame) -> pl.DataFrame:
    """Each process's steps (``model_steps``, with STEP_TIME_SCHEMA's columns) from the
    step rows and containers of combined partials, and those ``modelled`` where whole
    files were read; a step that carries no epoch is in the epoch whose span it
    starts in (``epochs``: proc, epoch, start, end), so every table shows the same epochs."""
    steps = model_steps(without_profiler_steps(rows), containers).with_columns(
        pl.lit(None, dtype).alias(name) for name, dtype in STEP_TIME_SCHEMA.items())
    if modelled is not None and modelled.height:  # whole files' steps, modelled as read (held narrow)
        steps = pl.concat([steps, modelled], how="vertical_relaxed") if steps.height else modelled
    return _steps_in_epochs(steps, epochs)


def _steps_in_epochs(steps: pl.DataFrame, epochs: pl.DataFrame) -> pl.DataFrame:
    """``steps`` (proc, epoch, step, start, ...) with the epoch of a step that carries
    none taken from the epoch span (proc, epoch, start, end) it starts in: a loop
    numbered by ``.iter()`` alone has epoch spans but no ``args.epoch``."""
    missing = steps.filter(pl.col("epoch").is_null())
    if not missing.height or not epochs.height:
        return steps
    spans = epochs.select("proc", pl.col("epoch").alias("_epoch"), pl.col("start").alias("_from"),
                          pl.col("end").alias("_to")).sort("_from")
    placed = (
        missing.sort("start").join_asof(spans, left_on="start", right_on="_from", by="proc", check_sortedness=False)
        .with_columns(pl.when(pl.col("start") < pl.col("_to")).then(pl.col("_epoch")).alias("epoch"))
        .select(steps.columns)
    )
    return pl.concat([steps.filter(pl.col("epoch").is_not_null()), placed], how="vertical_relaxed")


def _process_steps(proc: int, rows: pl.DataFrame, containers: np.ndarray, after_work: np.ndarray,
                   epoch_starts: np.ndarray, pass_ends: np.ndarray) -> pl.DataFrame:
    """One process's steps; ``containers``: its pipeline spans' (start, end), by start;
    ``after_work``: the starts of the spans that end a step once its work has;
    ``epoch_starts``: those of its epoch spans, sorted; ``pass_ends``: those of its
    loaders' passes' ends, sorted. The rows are read as columns,
    never copied whole: a million-step process has millions of them."""
    cuts, cut_ends = np.ascontiguousarray(containers[:, 0]), np.ascontiguousarray(containers[:, 1])
    columns = {name: np.ascontiguousarray(rows.get_column(name).to_numpy(), np.int64) for name in ("start", "end", "n")}
    numbers = rows.select("epoch", "step")
    if not epoch_starts.size:  # numbers that start again without an epoch: each run an epoch
        numbers = with_runs_numbered(numbers, columns["start"])
    fetch = rows.select(fetch_rows()).to_series().fill_null(False).to_numpy()
    missing = numbers.get_column("step").is_null().to_numpy()
    lead = fetch & missing  # fetches that carry no step: see ``data_waits.with_leading_data``
    placed_rows = np.flatnonzero(~lead) if lead.any() else None

    def kept(values: Any) -> Any:
        return values if placed_rows is None else values[placed_rows]

    placing_numbers = numbers if placed_rows is None else numbers[placed_rows]
    placing_all = in_epoch_spans(numbers, columns["start"], epoch_starts)  # each row's numbers to place it by
    placing = placing_all if placed_rows is None else placing_all[placed_rows]
    start, end, n = (np.ascontiguousarray(kept(columns[name])) for name in ("start", "end", "n"))
    is_work = kept(rows.get_column("cat").is_in(WORK_CATS).fill_null(False).to_numpy())
    work = bool(is_work.any())
    if not work:
        is_work = np.ones(start.size, dtype=bool)
    codes = step_codes(placing)
    if kernels.C is not None and codes is not None:
        code, epoch_span = codes
        placed = kernels.C.steps(code, start, end, n, is_work.astype(np.uint8), cuts, epoch_span,
                                 np.ascontiguousarray(after_work, np.int64), cut_ends,
                                 np.ascontiguousarray(pass_ends, np.int64))
        at, step_start, step_end, counts = (np.frombuffer(array, np.int64) for array in placed)
        picked, placed_by, step_code = placing_numbers[at], placing[at], code[at]
    else:
        step_code = None
        picked, step_start, step_end, counts = _placed_numpy(placing, codes, start, end, n, is_work, cuts, after_work,
                                                             cut_ends, pass_ends)
        placed_by = picked
        if placing is not placing_numbers:  # the epochs the rows carry, not those they were placed by
            picked = picked.with_columns(pl.when(pl.col("epoch") >= 0).then(pl.col("epoch")).alias("epoch"))
    if not step_start.size:
        return pl.DataFrame(schema=STEP_SCHEMA)
    if work:
        # A fetch numbered with a step that has no work (tracing was off for it), or that
        # began before the step before its own did (the first of an epoch numbered anew,
        # carrying the last epoch's last number), leads too.
        row_step = _row_steps(placing, code if step_code is not None else None, step_code, placed_by)
        numbered = np.flatnonzero(fetch & ~missing)
        if numbered.size:
            at_step = row_step[numbered if placed_rows is None else np.searchsorted(placed_rows, numbered)]
            before = np.concatenate(([np.iinfo(np.int64).min], step_start[:-1]))
            stale = (at_step < 0) | (columns["start"][numbered] <= before[np.maximum(at_step, 0)])
            lead[numbered[stale]] = True
    if work and lead.any():
        # Each step's work ends with its last work row: a fetch before that is the step's own.
        work_end = np.full(step_start.size, np.iinfo(np.int64).min, dtype=np.int64)
        worked = is_work & (row_step >= 0)
        np.maximum.at(work_end, row_step[worked], end[worked])
        leads = pl.DataFrame({"epoch": numbers.get_column("epoch").filter(pl.Series(lead)),
                              **{name: values[lead] for name, values in columns.items()}})
        step_start, step_end, counts = with_leading_data(leads, picked.get_column("epoch"), step_start, step_end,
                                                         counts, np.concatenate((cuts, after_work, pass_ends)), containers,
                                                         work_end)
    return pl.DataFrame(
        {
            "proc": np.full(step_start.size, proc, dtype=np.int32),
            "epoch": picked.get_column("epoch"),
            "step": picked.get_column("step"),
            "start": step_start,
            "end": step_end,
            "n": counts,
            "work": np.full(step_start.size, work),
        },
        schema=STEP_SCHEMA,
    )


def _row_steps(placing: pl.DataFrame, code: np.ndarray | None, step_code: np.ndarray | None,
               placed_by: pl.DataFrame) -> np.ndarray:
    """The place of the step of each row (``placing``: the numbers it was placed by;
    ``code``: their codes, with ``step_code`` each step's), or -1: by code where there
    are codes, else by a join on the numbers (``placed_by``: each step's)."""
    if code is not None and step_code is not None:
        return _steps_by_code(code, step_code)
    return (placing.join(placed_by.with_row_index("_at"), on=["epoch", "step"], how="left", nulls_equal=True,
                         maintain_order="left").get_column("_at").fill_null(-1).to_numpy().astype(np.int64))


def _steps_by_code(codes: np.ndarray, step_code: np.ndarray) -> np.ndarray:
    """The place of the step whose code each of ``codes`` is (``step_code``: each
    step's, distinct), or -1."""
    order = np.argsort(step_code, kind="stable")
    known = step_code[order]
    at = np.minimum(np.searchsorted(known, codes), known.size - 1)
    return np.where(known[at] == codes, order[at], -1)


def _placed_numpy(rows: pl.DataFrame, codes: tuple[np.ndarray, int] | None, start: np.ndarray, end: np.ndarray,
                  n: np.ndarray, is_work: np.ndarray, cuts: np.ndarray, after_work: np.ndarray,
                  cut_ends: np.ndarray | None = None, pass_ends: np.ndarray | None = None
                  ) -> tuple[pl.DataFrame, np.ndarray, np.ndarray, np.ndarray]:
    """The steps of one process's ``rows`` in time order: (epoch, step), start, end and
    event count of each (the C kernel's work, for an install without a compiler and
    for steps too many to number with one integer)."""
    keys, key, by_key = _step_keys(rows, codes)
    keep = np.ones(key.size, dtype=bool)
    first = _first_starts(key, start, is_work & keep, keys.height)
    # Spans that hold the starts of two or more other steps enclose steps.
    known = np.sort(first[np.isfinite(first)]).astype(np.int64)
    # Searched for in the order of their steps, nearly that of time: the searches then
    # walk ``known`` in order, several times faster than in the rows' own order.
    inside = np.empty(key.size, dtype=np.int64)
    inside[by_key] = (np.searchsorted(known, end[by_key], side="left")
                      - np.searchsorted(known, start[by_key], side="right"))
    own = (first[key] > start) & (first[key] < end)
    keep &= (inside - own) < 2
    first = _first_starts(key, start, is_work & keep, keys.height)
    found = np.flatnonzero(np.isfinite(first))
    if not found.size:
        nothing = np.empty(0, dtype=np.int64)
        return keys.clear(), nothing, nothing, nothing
    order = found[np.argsort(first[found], kind="stable")]
    rank_of = np.full(keys.height, -1, dtype=np.int64)
    rank_of[order] = np.arange(order.size)
    step_start = first[order].astype(np.int64)
    work_end = np.full(order.size, np.iinfo(np.int64).min, dtype=np.int64)
    worked = is_work & keep & (rank_of[key] >= 0)
    np.maximum.at(work_end, rank_of[key][worked], end[worked])
    epochs = keys.get_column("epoch").to_numpy()[order] if keys.height else np.empty(0)
    same_epoch = np.concatenate((same_numbers(epochs[1:], epochs[:-1]), [False]))
    follows = same_epoch & ~skipped_steps(numbers_of(keys, key, codes)[order], same_epoch)
    target = data_targets(rank_of[key], start, ~is_work & keep, step_start, work_end, cuts,
                          follows | ~same_epoch, cut_ends, pass_ends)
    data = target >= 0
    if data.any():
        earliest = np.full(order.size, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(earliest, target[data], start[data])
        step_start = np.minimum(step_start, earliest)
    last_end = np.zeros(order.size, dtype=np.int64)
    counts = np.zeros(order.size, dtype=np.int64)
    owner = np.where(is_work, rank_of[key], target)
    placed = keep & (owner >= 0)
    np.maximum.at(last_end, owner[placed], end[placed])
    np.add.at(counts, owner[placed], n[placed])
    step_end = np.where(follows, np.concatenate((step_start[1:], [0])), last_end)
    if pass_ends is not None and pass_ends.size:  # an epoch's last step: to its pass's end, before the next step
        at = np.searchsorted(pass_ends, step_start, side="right")  # spans after it that carry the step: not its
        found = pass_ends[np.minimum(at, pass_ends.size - 1)]
        before_next = found < np.concatenate((step_start[1:], [np.iinfo(np.int64).max]))
        step_end = np.where(~same_epoch & (at < pass_ends.size) & before_next, found, step_end)
    # A pipeline span starting inside a step (evaluation, the next epoch) ends it.
    if cuts.size:
        nxt = np.searchsorted(cuts, step_start, side="right")
        has = nxt < cuts.size
        cut = np.where(has, cuts[np.minimum(nxt, cuts.size - 1)], np.iinfo(np.int64).max)
        step_end = np.minimum(step_end, cut)
    # A checkpoint between steps ends the step whose work ended before it.
    if after_work.size:
        nxt = np.searchsorted(after_work, np.maximum(work_end, step_start), side="left")
        cut = np.where(nxt < after_work.size, after_work[np.minimum(nxt, after_work.size - 1)], np.iinfo(np.int64).max)
        step_end = np.minimum(step_end, cut)
    step_end = np.maximum(step_end, step_start)
    return keys[order.tolist()], step_start, step_end, counts


def _step_keys(rows: pl.DataFrame, codes: tuple[np.ndarray, int] | None
               ) -> tuple[pl.DataFrame, np.ndarray, np.ndarray]:
    """(epoch, step: the distinct pairs of ``rows``, sorted, missing ones first; the
    place of each row's pair among them; the rows in the order of their pairs), found
    from their ``codes`` where there are, else by sorting on both."""
    if codes is not None:
        code = codes[0]
        order = np.argsort(code, kind="stable")
        new = np.ones(order.size, dtype=bool)
        new[1:] = code[order][1:] != code[order][:-1]
    else:
        columns = []
        for name in ("epoch", "step"):
            column = rows.get_column(name)
            columns += [column.is_not_null().to_numpy(), column.fill_null(0).to_numpy().astype(np.int64)]
        e_present, e_values, s_present, s_values = columns
        order = np.lexsort((s_values, s_present, e_values, e_present))
        new = np.ones(order.size, dtype=bool)
        new[1:] = np.any([c[order][1:] != c[order][:-1] for c in columns], axis=0)
    key = np.empty(order.size, dtype=np.int64)
    key[order] = np.cumsum(new) - 1
    return rows.select("epoch", "step")[order[new]], key, order


def _first_starts(key: np.ndarray, start: np.ndarray, use: np.ndarray, size: int) -> np.ndarray:
    first = np.full(size, np.inf)
    np.minimum.at(first, key[use], start[use].astype(np.float64))
    return first


#: A unit's step numbers and times, 64 bits wide whatever those of the processes'
#: steps (the whole files' are held narrow: ``Combined.modelled``): the answers join
#: and subtract them. Its count and its compute and blocked time keep the processes'
#: types (1.25M rank-steps take 25 MB less): they are only summed and added to.
_UNIT_STEP_TYPES = {name: STEP_SCHEMA[name] for name in ("epoch", "step", "start", "end")}


def unit_steps(steps: pl.DataFrame, procs: pl.DataFrame) -> pl.DataFrame:
    """unit, unit_order, epoch, step, start, end, dur, n: each rank's steps.

    A rank's processes together: those that place steps by their work (the
    training process), or, for a rank with none, those that only load data.
    """
    units = procs.filter(pl.col("unit").is_not_null()).select("proc", "unit", "unit_order")
    present = units.filter(pl.col("proc").is_in(steps.get_column("proc").unique().implode()))
    if present.get_column("unit").is_unique().all():
        # One process with steps per unit (the usual run): its steps are the unit's
        # as they are, one row per (epoch, step), without regrouping them all.
        in_order = _steps_in_unit_order(steps, units)
        if in_order is not None:
            return in_order
        by_unit = steps.join(units, on="proc", how="inner").select("unit", "unit_order", "epoch", "step", "start", "end", "n", *STEP_TIME_SCHEMA)
    else:
        joined = steps.join(units, on="proc", how="inner").filter(
            pl.col("work") | ~pl.col("work").any().over("unit"))
        # A process's step times are kept only where it is the one placing its rank's
        # steps (``combine`` reads a file again otherwise): a step has one at most.
        by_unit = (joined.group_by(["unit", "unit_order", "epoch", "step"])
                   .agg(pl.col("start").min(), pl.col("end").max(), pl.col("n").sum(),
                        *(pl.col(name).max() for name in STEP_TIME_SCHEMA)))
    return (
        by_unit.lazy().cast(_UNIT_STEP_TYPES).with_columns((pl.col("end") - pl.col("start")).alias("dur"))
        .sort(["unit_order", "start"], nulls_last=True).collect()
    )


def _steps_in_unit_order(steps: pl.DataFrame, units: pl.DataFrame) -> pl.DataFrame | None:
    """``unit_steps`` of one process per unit, gathered from ``steps`` column by
    column, when its rows come one process after another, each in time order (steps
    that start together in the order the model placed them): the processes put in unit
    order are then the rows sorted (a join and a sort made two copies; slices put
    together made every column twice). None otherwise."""
    if steps.get_column("start").null_count():
        return None
    blocks = steps.get_column("proc").rle().struct.unnest()
    procs = blocks.get_column("value").to_list()
    if len(set(procs)) != len(procs):
        return None
    unit_of = {proc: (unit, order) for proc, unit, order in units.iter_rows()}
    start = steps.get_column("start")
    kept, offset = [], 0
    for proc, length in zip(procs, blocks.get_column("len").to_list()):
        if proc in unit_of:
            if length > 1 and not (start.slice(offset + 1, length - 1).to_numpy()
                                   >= start.slice(offset, length - 1).to_numpy()).all():
                return None
            kept.append((unit_of[proc], offset, length))
        offset += length
    orders = [order for (_, order), _, _ in kept]
    if not kept or None in orders or len(set(orders)) != len(orders):
        return None
    kept.sort(key=lambda block: block[0][1])
    lengths = [length for _, _, length in kept]
    block = np.repeat(np.arange(len(kept), dtype=np.uint32), lengths)
    columns = {"unit": pl.Series("unit", [unit for (unit, _), _, _ in kept], pl.String).gather(block),
               "unit_order": np.repeat(np.array([order for (_, order), _, _ in kept], dtype=np.int64), lengths)}
    del block
    for name in (*_UNIT_STEP_TYPES, "n", *STEP_TIME_SCHEMA):
        column = steps.get_column(name)
        if column.null_count():
            columns[name] = column.gather(pl.Series(np.concatenate(
                [np.arange(offset, offset + length) for _, offset, length in kept]))).cast(
                _UNIT_STEP_TYPES.get(name, column.dtype))
            continue
        # Filled block by block into an array of numpy's (the C heap's, in the type
        # the column takes here): handed back to the system once the answers drop it,
        # where polars' allocator keeps freed pages until its next allocation.
        dtype = np.int64 if name in _UNIT_STEP_TYPES else column.slice(0, 0).to_numpy().dtype
        values, at = np.empty(sum(lengths), dtype=dtype), 0
        for _, offset, length in kept:
            values[at:at + length] = column.slice(offset, length).to_numpy()
            at += length
        columns[name] = values
    found = pl.DataFrame(columns)
    return found.with_columns(pl.Series("dur", columns["end"] - columns["start"]) if isinstance(
        columns["end"], np.ndarray) else (pl.col("end") - pl.col("start")).alias("dur"))


def step_spread(by_unit: pl.DataFrame) -> pl.DataFrame | None:
    """epoch, step, ranks, start_us, min_us, median_us, max_us, slowest: each step's
    ranks compared (``by_unit``: unit, unit_order, epoch, step, start, dur), in (epoch,
    step) order, missing numbers first, as
    ``answers.steps.steps_across_units``' query compares them, by the C kernel in one sort; None where
    it cannot (an install without a compiler, a missing time or rank order, steps too
    many to number with one integer): the query then does."""
    if kernels.C is None or not by_unit.height or any(
            by_unit.get_column(name).null_count() for name in ("start", "dur", "unit_order")):
        return None
    codes = step_codes(by_unit)
    if codes is None:
        return None
    compared = kernels.C.across(codes[0], *(np.ascontiguousarray(by_unit.get_column(name).to_numpy(), np.int64)
                                          for name in ("start", "dur", "unit_order")))
    row, ranks, start, low, middle, high, slowest = (np.frombuffer(array, np.int64) for array in compared)
    return pl.DataFrame({
        "epoch": by_unit.get_column("epoch").gather(row),
        "step": by_unit.get_column("step").gather(row),
        "ranks": pl.Series(ranks, dtype=pl.UInt32),
        "start_us": start, "min_us": low, "median_us": middle, "max_us": high,
        "slowest": by_unit.get_column("unit").gather(slowest),
    })


def with_step_times(steps: pl.DataFrame, compute: pl.DataFrame, blocked: pl.DataFrame) -> pl.DataFrame:
    """``steps`` (see ``model_steps``) with ``compute_us`` and ``blocked_us``: the time of
    each process's ``compute`` and ``blocked`` intervals (proc, start, end; disjoint)
    within each of its steps, found for the processes whose steps are placed by their
    work (null for the others). Where such a process's steps are its rank's, these are
    what the answers need of its intervals (see ``unit_steps``)."""
    compute_us = np.zeros(steps.height, dtype=np.int64)
    blocked_us = np.zeros(steps.height, dtype=np.int64)
    settled = np.zeros(steps.height, dtype=bool)
    proc = steps.get_column("proc").to_numpy()
    step_start, step_end = steps.get_column("start").to_numpy(), steps.get_column("end").to_numpy()
    of_process = [dict(each_process(intervals)) for intervals in (compute, blocked)]
    for one in settled_procs(steps):
        own = np.flatnonzero(proc == one)
        settled[own] = True
        for intervals, out in zip(of_process, (compute_us, blocked_us)):
            mine = intervals.get(one)
            if mine is not None:
                out[own] = time_within(mine.get_column("start").to_numpy(), mine.get_column("end").to_numpy(),
                                       step_start[own], step_end[own])
    mask = pl.lit(pl.Series(settled))
    return steps.with_columns(pl.when(mask).then(pl.Series(compute_us)).alias("compute_us"),
                              pl.when(mask).then(pl.Series(blocked_us)).alias("blocked_us"))


def settled_procs(steps: pl.DataFrame) -> list[int]:
    """The processes of ``steps`` whose steps are placed by their work."""
    return steps.filter(pl.col("work")).get_column("proc").unique(maintain_order=True).to_list()


def without_profiler_steps(steps: pl.DataFrame) -> pl.DataFrame:
    """Step rows of the step model, leaving out ``ProfilerStep#N`` spans of processes
    that have dftrace's own steps (a PyTorch profiler trace joined to a dftrace trace
    of the same process): the profiler's step counter is not the training loop's."""
    # A row without a name (a step's work merged into one: ``work_merged``) is not the profiler's.
    profiler = steps.get_column("name").str.starts_with(PROFILER_STEP_PREFIX).fill_null(False)
    if not profiler.any():
        return steps  # no profiler trace among them (the usual): nothing to look up
    own = steps.get_column("proc").filter(~profiler).unique()
    kept = ~(profiler & steps.get_column("proc").is_in(own.implode()))
    return steps if kept.sum() == steps.height else steps.filter(kept)  # no copy when all are kept
