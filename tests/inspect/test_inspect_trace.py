"""dftrace.trace_in_memory() and the Trace it yields: recording in memory, browsing, loading."""

from __future__ import annotations

import os
import threading
import xml.etree.ElementTree as ET

import pytest

import dftrace
from dftrace import ai, testing
from dftrace._core import buffer as _buffer
from dftrace._core.state import STATE


@ai.compute.forward(capture=True, capture_result=True)
def forward(x, scale=1):
    return x * scale


@ai.compute.backward(capture=["grad"])
def backward(grad):
    return grad


def train(n=2):
    for i in ai.dataloader.fetch.iter(range(n)):
        y = forward(i, scale=10)
        backward(y)


def test_an_in_memory_trace_records_without_files_or_initialize(tmp_path, monkeypatch):
    """An in-memory trace needs no initialize, writes no file, and leaves no session behind."""
    monkeypatch.chdir(tmp_path)
    with dftrace.trace_in_memory() as t:
        train()
    assert len(t.compute.forward) == 2
    assert os.listdir(tmp_path) == []
    assert dftrace.session() is None


def test_nodes_stop_recording_after_the_in_memory_trace_ends():
    """After the block, nodes are off again and nothing piles up in the buffer."""
    with dftrace.trace_in_memory():
        train()
    forward(1)
    assert not ai.compute.forward.enabled
    assert _buffer.buffered() == 0


def test_browse_by_category_name_and_position():
    """t.compute.forward[0] reaches the first forward call, with params and result."""
    with dftrace.trace_in_memory() as t:
        train()
    call = t.compute.forward[1]
    assert (call.name, call.cat) == ("forward", "compute")
    assert call.params == {"x": 1, "scale": 10}
    assert call.params.x == 1
    assert call.result == 10
    block = call.parent
    assert block.name == "fetch.block" and call in block.children
    assert block.start <= call.start and call.start + call.duration <= block.start + block.duration
    assert call.args["params"]["scale"] == 10


def test_attribute_and_item_access_are_equivalent():
    """t.a.b[i].c and t["a"]["b"][i]["c"] are the same objects at every level."""
    with dftrace.trace_in_memory() as t:
        train()
    assert t.compute.forward[0] is t["compute"]["forward"][0]
    assert t.compute.forward[0].params is t["compute"]["forward"][0]["params"]
    assert t.compute.forward[0].x == t["compute"]["forward"][0]["x"] == 0
    assert t["compute.forward"][1] is t.compute.forward[1]
    assert t.dataloader["fetch.iter"][0] is t.dataloader.fetch.iter[0]


def test_a_category_indexes_all_its_calls_in_start_order():
    """t.compute[i] is the i-th call of the category, whatever its name."""
    with dftrace.trace_in_memory() as t:
        train()
    assert [c.name for c in t.compute] == ["forward", "backward", "forward", "backward"]
    assert t.compute[1] is t.compute.backward[0]
    assert [c.name for c in t.compute[1:3]] == ["backward", "forward"]


def test_dotted_names_read_as_nested_keys():
    """fetch.iter and fetch.block are reached as t.dataloader.fetch.iter / .block."""
    with dftrace.trace_in_memory() as t:
        train(3)
    assert t.dataloader.keys() == ["fetch"]
    assert sorted(t.dataloader.fetch.keys()) == ["block", "end", "iter"]
    assert [c.args["count"] for c in t.dataloader.fetch.iter] == [1, 2, 3]


def test_children_and_parent_follow_nesting():
    """A call's children are the calls nested in it, and each child knows its parent."""
    with dftrace.trace_in_memory() as t:
        train()
    block = t.dataloader.fetch.block[0]
    assert [c.name for c in block.children] == ["forward", "backward"]
    assert block.children.forward[0].parent is block
    assert t.dataloader.fetch.block[1].children.backward[0].params.grad == 10
    assert [c.name for c in t.roots] == ["fetch.iter", "fetch.block"] * 2 + ["fetch.end"]


