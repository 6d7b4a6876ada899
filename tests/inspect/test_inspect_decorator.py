"""capture= on decorated functions: parameters, results, errors, kinds of function."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

import dftrace
from dftrace import ai, testing
from dftrace._core import functions as _functions


def test_capture_true_records_every_parameter_by_name():
    """capture=True binds positional and keyword arguments to parameter names."""
    @ai.compute.forward(capture=True)
    def f(x, y, *, scale):
        return x

    with testing.trace_to_memory() as result:
        f(1, y="b", scale=0.5)
    testing.assert_span(result, "forward", cat="compute", count=1,
                        args={"params": {"x": 1, "y": "b", "scale": 0.5}})


def test_defaults_are_recorded_for_parameters_not_passed():
    """A parameter left at its default is recorded with that default."""
    @ai.compute.forward(capture=True)
    def f(x, lr=0.01):
        return x

    with testing.trace_to_memory() as result:
        f(3)
    testing.assert_span(result, "forward", args={"params.lr": 0.01, "params.x": 3})


def test_capture_list_records_only_the_named_parameters():
    """capture=[names] records those parameters and no others."""
    @ai.data.preprocess(capture=["image"])
    def f(image, secret):
        return image

    with testing.trace_to_memory() as result:
        f(image="cat.png", secret="hunter2")
    [span] = testing.assert_span(result, "preprocess")
    assert span["args"]["params"] == {"image": "cat.png"}


def test_capture_a_single_name_as_a_string():
    """capture="name" is the same as capture=["name"]."""
    @ai.data.preprocess(capture="b")
    def f(a, b):
        return a

    with testing.trace_to_memory() as result:
        f(1, 2)
    assert testing.assert_span(result, "preprocess")[0]["args"]["params"] == {"b": 2}


def test_var_args_and_kwargs_are_captured():
    """*args are recorded as a list and **kwargs as a dict; a name inside **kwargs
    can be asked for directly."""
    @ai.compute.step(capture=True)
    def f(*rest, **options):
        return None

    @ai.compute.backward(capture=["momentum"])
    def g(**options):
        return None

    with testing.trace_to_memory() as result:
        f(1, 2, lr=3)
        g(momentum=0.9, other=1)
    testing.assert_span(result, "step", args={"params.rest": [1, 2], "params.options": {"lr": 3}})
    testing.assert_span(result, "backward", args={"params": {"momentum": 0.9}})


def test_self_is_left_out_of_capture_true():
    """Methods record their arguments but not self."""
    class Model:
        @ai.compute.forward(capture=True)
        def forward(self, x):
            return x

    with testing.trace_to_memory() as result:
        Model().forward(5)
    assert testing.assert_span(result, "forward")[0]["args"]["params"] == {"x": 5}


def test_classmethods_and_staticmethods_capture_their_arguments():
    """Decorated class and static methods capture like functions (cls left out)."""
    class Loader:
        @classmethod
        @ai.data.item(capture=True)
        def build(cls, path):
            return path

        @ai.data.preprocess(capture=True)
        @staticmethod
        def clean(text):
            return text.strip()

    with testing.trace_to_memory() as result:
        Loader.build("/data")
        Loader.clean(" a ")
    testing.assert_span(result, "item", args={"params": {"path": "/data"}})
    testing.assert_span(result, "preprocess", args={"params": {"text": " a "}})


def test_capture_result_records_the_return_value():
    """capture_result=True records the summarised return value under args.result."""
    np = pytest.importorskip("numpy")
    @ai.compute.forward(capture_result=True)
    def f(n):
        return np.zeros((n, 2), dtype=np.float32)

    with testing.trace_to_memory() as result:
        f(4)
    [span] = testing.assert_span(result, "forward", args={"result.shape": [4, 2]})
    assert "params" not in span["args"]


def test_misspelt_parameter_name_fails_at_decoration_listing_the_real_ones():
    """A name the function does not have raises TypeError naming its parameters."""
    with pytest.raises(TypeError, match=r"'bacth'.*parameters are: batch, step"):
        @ai.compute.forward(capture=["bacth"])
        def f(batch, step):
            return batch


def test_unknown_option_error_mentions_capture_options():
    """The error for an unknown option lists the capture options among the valid ones."""
    with pytest.raises(TypeError, match="capture="):
        ai.compute.forward(captur=True)


def test_parameter_whose_repr_raises_does_not_break_the_call():
    """Capturing an argument whose repr raises still returns the function's result."""
    class Hostile:
        def __repr__(self):
            raise RuntimeError("repr exploded")

    @ai.compute.forward(capture=True, capture_result=True)
    def f(x):
        return 42

    with testing.trace_to_memory() as result:
        assert f(Hostile()) == 42
    [span] = testing.assert_span(result, "forward", args={"result": 42})
    assert "repr failed" in span["args"]["params"]["x"]


