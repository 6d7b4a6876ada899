"""``torch.distributed`` tracing for ``dftrace.torch``: a ``comm.*`` span per call.

The functions of the ``torch.distributed`` namespace (what ``dist.all_reduce``
resolves to at call time) are replaced by wrappers while a
:class:`DistributedTracing` is active. Each call writes a span named after the
tree's comm leaf with ``args.bytes`` (the payload this rank contributes), ``op``,
``group_size``, ``async``, ``src``/``dst`` where the call has them, and what matches
the same call across ranks: ``group`` (the process group's name) and ``seq`` (the
call's number among this process's traced calls on that group, from 1).

DDP waits for its buckets at the end of ``backward``; ``trace_ddp`` writes that
wait as ``comm.all_reduce.wait`` inside the ``backward`` span (from the last
bucket's launch to the end of the wait), so it counts as communication.

A call made while another traced call is running on the same thread (DDP's comm
hook calling ``dist.all_reduce``, ``all_gather_object`` calling ``all_gather``) is
part of that call and writes nothing of its own: each call is one span. Work that
completes after the call returns (``async_op=True``, DDP buckets) also writes a
``<leaf>.done`` span from the call to its completion, on a separate "comm in
flight" track, with the same ``group`` and ``seq``.

Around an asynchronous backend (NCCL, or any call with ``async_op=True``) the span
measures the launch, not the transfer: the call returns once the work is queued.
``synchronize=True`` waits for the current CUDA stream before closing the span of a
synchronous CUDA collective, which gives the transfer time at the cost of a sync.

A DDP model made later (by a trainer, or by a program traced with ``auto=True``) gets
``trace_ddp`` at its first forward: :func:`watch_ddp`, :func:`trace_ddp_of`.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import threading
import weakref
from typing import Any, Callable

import torch
import torch.distributed as dist

from .._core import engine as _engine
from .. import format as fmt
from .._core.tree import Node, ai
from .._hooks import call_in_span, warn_once
from ._in_flight import in_flight_tracks, record_completion

__all__ = ["DistributedTracing", "trace_distributed", "trace_ddp", "COLLECTIVES"]

#: function name -> (comm leaf, payload parameter, other recorded parameters, always async)
COLLECTIVES: dict[str, tuple[str, str | None, tuple[str, ...], bool]] = {
    "all_reduce": ("all_reduce", "tensor", ("op",), False),
    "all_reduce_coalesced": ("all_reduce", "tensors", ("op",), False),
    "broadcast": ("bcast", "tensor", ("src",), False),
    "broadcast_object_list": ("bcast", None, ("src",), False),
    "reduce": ("reduce", "tensor", ("op", "dst"), False),
    "all_gather": ("all_gather", "tensor", (), False),
    "all_gather_into_tensor": ("all_gather", "input_tensor", (), False),
    "all_gather_object": ("all_gather", None, (), False),
    "gather": ("gather", "tensor", ("dst",), False),
    "gather_object": ("gather", None, ("dst",), False),
    "scatter": ("scatter", "tensor", ("src",), False),
    "scatter_object_list": ("scatter", None, ("src",), False),
    "reduce_scatter": ("reduce_scatter", "input_list", ("op",), False),
    "reduce_scatter_tensor": ("reduce_scatter", "input", ("op",), False),
    "all_to_all": ("all_to_all", "input_tensor_list", (), False),
    "all_to_all_single": ("all_to_all", "input", (), False),
    "barrier": ("barrier", None, (), False),
    "monitored_barrier": ("barrier", None, (), False),
    "send": ("send", "tensor", ("dst",), False),
    "isend": ("send", "tensor", ("dst",), True),
    "send_object_list": ("send", None, ("dst",), False),
    "recv": ("receive", "tensor", ("src",), False),
    "irecv": ("receive", "tensor", ("src",), True),
    "recv_object_list": ("receive", None, ("src",), False),
}


def nbytes(x: Any) -> int:
    """Bytes of a tensor, or of the tensors in a list/tuple (0 for anything else)."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(nbytes(t) for t in x if isinstance(t, torch.Tensor))
    return 0


def _op_name(op: Any) -> str:
    name = getattr(op, "name", None)
    if isinstance(name, str):
        return name
    return str(op).rsplit(".", 1)[-1]


def _cuda_device(x: Any) -> Any:
    """The CUDA device of the (first) tensor in ``x``, or None."""
    if isinstance(x, torch.Tensor):
        return x.device if x.is_cuda else None
    if isinstance(x, (list, tuple)):
        for t in x:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                return t.device
    return None


#: p2p calls whose sequence numbers count per (sender, receiver) pair.
_P2P = frozenset({"send", "receive"})