def test_dir_lists_the_valid_keys():
    """dir() at each level offers the keys that work there (tab completion)."""
    with dftrace.trace_in_memory() as t:
        train()
    assert {"compute", "dataloader"} <= set(dir(t))
    assert {"forward", "backward"} <= set(dir(t.compute))
    assert {"x", "scale", "params", "result", "duration", "children"} <= set(dir(t.compute.forward[0]))
    assert {"x", "scale"} == set(dir(t.compute.forward[0].params))
    assert t._ipython_key_completions_() == ["dataloader", "compute"]


def test_wrong_category_lists_the_valid_ones():
    """A wrong category raises an error (both KeyError and AttributeError) naming the valid ones."""
    with dftrace.trace_in_memory() as t:
        train()
    with pytest.raises(AttributeError, match=r"valid categories: dataloader, compute.*'compute'\?"):
        t.compte
    with pytest.raises(KeyError, match="valid categories: dataloader, compute"):
        t["compte"]


def test_a_name_used_as_a_category_points_to_its_category():
    """t.forward explains that forward lives under t.compute."""
    with dftrace.trace_in_memory() as t:
        train()
    with pytest.raises(KeyError, match=r"use t\.compute\.forward"):
        t.forward


def test_wrong_name_and_field_on_a_call_list_explain_the_fix():
    """A wrong name lists the names; a call field on a list says to index a call first."""
    with dftrace.trace_in_memory() as t:
        train()
    with pytest.raises(AttributeError, match="valid names: forward, backward"):
        t.compute.forwrd
    with pytest.raises(AttributeError, match=r"pick one first, e\.g\. \[0\]\.params"):
        t.compute.forward.params


def test_wrong_key_on_a_call_and_on_params_lists_the_valid_ones():
    """A call and its params reject unknown keys with the keys they have."""
    with dftrace.trace_in_memory() as t:
        train()
    call = t.compute.forward[0]
    with pytest.raises(AttributeError, match="valid keys: x, scale, name"):
        call.batch
    with pytest.raises(KeyError, match="valid keys: x, scale"):
        call.params["batch"]


def test_index_out_of_range_says_how_many_calls_there_are():
    """An index past the end says how many calls the list has."""
    with dftrace.trace_in_memory() as t:
        train()
    with pytest.raises(IndexError, match="compute.forward has 2 call"):
        t.compute.forward[5]


def test_notebook_probes_get_plain_attribute_errors():
    """Jupyter's probing for _repr_*_ / _ipython_display_ finds nothing and raises nothing else."""
    with dftrace.trace_in_memory() as t:
        train()
    for obj in (t, t.compute, t.compute.forward[0], t.compute.forward[0].params):
        assert getattr(obj, "_repr_png_", None) is None
        assert not hasattr(obj, "_ipython_display_")


def _table_rows(text: str) -> list[list[str]]:
    lines = text.splitlines()
    sep = next(i for i, line in enumerate(lines) if set(line.replace(" ", "")) == {"-"})
    return [line.split() for line in lines[sep + 1:]]


def test_print_shows_one_summary_row_per_category_and_name():
    """print(t) is a table: category, name, number of calls and what was captured."""
    with dftrace.trace_in_memory() as t:
        train(3)
    text = str(t)
    assert text.startswith("dftrace trace: 13 call(s) in 2 categories")
    rows = {(r[0], r[1]): r for r in _table_rows(text)}
    assert set(rows) == {("dataloader", "fetch.iter"), ("dataloader", "fetch.block"), ("dataloader", "fetch.end"),
                         ("compute", "forward"), ("compute", "backward")}
    assert rows[("compute", "forward")][2] == "3"
    assert "x, scale; result" in text
    assert repr(t) == text


def test_print_of_a_call_list_shows_params_and_results_per_call():
    """Printing t.compute.forward lists each call with its params and result."""
    with dftrace.trace_in_memory() as t:
        train(2)
    text = str(t.compute.forward)
    assert text.splitlines()[0].startswith("compute.forward: 2 call(s)")
    rows = _table_rows(text)
    assert [r[0] for r in rows] == ["0", "1"]
    assert "x=1, scale=10" in text.splitlines()[-1] and text.splitlines()[-1].endswith("10")


