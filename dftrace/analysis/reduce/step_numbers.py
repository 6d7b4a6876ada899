"""A process's step rows with their numbers settled before its steps are modelled
(``steps.model_steps``): a row without an epoch given its step's, and a step that an
epoch's end cut in two made one again; and the numbers the model places steps by
(which epoch span a row without an epoch is in, which run of numbers starting again it
is in, which steps skip untraced ones); the numbers as one code a row (``step_codes``),
and the step rows of a file's pieces grouped again where they share steps
(``regrouped_step_rows``)."""

from __future__ import annotations

import numpy as np
import polars as pl

from ... import format as fmt
from .data_waits import rows_apart

#: Categories whose spans place a step in time; data loading follows them.
WORK_CATS = (fmt.CAT_COMPUTE, fmt.CAT_COMM, fmt.CAT_DEVICE, fmt.CAT_CHECKPOINT)


def with_numbers_settled(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` (the extents of each [proc,] epoch, step, cat, name) with
    ``with_epochs_of_their_steps`` and ``with_split_steps_joined`` applied."""
    return with_split_steps_joined(with_epochs_of_their_steps(rows))


def with_epochs_of_their_steps(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` where a row without an epoch takes the epoch of its process's other rows
    of the same step number, where they name exactly one.

    A step is one step whatever args its spans carry: an integration's or a loop's
    step span carries ``epoch`` and ``step`` while the forward, backward and optimizer
    spans inside it carry ``step`` alone, and they are the same step. Where a step
    number appears under several epochs (steps numbered from 0 in each epoch), a row
    without an epoch is left as it is."""
    epoch = rows.get_column("epoch")
    missing = epoch.null_count()
    if not missing or missing == rows.height:
        return rows
    keys = ["proc", "step"] if "proc" in rows.columns else ["step"]
    known = (rows.lazy().filter(pl.col("epoch").is_not_null() & pl.col("step").is_not_null())
             .group_by(keys).agg(pl.col("epoch").min().alias("_epoch"),
                                 (pl.col("epoch").n_unique() == 1).alias("_one"))
             .filter(pl.col("_one")).select(*keys, "_epoch"))
    return (rows.lazy().join(known, on=keys, how="left", maintain_order="left")
            .with_columns(pl.coalesce("epoch", "_epoch").cast(epoch.dtype).alias("epoch"))
            .drop("_epoch").collect())


def with_split_steps_joined(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` where a step that an epoch's end cut in two is in the later epoch alone.

    Where steps are numbered on across epochs, the last step number of an epoch is
    also the first of the next when the step began before the epoch ended and ended
    after: micro-batches accumulated at an epoch's end and stepped by the optimizer
    in the next epoch. It is one step, and it ends in the later epoch. Numbers that
    start again in each epoch never meet this way, unless an epoch has a single step
    on both sides (then nothing is joined)."""
    epoch = rows.get_column("epoch")
    if epoch.drop_nulls().n_unique() < 2:
        return rows
    keys = ["proc"] if "proc" in rows.columns else []

    def following(name: str, alias: str) -> pl.Expr:  # the value of the process's next epoch
        value = pl.col(name).shift(-1)
        return (value.over(keys) if keys else value).alias(alias)

    # Of the steps' work: a fetch at an epoch's start carries the new epoch with the last
    # step's number (ai.update(epoch=e) before the loop), and cuts no step in two.
    ranges = (rows.lazy().filter(pl.col("epoch").is_not_null() & pl.col("step").is_not_null()
                                 & pl.col("cat").is_in(WORK_CATS))
              .group_by(*keys, "epoch").agg(pl.col("step").min().alias("_lo"), pl.col("step").max().alias("_hi"))
              .sort(*keys, "epoch"))
    split = (ranges.with_columns(following("epoch", "_later"), following("_lo", "_next_lo"),
                                 following("_hi", "_next_hi"))
             .filter((pl.col("_hi") == pl.col("_next_lo"))
                     & ((pl.col("_lo") < pl.col("_hi")) | (pl.col("_next_lo") < pl.col("_next_hi"))))
             .select(*keys, "epoch", pl.col("_hi").alias("step"), "_later").collect())
    if not split.height:
        return rows
    return (rows.join(split, on=[*keys, "epoch", "step"], how="left", maintain_order="left")
            .with_columns(pl.coalesce("_later", "epoch").cast(epoch.dtype).alias("epoch")).drop("_later"))


def numbers_of(keys: pl.DataFrame, key: np.ndarray, codes: tuple[np.ndarray, int] | None) -> np.ndarray:
    """Each key's step number as the C kernel compares them: its code (a missing step
    before the least), or the number itself (missing: one before the least)."""
    if codes is not None:
        numbers = np.empty(keys.height, dtype=np.int64)
        numbers[key] = codes[0]
        return numbers
    step = keys.get_column("step")
    return step.fill_null((step.min() or 0) - 1).cast(pl.Int64).to_numpy()


def in_epoch_spans(numbers: pl.DataFrame, start: np.ndarray, epoch_starts: np.ndarray) -> pl.DataFrame:
    """``numbers`` (epoch, step of rows starting at ``start``), those that carry no epoch
    numbered, for placing only, by the epoch span they start in (-1 before the first,
    -2 in it, ...): the last step of an epoch of steps numbered without one, in a
    loop over ``ai.pipeline.epoch.iter(...)``, ends with its own work (it ran on to the
    next epoch's start)."""
    if not epoch_starts.size or not numbers.get_column("epoch").null_count():
        return numbers
    span = -1 - np.searchsorted(epoch_starts, start, side="right")
    return numbers.with_columns(pl.coalesce(pl.col("epoch"), pl.Series(span, dtype=pl.Int64)).alias("epoch"))


def with_runs_numbered(numbers: pl.DataFrame, start: np.ndarray) -> pl.DataFrame:
    """``numbers`` (epoch, step of one process's rows starting at ``start``) where the
    rows numbered with a step but no epoch, in a process whose step numbers start
    again, carry the run of numbers they are in as their epoch: 0, 1, ... in time
    order. A run ends where a row's step falls back to its run's least number or
    below once the run has gone past it (a loop that numbers its steps from 0 in each
    pass over the data, with no epoch given and no epoch spans); a row of one thread
    behind another's falls back less, and a span that encloses the first steps and
    carries a later number (taken at its end) falls back before its run has gone on:
    both stay in their run. Unchanged where the numbers never start again."""
    open_rows = (numbers.get_column("epoch").is_null() & numbers.get_column("step").is_not_null()).to_numpy()
    if not open_rows.any():
        return numbers
    at = np.flatnonzero(open_rows)
    at = at[np.argsort(start[at], kind="stable")]
    steps = numbers.get_column("step").gather(at).cast(pl.Int64).to_numpy()
    firsts = []
    low = top = int(steps[0])  # the run's least and greatest numbers so far
    for k in (np.flatnonzero(steps[1:] < steps[:-1]) + 1).tolist():  # where the numbers fall back
        top = max(top, int(steps[k - 1]))  # the numbers rise between the falls
        if steps[k] <= low < top:
            firsts.append(k)
            low = top = int(steps[k])
        else:
            low = min(low, int(steps[k]))
    if not firsts:
        return numbers
    run = np.full(open_rows.size, -1, dtype=np.int64)
    run[at] = np.searchsorted(np.asarray(firsts), np.arange(at.size), side="right")
    epoch = numbers.get_column("epoch")
    return numbers.with_columns(
        pl.when(pl.Series(run >= 0)).then(pl.Series(run)).otherwise(epoch).cast(epoch.dtype).alias("epoch"))


def skipped_steps(steps: np.ndarray, same_epoch: np.ndarray) -> np.ndarray:
    """For each step in time order (``steps``: their numbers; ``same_epoch``: whether
    the next is of the same epoch), whether the next one's number skips some: it is
    further on than the least step forward the process takes (steps untraced between
    them: tracing switched off, steps sampled). Such a step ends with its own work."""
    skipped = np.zeros(steps.size, dtype=bool)
    if steps.size < 2:
        return skipped
    ahead = np.concatenate((steps[1:].astype(np.int64) - steps[:-1].astype(np.int64), [0]))
    forward = same_epoch & (ahead > 0)
    if forward.any():
        skipped = forward & (ahead > ahead[forward].min())
    return skipped


def same_numbers(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise equality that treats two missing epochs as equal."""
    if a.dtype.kind in "iu":  # no epoch missing
        return a == b
    if a.dtype.kind == "f":  # missing epochs are NaN
        return (a == b) | (np.isnan(a) & np.isnan(b))
    return np.array([x == y or (x is None and y is None) or (x != x and y != y) for x, y in zip(a, b)],
                    dtype=bool)


def step_codes(rows: pl.DataFrame) -> tuple[np.ndarray, int] | None:
    """One integer a row numbering its (epoch, step) in their order, missing ones first,
    and the span of the step numbers (the code divided by it is the epoch's); None
    where their range is too wide for one integer."""
    columns, lows, spans = [], [], []
    for name in ("epoch", "step"):
        column = rows.get_column(name)
        low, high = column.min(), column.max()  # None where every value is missing
        low, high = (0, 0) if low is None else (int(low), int(high))
        if column.null_count():  # a missing value takes the place before the least: 0
            column = column.cast(pl.Int64).fill_null(low - 1)
        columns.append(column.to_numpy())
        lows.append(low)
        spans.append(high - low + 2)
    if spans[0] * spans[1] >= 1 << 62:
        return None
    # Built in place in one array: every rank-step's codes are made at once.
    code = columns[0].astype(np.int64)
    code -= lows[0] - 1
    code *= spans[1]
    np.add(code, columns[1], out=code, casting="unsafe")  # the step numbers in their own (narrow) type
    code -= lows[1] - 1
    return code, spans[1]


def regrouped_step_rows(rows: pl.DataFrame, heights: list[int], by: list[str]) -> pl.LazyFrame:
    """The step rows of consecutive pieces (``heights`` rows each, a row a key in
    each; ``by`` and the step and name the key) with a row a key. A step's rows are in
    one piece but for the steps that straddle two: only the rows whose (epoch, step)
    falls within another piece's range of them for the same process are grouped again
    (the shared steps and maybe a few more: exact whatever the rows' order), not every
    row."""
    keys = [*by, "epoch", "step", "cat", "name"]
    extent = [pl.col("start").min(), pl.col("end").max(), pl.col("n").sum()]
    # A fetch, or a span with a step but no epoch, is a row of its own (``rows_apart``):
    # never grouped, nor counted in the pieces' ranges (one without a step has the least
    # code of all).
    apart = rows.select(rows_apart()).to_series().fill_null(False).to_numpy()
    codes = step_codes(rows)
    if codes is None:  # steps too far apart to number with one integer: every row but those apart
        shared = ~apart
    else:
        shared = _in_other_pieces(codes[0], apart, _process_ids(rows, by), heights)
    if not shared.any():
        return rows.lazy()
    shared_rows = pl.Series(shared)
    return pl.concat([rows.filter(~shared_rows).lazy(),
                      rows.filter(shared_rows).lazy().group_by(keys).agg(*extent).select(rows.columns)],
                     how="vertical")


def _process_ids(rows: pl.DataFrame, by: list[str]) -> np.ndarray | None:
    """A number for each row's process (its ``by`` values; equal numbers for one
    process, rarely for two), or None where the rows are of one process."""
    if not by or all(rows.get_column(key).n_unique() <= 1 for key in by):
        return None
    return rows.select(pl.struct(by).hash()).to_series().to_numpy()


def _in_other_pieces(code: np.ndarray, apart: np.ndarray, process: np.ndarray | None,
                     heights: list[int]) -> np.ndarray:
    """Whether each row but those ``apart`` has its ``code`` within the range of the
    codes of another piece's rows of its ``process`` (those apart left out of the
    ranges)."""
    ends = np.cumsum(heights)
    pieces = [(end - height, end) for height, end in zip(heights, ends) if height]
    ranges: dict[object, list[tuple[int, int, int]]] = {}  # process: (piece, least, greatest)
    for i, (a, b) in enumerate(pieces):
        own = ~apart[a:b]
        for proc in ([None] if process is None else np.unique(process[a:b][own]).tolist()):
            mine = own if proc is None else own & (process[a:b] == proc)
            if mine.any():
                ranges.setdefault(proc, []).append((i, int(code[a:b][mine].min()), int(code[a:b][mine].max())))
    shared = np.zeros(code.size, dtype=bool)
    for proc, spans in ranges.items():
        for i, _, _ in spans:
            a, b = pieces[i]
            mine = slice(a, b) if proc is None else np.flatnonzero(process[a:b] == proc) + a
            for j, low, high in spans:
                if j != i:
                    shared[mine] |= (code[mine] >= low) & (code[mine] <= high)
    shared &= ~apart
    return shared


def epoch_span_keys(ts: np.ndarray, count: np.ndarray, count_ok: np.ndarray, epoch: np.ndarray,
                    epoch_ok: np.ndarray) -> np.ndarray:
    """Each of a process's epoch spans' number as read: ``.iter()``'s 1-based count
    less one, else its ``args.epoch``, else minus its start; the events inside renumber
    them (``combine.numbered_as_their_events``). Where the process has other epoch
    spans too (a later loop, whose counts start again, or spans numbered by their args:
    pre-training, then fine-tuning), a loop's spans are numbered by minus their starts,
    so that they are not taken for other epochs of the same number before the events
    inside number them."""
    key = np.where(count_ok, count - 1, np.where(epoch_ok, epoch, -ts))
    counted = np.flatnonzero(count_ok)
    if counted.size:
        c = count[counted[np.argsort(ts[counted], kind="stable")]]
        if counted.size < count.size or (c[1:] <= c[:-1]).any():
            key[counted] = -ts[counted]
    return key