_local = threading.local()
_seqs: dict[Any, Any] = {}


def _inside() -> bool:
    """True while a traced collective runs on this thread."""
    return getattr(_local, "depth", 0) > 0


def _enter() -> None:
    _local.depth = getattr(_local, "depth", 0) + 1


def _leave() -> None:
    _local.depth -= 1


def group_name(group: Any) -> str:
    """The name of a process group (``None``: the default group)."""
    pg = group if group is not None else dist.group.WORLD
    name = getattr(pg, "group_name", None)
    return str(name) if name is not None else "0"


def next_seq(key: Any) -> int:
    """The next sequence number of ``key`` (a group name, or a p2p pair), from 1."""
    counter = _seqs.get(key)
    if counter is None:
        counter = _seqs.setdefault(key, itertools.count(1))
    return next(counter)


def matching_args(leaf: str, group: Any, out: dict[str, Any]) -> None:
    """Add ``group`` and ``seq`` (what matches this call across ranks) to ``out``."""
    name = group_name(group)
    out["group"] = name
    if leaf in _P2P:
        try:
            me = dist.get_rank()  # src/dst are global ranks too
        except Exception:
            return
        peer = out.get("dst" if leaf == "send" else "src")
        if peer is None:
            return  # a receive from any source: nothing to match it with
        pair = (me, peer) if leaf == "send" else (peer, me)
        out["seq"] = next_seq((name, "p2p", *pair))
    else:
        out["seq"] = next_seq(name)


def _wrap(fn: Callable[..., Any], leaf: str, payload: str | None, params: tuple[str, ...],
          always_async: bool) -> Callable[..., Any]:
    node = getattr(ai.comm, leaf)
    sig = inspect.signature(fn)

    def call_args(a: tuple, kw: dict) -> tuple[dict[str, Any], Any]:
        bound = sig.bind(*a, **kw).arguments
        out: dict[str, Any] = {}
        data = bound.get(payload) if payload else None
        if payload:
            out["bytes"] = nbytes(data)
        for p in params:
            v = bound.get(p)
            if v is None and p in ("src", "dst"):
                v = bound.get("group_" + p)
            if v is not None:
                out[p] = _op_name(v) if p == "op" else v
        if "op" in params and "op" not in out:
            out["op"] = "SUM"  # the default of every reducing collective
        group = bound.get("group")
        try:
            out["group_size"] = dist.get_world_size(group)
        except Exception:
            pass
        out["async"] = bool(always_async or bound.get("async_op", False))
        matching_args(leaf, group, out)
        return out, data

    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        if not node.enabled or _inside():
            return fn(*a, **kw)
        try:
            args, data = call_args(a, kw)
        except Exception:
            args, data = {}, None  # a bad call: let torch raise its own error below
        def call() -> Any:
            result = fn(*a, **kw)
            if _synchronize and not args.get("async"):
                device = _cuda_device(data)
                if device is not None:
                    torch.cuda.current_stream(device).synchronize()
            return result

        t0 = _engine.clock()
        result = call_in_span(node, _alone, (call,), args=args)  # a collective it makes is part of it
        if args.get("async") and result is not None:
            try:
                record_completion(node, result.get_future(), t0, args)
            except Exception:
                pass  # no future for this work (gloo point-to-point)
        return result

    wrapper.__dftrace_wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


_lock = threading.Lock()
_active: list[DistributedTracing] = []
_originals: dict[str, Callable[..., Any]] = {}
_synchronize = False  # any active tracing asked for synchronize=True


def _alone(fn: Callable[..., Any], *a: Any) -> Any:
    """``fn(*a)`` with the collectives it makes part of the caller's span, not spans of
    their own."""
    _enter()
    try:
        return fn(*a)
    finally:
        _leave()


def _update_synchronize() -> None:
    global _synchronize
    _synchronize = any(t.synchronize for t in _active)