def test_print_of_a_call_shows_its_fields():
    """Printing one call lists duration, each param, result and children."""
    with dftrace.trace_in_memory() as t:
        train(1)
    def fields(text):
        return dict(line.split(None, 1) for line in text.splitlines())

    block = fields(str(t.dataloader.fetch.block[0]))
    assert block["call"] == "dataloader.fetch.block"
    assert block["children"] == "forward ×1, backward ×1"
    call = fields(str(t.compute.forward[0]))
    assert (call["params.x"], call["params.scale"], call["result"]) == ("0", "10", "0")


def test_repr_html_renders_a_well_formed_escaped_table():
    """In a notebook, a trace renders as an HTML table with one row per name, and
    captured text is escaped."""
    @ai.data.preprocess(capture=True)
    def clean(text):
        return text

    with dftrace.trace_in_memory() as t:
        train(2)
        clean("<script>alert(1)</script>")
    page = t._repr_html_()
    table = ET.fromstring(page)  # well-formed: parses as XML
    assert table.tag == "table"
    assert table.find("caption").text.startswith("dftrace trace: 10 call(s)")
    header = [th.text for th in table.find("thead").iter("th")]
    assert header[:3] == ["category", "name", "calls"]
    body = [[td.text for td in tr] for tr in table.find("tbody")]
    assert [r[1] for r in body] == ["fetch.iter", "fetch.block", "forward", "backward", "fetch.end", "preprocess"]
    call_page = t.data.preprocess[0]._repr_html_()
    assert "<script>" not in call_page and "&lt;script&gt;" in call_page
    cells = [td.text for td in ET.fromstring(call_page).iter("td")]
    assert "'<script>alert(1)</script>'" in cells
    list_rows = ET.fromstring(t.compute.forward._repr_html_()).find("tbody")
    assert len(list_rows) == 2


def test_exception_leaves_a_partial_trace_and_a_note():
    """If the block raises, the trace so far is in the `as` object and in
    last_in_memory_trace(), and the exception carries a note saying so."""
    with pytest.raises(RuntimeError) as info:
        with dftrace.trace_in_memory() as t:
            train(2)
            raise RuntimeError("disk full")
    assert len(t.compute.forward) == 2
    assert t.partial and t.error == "RuntimeError: disk full"
    assert dftrace.last_in_memory_trace() is t
    notes = getattr(info.value, "__notes__", [])
    assert len(notes) == 1 and "dftrace.last_in_memory_trace()" in notes[0] and "9 call(s)" in notes[0]
    assert "PARTIAL" in str(t)


def test_last_in_memory_trace_is_the_latest_finished_one():
    """last_in_memory_trace() returns the trace of the most recent trace_in_memory block."""
    assert dftrace.last_in_memory_trace() is None
    with dftrace.trace_in_memory() as first:
        pass
    with dftrace.trace_in_memory() as second:
        train(1)
    assert dftrace.last_in_memory_trace() is second and first is not second


def test_spans_open_before_the_in_memory_trace_are_not_in_it(tmp_path):
    """A span that started before the in-memory trace (an enclosing epoch) is left out;
    what ran inside is in."""
    with testing.trace_to(tmp_path):
        with ai.pipeline.epoch:
            with dftrace.trace_in_memory() as t:
                train(1)
    assert t.categories == ["dataloader", "compute"]


def test_an_in_memory_trace_beside_a_file_session_gives_both_the_events(tmp_path):
    """With a file session running, the file and the in-memory trace get the same calls."""
    with testing.trace_to(tmp_path) as written:
        with dftrace.trace_in_memory() as t:
            train(2)
    file_spans = testing.spans(written.events)
    assert len(file_spans) == len(t) == 9
    testing.assert_span(written, "forward", count=2, args={"params.scale": 10})


def test_trace_load_builds_the_same_structure_as_trace_in_memory(tmp_path):
    """Trace.load(dir) of a file written alongside an in-memory trace browses identically."""
    with testing.trace_to(tmp_path):
        with dftrace.trace_in_memory() as memory:
            train(2)
    loaded = dftrace.Trace.load(tmp_path)

    def shape(trace):
        return [(c.cat, c.name, dict(c.params), c.result, c.parent and c.parent.id,
                 c.ts, c.dur) for c in trace]

    assert shape(loaded) == shape(memory)
    assert str(loaded) == str(memory)


