"""The profiler tree: ``ai.<category>.<event>`` nodes and their uses.

A :class:`Node` is shared by every thread, task and call site that names it, so it
holds no per-call state: start times live in frames on the caller's own stack (see
:mod:`.engine`). A node works as a decorator, a context manager, an iterator wrapper
and a start/stop hook. Calling it with options (``node(args=..., enable=...)``) makes
a :class:`Use`: the same event with args of its own, still switched by its node's
``enable``/``disable`` and reached by its ``update`` unless ``enable=`` was forced.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterable
from typing import Any, Callable, TypeVar

from ..format import names as fmt
from . import records as _records
from . import engine as _engine
from . import iterators as _iterators
from . import kept_styles as _kept
from .functions import DECORATED_CODE, decorate
from .kept_styles import NO_SPAN, Span
from .records import Extra, kind_id
from .state import STATE

# DECORATED_CODE and ITERATED: what automatic tracing reads of the tree.
__all__ = ["Node", "Use", "Span", "AITree", "GATE", "CATEGORIES", "DECORATED_CODE", "ITERATED", "ai",
           "set_off_for_good"]

F = TypeVar("F", bound=Callable[..., Any])

#: The categories and their children, exactly as DFTracer's AI/DL logging names them.
CATEGORIES: dict[str, tuple[str, ...]] = {
    fmt.CAT_COMPUTE: ("forward", "backward", "step"),
    fmt.CAT_DATA: ("preprocess", "item"),
    fmt.CAT_DATALOADER: ("fetch",),
    fmt.CAT_COMM: ("send", "receive", "barrier", "bcast", "reduce", "all_reduce", "gather",
             "all_gather", "scatter", "reduce_scatter", "all_to_all"),
    fmt.CAT_DEVICE: ("transfer",),
    fmt.CAT_CHECKPOINT: ("capture", "restart"),
    fmt.CAT_PIPELINE: ("epoch", "train", "evaluate", "test"),
}


class _Gate:
    """Whether anything records at all (tracing initialised or an in-memory trace
    running)."""

    __slots__ = ("_on",)

    def __init__(self) -> None:
        self._on = False


GATE = _Gate()

#: Trees not under ``ai`` (``dft_fn`` events, user-made roots), so switches reach them.
_roots: weakref.WeakSet[Node] = weakref.WeakSet()

# Set when configuration switches tracing off for good (DFTRACE_ENABLE=0 at import):
# decorators then return the function itself and .iter() its argument.
_off_for_good = False
_max_arg_length = 1024


def set_off_for_good(value: bool) -> None:
    global _off_for_good
    _off_for_good = bool(value)
    _tell_engine()


def set_max_arg_length(n: int) -> None:
    global _max_arg_length
    _max_arg_length = n
    _records.max_arg_length = n
    _tell_engine()


def _tell_engine() -> None:
    if _engine.speedups is not None:
        _engine.speedups.set_options(_max_arg_length, _off_for_good)


# Sample mode (``dftrace.trace_in_memory(max_items=N)``): every ``.iter()`` called while it is
# set yields at most this many items. Checked once per ``.iter()`` call, never per item.
_max_items: int | None = None


def set_max_items(n: int | None) -> None:
    global _max_items
    _max_items = n


#: The iterables given to ``.iter()``: automatic tracing leaves their iteration to it.
ITERATED: weakref.WeakSet[Any] = weakref.WeakSet()


# With the C engine, the nodes' ``__call__``, ``__enter__``/``__exit__`` and
# ``start``/``stop`` come from its base class.
_CMBase: type = _engine.speedups.TraceableBase if _engine.speedups is not None else object


class _Traceable(_CMBase):  # type: ignore[misc,valid-type]
    """What nodes and uses share: decorator, context manager, iterator, hooks."""

    # No __dict__ here: a use (made per ``with node(args=...)``) is its slots only;
    # nodes have one (they are subclassed without __slots__).
    __slots__ = ()

    _node: Node
    _extra: Extra | None
    #: What a capturing use records (its ``CaptureOptions``); None everywhere else.
    _capture: Any = None

    def _gate(self) -> Any:
        raise NotImplementedError

    # decorator / options ------------------------------------------------
    def _call_py(self, fn: Any = None, /, **options: Any) -> Any:
        if fn is not None and not isinstance(fn, dict):
            if not options:
                return self.decorate(fn)
            # ``node(fn, args=...)``: fn decorated by the use those options make.
            return self._call_py(**options).decorate(fn)
        if _off_for_good:
            return OFF_USE
        if isinstance(fn, dict):
            options.setdefault("args", fn)
        if len(options) == 1 and isinstance(self, Node) and "args" in options:
            return Use.with_args(self._node, options["args"])  # the common case, fast
        return Use(self._node, **self._merge_options(options))

    if _CMBase is object:
        __call__ = _call_py

    def _merge_options(self, options: dict[str, Any]) -> dict[str, Any]:
        return options

    def decorate(self, fn: F) -> F:
        """Return ``fn`` wrapped so every call records a span (or ``fn`` itself when
        tracing is off by configuration, or this use is forced off)."""
        gate = self._gate()
        if _off_for_good or gate is None:
            return fn
        return decorate(self, fn, gate)

    # context manager: the C base class's methods, else the recorder's functions --------
    if _CMBase is object:
        __enter__ = _kept.cm_enter
        __exit__ = _kept.cm_exit

    async def __aenter__(self) -> Any:
        return _kept.cm_enter(self)

    async def __aexit__(self, et: Any, ev: Any, tb: Any) -> bool:
        return _kept.cm_exit(self, et, ev, tb)

    # iterators ------------------------------------------------------------
    def iter(self, iterable: Iterable[Any]) -> Any:
        """Wrap an iterable: per item a ``<name>.iter`` span (obtaining it) and a
        ``<name>.block`` span (the loop body), both with ``args.count``. When tracing
        is off, the iterable's own iterator (an iterator either way: a second loop over
        the result is empty whether tracing is on or off)."""
        if _max_items is not None:
            iterable = itertools.islice(iterable, _max_items)
        gate = self._gate()
        if _off_for_good or gate is None or not gate._on:
            return iter(iterable)
        try:
            ITERATED.add(iterable)
        except TypeError:  # no weak references to it
            pass
        return _iterators.iterate(self, gate, iterable)

    def aiter(self, aiterable: Any) -> Any:
        """``async for`` version of :meth:`iter`."""
        if _max_items is not None:
            aiterable = _iterators.aislice(aiterable, _max_items)
        gate = self._gate()
        if _off_for_good or gate is None or not gate._on:
            return aiter(aiterable)
        return _iterators.aiterate(self, gate, aiterable)

    # hooks ------------------------------------------------------------------
    def _start_py(self, metadata: bool = False) -> Span:
        """Open a span closed by a later :meth:`stop` (hook style). With
        ``metadata=True`` write a ``CM`` event ``<name>.start`` with the time instead."""
        try:
            if not self._on:
                return NO_SPAN
            if metadata:
                _kept.record_cm(self._node.name + ".start")
                return NO_SPAN
            token = _kept.start(self)
            return NO_SPAN if token is None else Span(self, token)
        except Exception:
            return NO_SPAN

    def _stop_py(self, span: Span | None = None, metadata: bool = False) -> None:
        """Close the span from :meth:`start` (the innermost open one of this node on
        the caller's thread/task, or ``span``). A stop with nothing open warns once."""
        try:
            if metadata:
                if self._on:
                    _kept.record_cm(self._node.name + ".end")
                return
            if span is not None:
                span.stop()
                return
            if not _kept.stop(self) and self._on:
                STATE.warn_once(
                    "stop:" + self._node.path,
                    f"{self._node.path}.stop() without a matching start(); ignored")
        except Exception:
            pass

    # start()/stop(): the C base class's methods (which call the two above for
    # anything but the common case), else the Python ones.
    if _CMBase is object:
        start = _start_py
        stop = _stop_py

    # spans known after the fact -----------------------------------------------
    def _record_py(self, t0: int, t1: int, args: dict[str, Any] | None = None) -> None:
        """Record a span of this event that already happened, from ``t0`` to ``t1``.

        The times are ints on dftrace's clock, ``time.perf_counter_ns()`` nanoseconds
        (read it before and after the work, or convert another clock's times to it).
        The span nests inside the caller's innermost open span (its times should lie
        inside that span's), carries the sticky args in force now (those of
        :meth:`update`), then this use's own args, then ``args`` (encoded now: later
        changes to the dict are not written). Nothing is recorded while this node does
        not record; times that are not ints, or ``t1 < t0``, record nothing and warn
        once per node."""
        if not self._on:
            return
        try:
            node = self._node
            if (type(t0) is not int or type(t1) is not int) and not _int_times(t0, t1):
                STATE.warn_once("record-times:" + node.path,
                                f"{node.path}.record(t0, t1): times must be ints "
                                f"(time.perf_counter_ns()); got {type(t0).__name__} and "
                                f"{type(t1).__name__}; nothing recorded")
                return
            if not _MIN_NS <= t0 <= t1 <= _MAX_NS:
                STATE.warn_once("record-order:" + node.path,
                                f"{node.path}.record(t0, t1): needs t0 <= t1, both 64-bit "
                                f"nanoseconds (got t0={t0}, t1={t1}); nothing recorded")
                return
            extra = self._extra
            if args:
                extra = Extra.joined(extra, _engine.to_extra(args))
            _engine.record_finished(node._kid, int(t0), int(t1), extra, _engine.sticky_of(node))
        except Exception:
            pass

    # record(): the C base class's method (which calls the one above for all but the
    # common case), else the Python one.
    if _CMBase is object:
        record = _record_py


#: The range of times a record holds (64-bit signed nanoseconds).
_MIN_NS = -(1 << 63)
_MAX_NS = (1 << 63) - 1


def _int_times(t0: Any, t1: Any) -> bool:
    """True for int subclasses (not bools): ``record`` takes them as ints."""
    return all(isinstance(t, int) and not isinstance(t, bool) for t in (t0, t1))


class Node(_Traceable):
    """One event of the tree, e.g. ``ai.compute.forward``."""

    #: Suffix of the span covering the loop body in ``.iter()``.
    BLOCK_SUFFIX = ".block"

    def __init__(self, name: str, cat: str, parent: Node | None = None, path: str | None = None):
        self.name = name
        self.cat = cat
        self.path = path or name
        self._parent = parent
        self._children: dict[str, Node] = {}
        self._own: Extra | None = None  # this node's sticky args (``update``)
        self._pending: dict[str, Any] = {}  # updates made while nothing records
        self._sticky: Extra | None = None  # its ancestors' and its own, at _sgen
        self._sgen = 0
        self._enabled = True
        self._on = False
        self._node = self
        self._extra = None
        self._kid = kind_id(name, cat)
        self._ikid = kind_id(name + ".iter", cat)
        self._bkid = kind_id(name + self.BLOCK_SUFFIX, cat)
        if parent is None:
            _roots.add(self)
            self._refresh()

    def __repr__(self) -> str:
        return f"<dftrace node {self.path} name={self.name!r} cat={self.cat!r}>"

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._children))

    def _gate(self) -> Any:
        return self

    # tree -------------------------------------------------------------------
    def _add(self, key: str, child: Node) -> Node:
        self._children[key] = child
        if key.isidentifier() and not hasattr(type(self), key):
            self.__dict__[key] = child
        child._refresh()
        return child

    def _walk(self) -> Iterable[Node]:
        yield self
        for c in list(self._children.values()):
            yield from c._walk()

    def _args(self) -> dict[str, Any]:
        """The sticky args this node's next span carries."""
        s = _engine.sticky_of(self)
        return dict(s.args) if s is not None else {}

    def _enabled_path(self) -> bool:
        n: Node | None = self
        while n is not None:
            if not n._enabled:
                return False
            n = n._parent
        return True

    def _refresh(self) -> None:
        for n in self._walk():
            n._on = GATE._on and n._enabled_path()

    def derive(self, name: str, args: dict[str, Any] | None = None) -> Node:
        """A child event named ``<this name>.<name>`` in the same category that
        inherits this node's args, switches and updates."""
        if not isinstance(name, str) or not name:
            raise TypeError("derive(name=...) needs a non-empty string name")
        key = name
        child = self._children.get(key)
        if child is None:
            child = self._add(key, Node(f"{self.name}.{name}", self.cat, self, f"{self.path}.{name}"))
        if args:
            child.update(**args)
        return child

    @property
    def init(self) -> Node:
        """The ``<name>.init`` event, for constructors (``@ai.data.item.init``)."""
        return self.derive("init")

    # switches and args --------------------------------------------------------
    def enable(self) -> None:
        """Record this node and its subtree again (unless an ancestor is disabled)."""
        self._enabled = True
        self._refresh()

    def disable(self) -> None:
        """Stop recording this node and its subtree (uses forced on still record)."""
        self._enabled = False
        self._refresh()

    @property
    def enabled(self) -> bool:
        """True when this node would record now."""
        return self._on

    def _update_py(self, args: dict[str, Any] | None = None, /, **kwargs: Any) -> None:
        """Set sticky args on the spans of this node and its whole subtree that start
        from now on (spans already open keep the values they started with). O(1):
        the values are encoded once here, whatever the size of the tree."""
        if _off_for_good:
            return
        try:
            if args:
                kwargs = {**args, **kwargs}
            if not self._on:  # nothing records (tracing not started, or switched off): encode later
                self._pending.update(kwargs)
            elif self._own is None and not self._pending:
                self._own = Extra(kwargs, _max_arg_length)
            else:
                self._own = Extra({**(self._own.args if self._own is not None else {}),
                                   **self._pending, **kwargs}, _max_arg_length)
                self._pending = {}
            _engine.bump_sticky()
        except Exception:
            pass

    if _CMBase is object:
        update = _update_py

    def _flush_pending(self) -> None:
        if self._pending:
            new = Extra(self._pending, _max_arg_length)
            self._pending = {}
            self._own = new if self._own is None else Extra.joined(self._own, new)

    def reset_args(self) -> None:
        """Forget args set with :meth:`update` on this node and its subtree."""
        for n in self._walk():
            n._own = None
            n._pending = {}
        _engine.bump_sticky()