class DistributedTracing:
    """What :func:`trace_distributed` returns: a context manager; :meth:`remove`
    puts the original ``torch.distributed`` functions back (once no other tracing
    of them is active)."""

    def __init__(self, synchronize: bool = False):
        self.synchronize = bool(synchronize)
        self.functions: list[str] = []
        self._removed = False
        with _lock:
            if not _active:
                _seqs.clear()  # every rank starts numbering here: the same calls get the same numbers
                for name, (leaf, payload, params, always_async) in COLLECTIVES.items():
                    fn = getattr(dist, name, None)
                    if fn is None or not callable(fn):
                        continue
                    _originals[name] = fn
                    setattr(dist, name, _wrap(fn, leaf, payload, params, always_async))
            _active.append(self)
            _update_synchronize()
            self.functions = sorted(_originals)

    def remove(self) -> None:
        """Stop tracing ``torch.distributed`` calls (idempotent)."""
        with _lock:
            if self._removed:
                return
            self._removed = True
            if self in _active:
                _active.remove(self)
            _update_synchronize()
            if _active:
                return
            for name, fn in _originals.items():
                current = getattr(dist, name, None)
                if getattr(current, "__dftrace_wrapped__", None) is fn:
                    setattr(dist, name, fn)
                else:  # someone wrapped it after us: leave theirs in place
                    warn_once("dist-restore:" + name,
                              f"torch.distributed.{name} was replaced after trace_distributed(); "
                              "left as it is")
            _originals.clear()
            in_flight_tracks.clear()

    def __enter__(self) -> DistributedTracing:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def trace_distributed(*, synchronize: bool = False) -> DistributedTracing:
    """Record a ``comm.*`` span for each ``torch.distributed`` collective and
    point-to-point call made through the ``torch.distributed`` namespace
    (``dist.all_reduce(...)``), until ``remove()`` or the end of the ``with`` block.

    Args are ``bytes`` (this rank's payload), ``op``, ``group_size``, ``async``,
    ``src``/``dst``, and ``group``/``seq``, which match the same call across ranks.
    A call made inside another traced one is part of it (one span per call);
    asynchronous work also writes ``<leaf>.done`` up to its completion. With ``async_op=True`` (and always on NCCL) the span is the
    launch; ``synchronize=True`` makes synchronous CUDA calls wait for the stream
    before the span closes. Names imported before the call
    (``from torch.distributed import all_reduce``) are not replaced.
    """
    return DistributedTracing(synchronize=synchronize)


class _BackwardWait:
    """Writes ``comm.all_reduce.wait`` for the time DDP's backward spends waiting
    for its gradient buckets: from the last bucket's launch to the end of DDP's
    own end-of-backward callback (which waits for them)."""

    def __init__(self, node: Node):
        self.node = node.derive(fmt.WAIT_SUFFIX[1:])
        # One backward of one model at a time: its buckets may be launched on an
        # autograd thread and its end-of-backward callbacks run on another.
        self.pending = False
        self.last = 0

    def launched(self) -> None:
        """A bucket was launched (call at the end of the hook)."""
        first = not self.pending
        self.last = _engine.clock()
        if first:
            self.pending = True
            try:
                # Queued now, before DDP queues its own callback at the last bucket;
                # ours queues the recording behind DDP's, which waits for the buckets.
                autograd = _autograd_engine()
                autograd.queue_callback(lambda: autograd.queue_callback(self._record))
            except Exception:
                self.pending = False

    def _record(self) -> None:
        self.pending = False
        self.node.record(self.last, _engine.clock())


def _autograd_engine() -> Any:
    return torch.autograd.Variable._execution_engine


def note_distributed_rank(rank: int | None = None) -> None:
    """Write this process's global rank to the trace: ``rank``, or torch.distributed's
    once a process group exists (launchers that set no ``RANK``, such as
    Lightning's, leave it unknown until then). Nothing without a tracing session."""
    from .._core.lifecycle import session

    s = session()
    if s is None:
        return
    source = "trainer"
    if rank is None:
        try:
            if not (dist.is_available() and dist.is_initialized()):
                return
            rank, source = int(dist.get_rank()), "torch.distributed"
        except Exception:
            return
    s.set_rank(rank, source)


