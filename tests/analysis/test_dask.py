"""The same analysis on a real distributed.LocalCluster (two worker processes, loopback)."""

from __future__ import annotations

import functools
import json

import pytest

pytest.importorskip("distributed", reason="needs the dask extra: pip install 'dftrace[dask]'")

from polars.testing import assert_frame_equal  # noqa: E402

from dftrace.analysis import load_traces, summarize  # noqa: E402
from dftrace.analysis.commands import main  # noqa: E402


def test_summary_on_dask_equals_embedded(run_dir, dask_executor):
    """Partials computed on Dask workers combine to the embedded summary."""
    assert summarize(run_dir, executor=dask_executor) == summarize(run_dir)


def test_split_files_on_dask_equal_whole_files(run_dir, dask_executor):
    """Frame-range partitions spread over workers still combine exactly."""
    split = summarize(run_dir, executor=dask_executor, partition_bytes=600).to_dict()
    whole = summarize(run_dir).to_dict()
    assert split["breakdown"] == whole["breakdown"] and split["categories"] == whole["categories"]
    assert split["steps"] == whole["steps"]


def test_load_on_dask_equals_embedded(run_dir, dask_executor):
    """Loading on workers yields the same table, processes and reports."""
    on_dask = load_traces(run_dir, executor=dask_executor)
    embedded = load_traces(run_dir)
    assert_frame_equal(on_dask.events, embedded.events)
    assert_frame_equal(on_dask.processes, embedded.processes)
    assert on_dask.files == embedded.files


def test_cli_runs_on_an_existing_scheduler(run_dir, dask_executor, capsys):
    """`summary --scheduler ADDRESS --json` matches the embedded run."""
    assert main(["summary", str(run_dir), "--json", "--scheduler", dask_executor.address]) == 0
    on_dask = json.loads(capsys.readouterr().out)
    assert main(["summary", str(run_dir), "--json"]) == 0
    assert on_dask == json.loads(capsys.readouterr().out)


def test_executor_keeps_item_order(dask_executor):
    """Results come back in the order of the items, whatever order workers finish in."""
    assert dask_executor.map(abs, [-3, 2, -1, 0]) == [3, 2, 1, 0]


def test_map_stream_runs_one_item_a_task_in_item_order(dask_executor):
    """A function over a stream of items runs on the cluster one item a task."""
    assert dask_executor.map_stream(functools.partial(map, abs), [-3, 2, -1, 0]) == [3, 2, 1, 0]