_capturing_use: type | None = None


def register_capturing_use(cls: type) -> None:
    """``node(capture=...)`` makes instances of ``cls`` (``_inspect.capturing``
    registers its class when it loads, so this module never imports it)."""
    global _capturing_use
    _capturing_use = cls


class Use(_Traceable):
    """A node with options of its own: ``ai.compute.forward(args={...}, enable=True)``.

    With ``capture=`` (True, a parameter name or a list of names), ``capture_result=True``
    or ``capture_hash=True`` the use also records summaries of the values that went
    through each call (see docs/inspect.md); it is then a ``CapturingUse``.
    """

    # With the C engine these three are fields of the base class.
    __slots__ = ("_node", "_extra", "_forced") if _CMBase is object else ()

    def __new__(cls, node: Node, *args: Any, **options: Any) -> Use:
        if cls is Use and (options.get("capture") not in (None, False)
                           or options.get("capture_result") or options.get("capture_hash")):
            if _capturing_use is None:
                raise TypeError("capture options need dftrace's inspection tools: import dftrace")
            cls = _capturing_use
        return super().__new__(cls)

    def __init__(self, node: Node, args: dict[str, Any] | None = None,
                 enable: bool | None = None, capture: Any = None,
                 capture_result: bool = False, capture_hash: bool = False, **unknown: Any):
        if unknown:
            raise TypeError(
                f"{node.path}() got unexpected option(s) {', '.join(sorted(unknown))}; "
                "options are args=..., enable=..., capture=..., capture_result=..., "
                "capture_hash=...")
        self._node = node
        self._extra = Extra(args, _max_arg_length) if args else None
        self._forced = None if enable is None else bool(enable)

    @classmethod
    def with_args(cls, node: Node, args: Any) -> Use:
        """``node(args=...)``: the args are encoded now (a snapshot), or not at all
        while the node does not record (the C engine does this in ``__call__``)."""
        if not node._on and _CMBase is object:
            return _LazyUse(node, args)
        u = _Traceable.__new__(cls)
        u._node = node
        u._extra = Extra(args, _max_arg_length) if args else None
        u._forced = None
        return u

    def _gate(self) -> Any:
        if self._forced is None:
            return self._node
        return GATE if self._forced else None

    def _merge_options(self, options: dict[str, Any]) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        if self._extra is not None:
            merged["args"] = dict(self._extra.args)
        if self._forced is not None:
            merged["enable"] = self._forced
        if "args" in options and options["args"]:
            merged["args"] = {**merged.get("args", {}), **options.pop("args")}
        merged.update(options)
        return merged

    @property
    def _on(self) -> bool:
        g = self._gate()
        return bool(g is not None and g._on)

    def update(self, args: dict[str, Any] | None = None, /, **kwargs: Any) -> None:
        """Updates go to the node (and so reach every use of it)."""
        self._node.update(args, **kwargs)

    def __repr__(self) -> str:
        extra = self._extra.args if self._extra else {}
        return f"<dftrace use of {self._node.path} args={extra!r} enable={self._forced!r}>"