def trace_ddp(ddp_model: Any, hook: Callable[..., Any] | None = None, state: Any = None) -> None:
    """Register a DistributedDataParallel communication hook that records a
    ``comm.all_reduce`` span (``args.bucket``, ``bytes``, ``group``, ``seq``,
    ``group_size``, ``ddp``, ``async=true``) per gradient bucket it launches, and
    a ``comm.all_reduce.done`` span from the launch to the bucket's completion.
    The time backward then waits for the buckets is a ``comm.all_reduce.wait``
    span, and DDP's broadcast of the module's buffers before each forward a
    ``comm.bcast`` span (``args.buffers``). ``hook``/``state`` default to DDP's own all-reduce; collectives the hook makes
    are part of the bucket's span, not spans of their own. Like any comm hook:
    call it once, before the first backward."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    note_distributed_rank()
    inner = hook if hook is not None else default_hooks.allreduce_hook
    node = ai.comm.all_reduce
    waits = _BackwardWait(node)

    # No annotations: DDP rejects a hook whose annotations are not the real
    # GradBucket/Future types (strings, under postponed evaluation, are not).
    def traced_hook(st, bucket):  # type: ignore[no-untyped-def]
        if not node.enabled or _inside():
            return inner(st, bucket)
        args: dict[str, Any] = {"async": True, "ddp": True}
        try:
            group = st if isinstance(st, dist.ProcessGroup) else None
            args["bucket"] = bucket.index()
            args["bytes"] = nbytes(bucket.buffer())
            if hook is None:
                args["op"] = "SUM"
            args["group_size"] = dist.get_world_size(group)
            matching_args("all_reduce", group, args)
        except Exception:
            pass
        t0 = _engine.clock()
        # The all_reduce DDP's hook makes is this span, not another.
        fut = call_in_span(node, _alone, (inner, st, bucket), args=args)
        record_completion(node, fut, t0, args)
        waits.launched()
        return fut

    ddp_model._dftrace_hooked = True  # its buckets are recorded: once
    ddp_model.register_comm_hook(state, traced_hook)
    _trace_buffer_sync(ddp_model)


def _trace_buffer_sync(ddp_model: Any) -> None:
    """DDP broadcasts the module's buffers from rank 0 before each forward
    (``broadcast_buffers=True``, the default, for a module with buffers): a
    collective every rank waits in for the last, recorded as ``comm.bcast`` with
    ``args.ddp`` and ``args.buffers``."""
    sync = getattr(ddp_model, "_sync_buffers", None)
    if not callable(sync):
        return
    node = ai.comm.bcast

    def traced_sync() -> Any:
        if not node.enabled or _inside():
            return sync()
        args: dict[str, Any] = {"ddp": True, "buffers": True}
        try:
            args["group_size"] = dist.get_world_size()
            matching_args("bcast", None, args)
        except Exception:
            pass
        return call_in_span(node, _alone, (sync,), args=args)

    try:
        ddp_model._sync_buffers = traced_sync
    except Exception:
        pass


# -- DistributedDataParallel models made later (auto=True, the integrations) -----------

#: Modules whose DistributedDataParallel wrapper is traced whether ``auto`` is on or
#: not: an integration's model, wrapped by its trainer after the callback saw it.
_WANTED: weakref.WeakSet[Any] = weakref.WeakSet()
_EVERY_DDP = False  # auto=True: every DistributedDataParallel model is traced


def trace_ddp_of(module: Any) -> None:
    """Record the gradient buckets of the DistributedDataParallel model that will
    wrap ``module`` (made later, by a trainer): registered at its first forward."""
    _WANTED.add(module)
    watch_ddp()


def _wanted(ddp: Any) -> bool:
    try:
        return _EVERY_DDP or ddp.module in _WANTED
    except Exception:
        return False


def watch_ddp(every: bool = False) -> None:
    """DistributedDataParallel's ``__init__`` and ``register_comm_hook``, once: a model
    wrapped while ``auto`` is on (``every``), or whose module is wanted by then, or by
    its first forward (a callback given to a trainer that had wrapped it already), gets
    :func:`trace_ddp` at its first forward, or around the communication hook you
    register before it."""
    global _EVERY_DDP
    from torch.nn.parallel import DistributedDataParallel as DDP

    _EVERY_DDP = _EVERY_DDP or every
    if getattr(DDP.__init__, "__dftrace_patched__", False):
        return
    init, register = DDP.__init__, DDP.register_comm_hook

    def __init__(self: Any, *a: Any, **kw: Any) -> None:
        init(self, *a, **kw)
        try:
            note_distributed_rank()
            handle: list[Any] = []

            def first_forward(module: Any, args: Any) -> None:
                for h in handle:
                    h.remove()
                if _wanted(self) and not getattr(self, "_dftrace_hooked", False):
                    try:
                        trace_ddp(self)
                    except Exception as exc:
                        warn_once("auto-ddp", f"DDP gradient buckets are not recorded: {exc!r}")

            handle.append(self.register_forward_pre_hook(first_forward))
        except Exception:
            pass

    def register_comm_hook(self: Any, state: Any, hook: Any) -> Any:
        if getattr(self, "_dftrace_hooked", False) or not _wanted(self):
            return register(self, state, hook)
        return trace_ddp(self, hook, state)  # your hook, traced (it registers it)

    __init__.__dftrace_patched__ = True  # type: ignore[attr-defined]
    DDP.__init__ = __init__  # type: ignore[method-assign]
    DDP.register_comm_hook = register_comm_hook  # type: ignore[method-assign]


def patch_init_process_group() -> None:
    """``init_process_group`` notes the rank once the group exists (``auto=True``)."""
    import torch.distributed as dist

    original = dist.init_process_group

    def init_process_group(*a: Any, **kw: Any) -> Any:
        out = original(*a, **kw)
        note_distributed_rank()
        return out

    dist.init_process_group = init_process_group
