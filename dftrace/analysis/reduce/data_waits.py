"""Which step each batch's wait is: the data-loading rows of a process's steps placed in
the step they fed (``steps.model_steps``). A fetch carries the step number in force when
it ran, which is the step before the one it feeds, or none at all; where it lies, and
the pipeline spans around it, say which step waited for it."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from ... import format as fmt


#: The names of a batch's fetch (``dataloader`` spans), and of a loader's start (its
#: iterator made, its workers started): each is a row of its own in the step rows, as
#: one step can hold the fetch of its own micro-batch and that of the next step's
#: batch. One that carries no step (the run's first batch, fetched before the first
#: ``ai.update(step=...)``; every batch where only the integrations number steps)
#: leads into the step after it.
FETCH_NAMES = ("fetch", "fetch" + fmt.ITER_SUFFIX, "fetch" + fmt.INIT_SUFFIX)
#: The call that found a loader's pass over (``dftrace run``'s ``next()`` that raised
#: ``StopIteration``): where the loop's last step of the pass ended.
PASS_END = "fetch" + fmt.END_SUFFIX


def is_fetch(cat: Any, name: Any) -> Any:
    """Whether a span is a batch's fetch (see FETCH_NAMES): works on polars expressions
    and numpy masks alike (``cat`` and ``name`` as predicates there)."""
    return cat(fmt.CAT_DATALOADER) & name(FETCH_NAMES)


def fetch_rows() -> pl.Expr:
    """``is_fetch`` of a frame's rows (its ``cat`` and ``name`` columns)."""
    return is_fetch(lambda cat: pl.col("cat") == cat, lambda names: pl.col("name").is_in(names))


def rows_apart() -> pl.Expr:
    """The step rows that are each a span of their own, never grouped with others of
    their numbers: fetches, and spans numbered with a step but no epoch (numbers that
    may start again within a process: ``step_numbers.with_runs_numbered`` tells the
    runs apart in time order)."""
    return fetch_rows() | (pl.col("step").is_not_null() & pl.col("epoch").is_null())


def data_targets(rank: np.ndarray, start: np.ndarray, data: np.ndarray, step_start: np.ndarray,
                 work_end: np.ndarray, cuts: np.ndarray, leads_on: np.ndarray,
                 cut_ends: np.ndarray | None = None, pass_ends: np.ndarray | None = None) -> np.ndarray:
    """The step (its place in time order) each data-loading row belongs to, or -1.

    A step's data wait is the fetch of the batch it trains on. That fetch ran before
    ``ai.update(step=k)``, so it carries the previous step's number: a data row of
    step ``s`` that began once ``s``'s work had ended fetched the batch of the step
    after ``s``, and belongs to it unless a pipeline span (``cuts``: their starts;
    ``cut_ends``) starts between it and that step, or it lies in one that ended by then
    (an evaluation's fetches, which carry ``s`` too), or the step after ``s`` in time is
    not the next (``leads_on`` false: steps untraced between them). One
    that began while ``s``'s work ran (data loading inside the step's own spans) is
    ``s``'s, and so is one that began before (between the previous step's work and its
    own). Rows of no placed step, and earlier ones, belong to none, nor do those before
    the end of a loader's pass (``pass_ends``: their sorted starts) that precedes the
    step (a batch looked at before training: ``next(iter(loader))``).
    """
    size = step_start.size
    target = np.full(rank.size, -1, dtype=np.int64)
    if not size:
        return target
    r = np.maximum(rank, 0)
    placed = data & (rank >= 0)
    previous = np.concatenate(([np.iinfo(np.int64).min], step_start[:-1]))
    own = placed & (start > previous[r]) & (start < work_end[r])
    nxt = np.minimum(r + 1, size - 1)
    ahead = placed & (start >= work_end[r]) & (r + 1 < size) & leads_on[r]
    if cuts.size:
        ahead &= np.searchsorted(cuts, step_start[nxt], side="left") == np.searchsorted(cuts, start, side="right")
        if cut_ends is not None:
            ahead &= ~inside_ended(cuts, cut_ends, start, step_start[nxt])
    if pass_ends is not None and pass_ends.size:
        passes_before = np.searchsorted(pass_ends, start, side="right")  # a pass end after the row, before the step
        own &= passes_before >= np.searchsorted(pass_ends, step_start[r], side="left")
        ahead &= passes_before >= np.searchsorted(pass_ends, step_start[nxt], side="left")
    target[own] = r[own]
    target[ahead] = nxt[ahead]
    return target