def test_trace_load_of_a_missing_path_raises_file_not_found(tmp_path):
    """Loading where there are no trace files is a clear FileNotFoundError."""
    with pytest.raises(FileNotFoundError, match="no trace files"):
        dftrace.Trace.load(tmp_path / "nothing")


def test_trace_load_reads_dftracer_files_and_nests_by_time(samples):
    """A DFTracer 2.2 file (integer ph, no p_idx) loads; nesting comes from timing."""
    t = dftrace.Trace.load(samples / "dftracer-2.2.0_meta" / "toy-1629759c158d1f1f-app.pfw.gz")
    item = t.data.item[0]
    assert [c.name for c in item.children] == ["preprocess"]
    assert item.children[0].parent is item
    assert len(t.data.item) == len([c for c in t if c.name == "item"]) > 0


def test_trace_from_events_without_p_idx_nests_by_containment():
    """Events with no p_idx nest when one lies inside another on the same thread."""
    events = [
        {"name": "outer", "cat": "c", "ph": "X", "pid": 1, "tid": 1, "ts": 100, "dur": 50},
        {"name": "inner", "cat": "c", "ph": "X", "pid": 1, "tid": 1, "ts": 110, "dur": 10},
        {"name": "other_thread", "cat": "c", "ph": "X", "pid": 1, "tid": 2, "ts": 110, "dur": 10},
        {"name": "after", "cat": "c", "ph": "X", "pid": 1, "tid": 1, "ts": 160, "dur": 10},
    ]
    t = dftrace.Trace(events)
    assert [c.name for c in t.c.outer[0].children] == ["inner"]
    assert [c.name for c in t.roots] == ["outer", "other_thread", "after"]


def test_nested_in_memory_traces_each_get_their_own_window():
    """An inner in-memory trace sees its block; the outer one sees everything."""
    with dftrace.trace_in_memory() as outer:
        train(1)
        with dftrace.trace_in_memory() as inner:
            forward(5)
        backward(1)
    assert [c.params.x for c in inner.compute.forward] == [5]
    assert len(outer.compute.forward) == 2 and len(outer.compute.backward) == 2


def test_calls_from_other_threads_are_recorded():
    """Calls made on another thread during the block are in the trace, on their own tid."""
    with dftrace.trace_in_memory() as t:
        th = threading.Thread(target=forward, args=(3,))
        th.start()
        th.join()
        forward(4)
    tids = {c.params.x: c.tid for c in t.compute.forward}
    assert set(tids) == {3, 4} and tids[3] != tids[4]


def test_long_in_memory_traces_drain_the_buffer_as_they_go():
    """Without a file session the in-memory trace drains the buffer under pressure, losing nothing."""
    STATE.batch_size = 1000
    high_water = []

    @ai.compute.step
    def step():
        return None

    with dftrace.trace_in_memory() as t:
        for i in range(20_000):
            step()
            if i % 1000 == 0:
                high_water.append(_buffer.buffered())
    assert len(t.compute.step) == 20_000
    assert max(high_water) < 10_000


def test_an_in_memory_trace_cannot_be_entered_twice_at_once():
    """Re-entering a running trace_in_memory() object is a RuntimeError."""
    c = dftrace.trace_in_memory()
    with c:
        with pytest.raises(RuntimeError, match="already running"):
            c.__enter__()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_max_items_must_be_a_positive_int(bad):
    """trace_in_memory(max_items=...) rejects anything but a positive int."""
    with pytest.raises(ValueError, match="positive int"):
        dftrace.trace_in_memory(max_items=bad)


def test_an_exception_that_cannot_be_printed_still_leaves_the_trace():
    """A block raising an exception whose str() raises still yields the partial trace."""
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no str")

    with pytest.raises(Unprintable):
        with dftrace.trace_in_memory() as t:
            forward(1)
            raise Unprintable()
    assert t.partial and t.error == "Unprintable" and len(t.compute.forward) == 1
