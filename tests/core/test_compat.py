"""DFTracer programs port by changing one import."""

from __future__ import annotations

from dftrace import testing
from dftrace.logger import ai, dft_fn, dftracer

from ._util import assert_valid


def test_dftracer_style_program(tmp_path):
    """``dftracer.initialize_log``, ``dft_fn`` as context manager, ``.log``, ``.log_init``,
    ``.iter`` and ``.update`` write DFTracer's event names."""
    log = dftracer.initialize_log(logfile=str(tmp_path / "run.pfw"), data_dir=None, process_id=-1)
    fn = dft_fn("COMPUTE")

    class Model:
        @fn.log_init
        def __init__(self):
            self.w = 1

        @fn.log
        def step(self, x):
            return x * self.w

    m = Model()
    fn.update(epoch=2)
    for x in fn.iter(range(2)):
        m.step(x)
    with dft_fn("IO", name="read") as d:
        d.update(step=7)
    with ai.compute.forward:
        pass
    log.finalize()
    events = testing.read_events(tmp_path)
    names = [(e["cat"], e["name"]) for e in testing.spans(events)]
    init_name = Model.__init__.__qualname__  # DFTracer names events by __qualname__
    step_name = Model.step.__qualname__
    assert init_name.endswith("Model.__init__") and ("COMPUTE", init_name) in names
    assert names.count(("COMPUTE", step_name)) == 2
    assert names.count(("COMPUTE", "loop.iter")) == 2 and names.count(("COMPUTE", "loop.yield")) == 2
    assert ("IO", "read") in names and ("compute", "forward") in names
    step = testing.spans(events, step_name)[0]
    assert step["args"]["epoch"] == 2
    assert testing.spans(events, "read")[0]["args"]["step"] == 7
    assert_valid(testing.trace_files(tmp_path))


def test_log_event_and_metadata(tmp_path):
    """``log_event`` writes a finished event; ``log_metadata_event`` a CM entry."""
    log = dftracer.initialize_log(logfile=str(tmp_path / "run"), data_dir=None, process_id=-1)
    t = log.get_time()
    log.log_event("custom", "USER", t, 5, int_args={"n": (0, 3)}, string_args={"s": "v"})
    log.log_metadata_event("model", "resnet")
    log.finalize()
    events = testing.read_events(tmp_path)
    (e,) = testing.spans(events, "custom")
    assert (e["cat"], e["ts"], e["dur"], e["args"]["n"], e["args"]["s"]) == ("USER", t, 5, 3, "v")
    cm = [x for x in events if x.get("name") == "CM"]
    assert cm[0]["args"]["name"] == "model" and cm[0]["args"]["value"] == "resnet"


def test_dftracers_own_options_of_log_and_iter(tmp_path):
    """DFTracer's keyword spellings (``@fn.log(name=...)``, ``@fn.log_init(name=...)``,
    ``@fn.log_static(name=...)``, ``fn.iter(..., include_yield=False)`` or
    ``include_iter=False``) work as there; they raised TypeError."""
    log = dftracer.initialize_log(logfile=str(tmp_path / "run.pfw"), data_dir=None, process_id=-1)
    fn = dft_fn("COMPUTE")

    @fn.log(name="named")
    def work():
        return 3

    class Model:
        @fn.log_init(name="Model.made")
        def __init__(self):
            self.w = 1

        @staticmethod
        @fn.log_static(name="helper")
        def helper():
            return 4

    assert work() == 3 and Model().w == 1 and Model.helper() == 4
    assert list(fn.iter(range(3), name="waits", include_yield=False)) == [0, 1, 2]
    assert list(fn.iter(range(2), name="uses", include_iter=False)) == [0, 1]
    log.finalize()
    spans = testing.spans(testing.read_events(tmp_path))
    names = [(e["cat"], e["name"]) for e in spans]
    for name in ("named", "Model.made", "helper"):
        assert names.count(("COMPUTE", name)) == 1, names
    assert [e["args"]["count"] for e in spans if e["name"] == "waits.iter"] == [1, 2, 3]
    assert not [e for e in spans if e["name"] in ("waits.yield", "uses.iter")]
    assert [e["args"]["count"] for e in spans if e["name"] == "uses.yield"] == [1, 2]
    assert_valid(testing.trace_files(tmp_path))


def test_dftracer_enable_0_starts_nothing(tmp_path, monkeypatch):
    """``DFTRACER_ENABLE=0``, DFTracer's switch, keeps ``initialize_log`` from tracing."""
    import dftrace

    monkeypatch.setenv("DFTRACER_ENABLE", "0")
    log = dftracer.initialize_log(logfile=str(tmp_path / "run.pfw"), data_dir=None, process_id=-1)
    with dft_fn("IO", name="read"):
        pass
    log.finalize()
    assert dftrace.session() is None and testing.trace_files(tmp_path) == []
