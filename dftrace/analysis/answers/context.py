"""What every answer reads: the combined aggregates, the processes and runs, and the steps
of the stage being answered.

The summary is built in three stages (``summary.STAGES``), each a list of answers
over the tables the stage's ``enter`` put in the context. An answer is a function
of the context returning some of the Summary's fields. The stages follow the steps'
tables, the largest the answers read:

1. ``process_steps``: each process's steps, as modelled from the files;
2. ``units``: each unit's (rank's) steps, found from them (a stage of its own with
   no answers, so that the process steps are let go and their pages handed back
   before the units' tables are built), and what is found from those (the step
   compared across ranks, compute and wait per rank-step);
3. no steps: the answers that read the aggregates alone, the unit steps let go.

A field is None outside its stage, so an answer listed in the wrong stage fails at
once rather than reading a table that is no longer whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl

from ..reduce.combine import Combined


@dataclass
class UnitTables:
    """The units' steps and what the step answers find from them."""

    #: unit, unit_order, epoch, step, start, dur, blocked_us: one row per rank-step.
    by_unit: pl.DataFrame
    #: ``by_unit`` with a resumed job's steps from their last run only: what ranks compare.
    compared: pl.DataFrame
    #: Per (epoch, step) across units (see ``steps.steps_across_units``).
    steps: pl.DataFrame
    #: Compute time per unit, µs.
    compute_us: dict[str, int]
    #: (rank, host) per unit.
    rank_host: dict[str, tuple[Any, Any]]


@dataclass
class Context:
    """The combined aggregates and the steps of the stage being answered."""

    combined: Combined
    #: proc, label, rank, host, pid, dropped, unit, unit_order, run
    procs: pl.DataFrame
    runs: list[dict[str, Any]]
    #: How many rank-steps ``rank_steps`` keeps at most.
    rank_steps_limit: int
    #: Each process's steps: stage 1 only.
    process_steps: pl.DataFrame | None = None
    #: Each unit's steps (see ``unit_steps``), between stages 1 and 2.
    by_unit: pl.DataFrame | None = None
    #: The units' steps: stage 2 only.
    units: UnitTables | None = None


#: An answer: some of the Summary's fields, from the context.
Answer = Callable[[Context], dict[str, Any]]


@dataclass(frozen=True)
class Stage:
    """A stage of the summary: how its tables are made (from the last stage's, which
    it lets go), and the answers that read them, in the order they are built."""

    enter: Callable[[Context], None]
    answers: tuple[Answer, ...]


def from_aggregates(context: Context) -> None:
    """The last stage's entry: the answers that follow read the aggregates alone."""
    context.units = None