class _LazyUse(Use):
    """A use made while its node did not record: its args are encoded only if it is
    used after recording started (pure-Python engine; the C engine's uses do this
    themselves)."""

    __slots__ = ("_raw", "_encoded")

    def __new__(cls, node: Node, args: Any) -> _LazyUse:
        return _Traceable.__new__(cls)

    def __init__(self, node: Node, args: Any):
        self._node = node
        self._forced = None
        self._raw = args
        self._encoded: Any = _LazyUse

    @property  # type: ignore[override]
    def _extra(self) -> Extra | None:
        x = self._encoded
        if x is _LazyUse:
            x = self._encoded = Extra(self._raw, _max_arg_length) if self._raw else None
            self._raw = None
        return x


class _OffUse(Use):
    """What ``node(...)`` returns when tracing is off by configuration: a decorator
    that returns the function, a ``with`` that does nothing, ``.iter(x)`` that
    returns ``x``."""

    __slots__ = ()
    _on = False

    def __init__(self) -> None:
        self._node = ai
        self._extra = None
        self._forced = False

    def __call__(self, fn: Any = None, /, **options: Any) -> Any:
        return fn if fn is not None and not isinstance(fn, dict) else self

    def update(self, args: dict[str, Any] | None = None, /, **kwargs: Any) -> None:
        pass