def test_values_whose_attributes_raise_do_not_break_the_call():
    """An object whose shape property raises is summarised without raising."""
    class Lazy:
        @property
        def shape(self):
            raise RuntimeError("not loaded")

    @ai.compute.forward(capture=True)
    def f(x):
        return "ok"

    with testing.trace_to_memory() as result:
        assert f(Lazy()) == "ok"
    testing.assert_span(result, "forward", count=1)


def test_no_reference_to_a_captured_value_survives_the_call():
    """Captured parameters and results are freed once the caller drops them."""
    class Blob:
        pass

    @ai.compute.forward(capture=True, capture_result=True)
    def f(x):
        return Blob()

    arg = Blob()
    with testing.trace_to_memory():
        out = f(arg)
    refs = [weakref.ref(arg), weakref.ref(out)]
    del arg, out
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_an_exception_records_params_and_error_and_propagates():
    """A call that raises keeps its params, gains error and error_message, and the
    exception reaches the caller unchanged."""
    @ai.compute.forward(capture=True, capture_result=True)
    def f(x):
        raise KeyError("label")

    with testing.trace_to_memory() as result:
        with pytest.raises(KeyError):
            f(7)
    [span] = testing.assert_span(result, "forward", args={"params.x": 7, "error": "KeyError"})
    assert "label" in span["args"]["error_message"]
    assert "result" not in span["args"]


def test_async_functions_capture_params_and_result():
    """Coroutine functions record arguments and the awaited result."""
    @ai.comm.all_reduce(capture=True, capture_result=True)
    async def reduce(values):
        await asyncio.sleep(0)
        return sum(values)

    with testing.trace_to_memory() as result:
        assert asyncio.run(reduce([1, 2, 3])) == 6
    testing.assert_span(result, "all_reduce", args={"params.values": [1, 2, 3], "result": 6})


def test_generator_functions_capture_params_and_return_value():
    """A generator's span records its arguments and its return value, not its items."""
    @ai.data.item(capture=True, capture_result=True)
    def gen(n):
        yield from range(n)
        return "done"

    with testing.trace_to_memory() as result:
        assert list(gen(3)) == [0, 1, 2]
    testing.assert_span(result, "item", args={"params.n": 3, "result": "done"})


def test_a_generator_closed_early_is_not_an_error():
    """Breaking out of a capturing generator closes its span without an error."""
    @ai.data.item(capture=True)
    def gen():
        yield from range(10)

    with testing.trace_to_memory() as result:
        for i in gen():
            if i == 2:
                break
    [span] = testing.assert_span(result, "item")
    assert "error" not in span["args"]


def test_async_generators_capture_their_arguments():
    """Async generator functions record their arguments."""
    @ai.dataloader.fetch(capture=True)
    async def stream(n):
        for i in range(n):
            yield i

    async def main():
        return [x async for x in stream(2)]

    with testing.trace_to_memory() as result:
        assert asyncio.run(main()) == [0, 1]
    testing.assert_span(result, "fetch", args={"params.n": 2})