def inside_ended(cuts: np.ndarray, cut_ends: np.ndarray, at: np.ndarray, until: np.ndarray) -> np.ndarray:
    """Whether each ``at`` lies in the pipeline span that began last at or before it
    (``cuts``: their sorted starts; ``cut_ends``) and that span ended by ``until``: an
    evaluation's fetch, which is not the next step's."""
    last = np.searchsorted(cuts, at, side="right") - 1
    ends = cut_ends[np.maximum(last, 0)]
    return (last >= 0) & (ends > at) & (ends <= until)


def with_leading_data(leads: pl.DataFrame, epochs: pl.Series, step_start: np.ndarray, step_end: np.ndarray,
                      counts: np.ndarray, cuts: np.ndarray, containers: np.ndarray, work_end: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``step_start``, ``step_end`` and ``counts`` with each fetch that carries no step
    (``leads``) in the step that begins next: its batch's wait (the run's first batch,
    fetched before the first ``ai.update(step=...)``, or every batch where only the
    integrations number steps), the step before ending where it begins. A fetch is
    left out where a step begins inside it, where it carries another epoch than the
    step's (``epochs``: each step's), where a pipeline span begins or a loader's pass
    ends between it and the step (``cuts``: their starts; a batch looked at before
    training, ``next(iter(loader))``, is no step's wait), where it lies in one (``containers``: start,
    end) that ended before the step (an evaluation's fetches), or where it began
    before the step before had done its work (``work_end``: each step's last work
    end): the next epoch's loader start inside a step whose micro-batches span the
    epochs' edge is that step's time."""
    size = step_start.size
    order = np.argsort(step_start, kind="stable")
    starts = step_start[order]
    lead_start, lead_end, n = (leads.get_column(name).to_numpy().astype(np.int64) for name in ("start", "end", "n"))
    at = np.searchsorted(starts, lead_end, side="left")  # the first step beginning once the fetch ended
    ok = at < size
    target = order[np.minimum(at, size - 1)]
    ok &= (at == 0) | (starts[np.maximum(at - 1, 0)] <= lead_start)
    ok &= (at == 0) | (work_end[order[np.maximum(at - 1, 0)]] <= lead_start)
    lead_epoch = leads.get_column("epoch")
    if lead_epoch.null_count() < leads.height:
        step_epoch = pl.Series(epochs.to_numpy()[target] if epochs.null_count() == 0 else epochs.gather(target))
        ok &= (lead_epoch.is_null() | (lead_epoch == step_epoch).fill_null(False)).to_numpy()
    cuts = np.sort(cuts)
    ok &= np.searchsorted(cuts, step_start[target], side="left") == np.searchsorted(cuts, lead_start, side="right")
    if containers.size:
        ok &= ~inside_ended(containers[:, 0], containers[:, 1], lead_start, step_start[target])
    if not ok.any():
        return step_start, step_end, counts
    new_start, counts = step_start.copy(), counts.copy()
    np.minimum.at(new_start, target[ok], lead_start[ok])
    np.add.at(counts, target[ok], n[ok])
    # The step before one that now begins earlier ends there.
    moved = new_start[order[1:]] < step_start[order[1:]]
    before = order[:-1][moved]
    step_end = step_end.copy()
    step_end[before] = np.maximum(step_start[before], np.minimum(step_end[before], new_start[order[1:]][moved]))
    return new_start, step_end, counts