class AITree(Node):
    """The root ``ai``: categories as attributes; ``update``/``enable``/``disable``
    act on the whole tree."""

    def __init__(self) -> None:
        super().__init__("ai", "ai", None, "ai")
        for cat, children in CATEGORIES.items():
            c = self._add(cat, Node(cat, cat, self, f"ai.{cat}"))
            for child in children:
                c._add(child, Node(child, cat, c, f"ai.{cat}.{child}"))

    def __getitem__(self, key: str) -> Node:
        return self._children[key]

    def nodes(self) -> list[Node]:
        """Every node of the tree, derived ones included."""
        return list(self._walk())


ai = AITree()
OFF_USE = _Traceable.__new__(_OffUse)
OFF_USE.__init__()


def refresh_all() -> None:
    """Recompute every node's switch after the gate changed."""
    for root in list(_roots):
        root._refresh()


if _engine.speedups is not None:
    _engine.speedups.register(state=_engine.STATE, span_type=Span, no_span=NO_SPAN,
                              start_slow=_Traceable._start_py, stop_slow=_Traceable._stop_py,
                              use_type=Use, call_slow=_Traceable._call_py,
                              span_stop_slow=Span._stop_py, gate=GATE, update_slow=Node._update_py,
                              record_slow=_Traceable._record_py,
                              off_use=OFF_USE)


def _reset() -> None:
    set_off_for_good(False)
    set_max_arg_length(1024)
    for root in list(_roots):
        for n in root._walk():
            n._enabled = True
        root.reset_args()


STATE.on_reset(_reset)