def test_use_args_and_captured_values_share_the_event():
    """args= given with capture= are written beside params and result."""
    @ai.compute.forward(args={"model": "mlp"}, capture=["x"], capture_result=True)
    def f(x):
        return x + 1

    with testing.trace_to_memory() as result:
        f(1)
    testing.assert_span(result, "forward", args={"model": "mlp", "params.x": 1, "result": 2})


def test_capture_options_survive_adding_args_to_a_use():
    """Calling a capturing use with more args keeps its capture options."""
    use = ai.compute.forward(capture=True)(args={"epoch": 1})

    @use
    def f(x):
        return x

    with testing.trace_to_memory() as result:
        f(9)
    testing.assert_span(result, "forward", args={"epoch": 1, "params.x": 9})


def test_captured_values_are_written_to_trace_files(tmp_path):
    """A file session writes captured values under args.params / args.result."""
    np = pytest.importorskip("numpy")
    @ai.compute.forward(capture=True, capture_result=True)
    def f(batch):
        return batch.sum()

    with testing.trace_to(tmp_path) as result:
        f(np.ones((8, 3)))
    [span] = testing.assert_span(result, "forward")
    assert span["args"]["params"]["batch"]["shape"] == [8, 3]
    assert span["args"]["result"] == 24.0


def test_disabled_capturing_node_records_nothing_and_still_returns():
    """A disabled node with capture= runs the function and records nothing."""
    @ai.compute.forward(capture=True)
    def f(x):
        return x * 2

    ai.compute.forward.disable()
    with testing.trace_to_memory() as result:
        assert f(4) == 8
    assert testing.spans(result.events) == []


def test_without_capture_the_decorator_is_the_plain_span_wrapper():
    """A use without capture= gets exactly the wrapper the core makes for any
    node: capture adds nothing to the hot path."""
    def f(x):
        return x

    plain = ai.compute.forward(f)
    with_args = ai.compute.forward(args={"a": 1})(f)
    reference = _functions.wrap_sync(f, ai.compute.forward, ai.compute.forward)
    for wrapped in (plain, with_args):
        assert type(wrapped) is type(reference)
        if hasattr(reference, "__code__"):
            assert wrapped.__code__ is reference.__code__


def test_plain_use_is_not_a_capturing_use():
    """Only uses given a capture option become capturing uses."""
    from dftrace._inspect.capturing import CapturingUse

    for use in (ai.compute.forward(args={"a": 1}), ai.compute.forward(capture=False)):
        assert isinstance(use, dftrace.Use) and not isinstance(use, CapturingUse)
    assert isinstance(ai.compute.forward(capture_result=True), CapturingUse)


def _f1(a, b=2, *args, c, d=4, **kw):
    pass


def _f2(a, /, b, *, c=3):
    pass


def _f3(*args, **kwargs):
    pass


def _f4(x, y=None):
    pass


_CALLS = [((), {}), ((1,), {}), ((1, 2), {}), ((1, 2, 3), {}), ((1,), {"c": 5}),
          ((1, 2, 3, 4), {"c": 5, "z": 6}), ((), {"a": 1, "c": 2}), ((1,), {"a": 2, "c": 3}),
          ((1,), {"b": 2}), ((1, 2), {"b": 3}), ((), {"args": 1, "kw": 2}),
          ((1,), {"y": 2, "x": 3}), ((1, 2), {"c": 1})]


@pytest.mark.parametrize("fn", [_f1, _f2, _f3, _f4])
@pytest.mark.parametrize("call", _CALLS)
def test_arguments_bind_exactly_as_python_binds_them(fn, call):
    """Captured params equal inspect.Signature.bind + apply_defaults for every call
    shape, and nothing is captured for a call the signature rejects."""
    import inspect

    from dftrace._inspect.binding import CaptureOptions
    from dftrace._inspect.values import describe_value

    args, kwargs = call
    captured = CaptureOptions(True).bind(fn).params(args, kwargs)
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        assert captured is None
        return
    bound.apply_defaults()
    assert captured == {k: describe_value(v) for k, v in bound.arguments.items()}
