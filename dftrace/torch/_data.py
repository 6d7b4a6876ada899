"""DataLoader tracing for ``dftrace.torch``: batches fetched in the main process,
items and collation in the worker processes.

A DataLoader's workers get the dataset and the collate function, not the loader, so
those two are wrapped: :class:`TracedDataset` records ``data.item`` around each
``__getitem__`` and :class:`TracedCollate` records ``data.preprocess.collate``. Both
pickle, so they reach ``spawn`` and ``forkserver`` workers, where they start tracing
on the first item if the worker is not tracing yet (forked workers already are, via
the core's fork hook). The main process iterates through :class:`TracedDataLoader`,
which writes ``fetch.iter`` / ``fetch.block`` per batch and ``fetch.init`` for
starting the iterator (worker start-up).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset

from .._core import lifecycle as _lifecycle
from .._core.config import env_disabled
from .._core.tree import ai
from .._hooks import call_in_span, warn_once

__all__ = ["TracedDataLoader", "TracedDataset", "TracedIterableDataset", "TracedCollate",
           "trace_dataloader", "trace_dataset", "trace_collate"]

_ITEM = ai.data.item
_COLLATE = ai.data.preprocess.derive("collate")
_FETCH = ai.dataloader.fetch
_FETCH_INIT = ai.dataloader.fetch.init

# What ``next`` returns for an exhausted iterator in ``TracedIterableDataset``.
_EXHAUSTED: Any = object()


def _exhausted_args(item: Any) -> dict[str, Any] | None:
    return {"exhausted": True} if item is _EXHAUSTED else None


# Set once a worker tried to start tracing, so a failure is not retried per item.
_worker_start_tried = False


def _child_options() -> dict[str, Any] | None:
    """The running session's settings, for a worker started by pickling (spawn).
    None when not tracing, or when they cannot be read: pickling must not fail."""
    try:
        s = _lifecycle.session()
        if s is None:
            return None
        opts = dict(s.config.as_dict())
        opts["log_file"] = s.config.absolute_log_file()
        opts["enable"] = True
        opts["process_name"] = None
        return opts
    except Exception as exc:
        warn_once("worker-options", f"spawned DataLoader workers will not trace: {exc!r}")
        return None


def _start_in_worker(options: dict[str, Any]) -> None:
    """In a DataLoader worker that was started by pickling and is not tracing yet,
    trace with the parent's settings (the environment may not carry them)."""
    global _worker_start_tried
    if _worker_start_tried:
        return
    _worker_start_tried = True
    try:
        from torch.utils.data import get_worker_info

        if get_worker_info() is None or env_disabled():
            return
        _lifecycle.initialize(**options)
    except Exception as exc:
        warn_once("worker-start", f"tracing could not start in a DataLoader worker: {exc!r}")


class _Wrapper:
    """Attribute access falls through to the wrapped object, so code that reads
    ``loader.dataset.classes`` still works."""

    _dftrace_inner: Any
    _dftrace_options: dict[str, Any] | None

    def __init__(self, dataset: Any):
        self._dftrace_inner = dataset
        self._dftrace_options = None

    @property
    def dataset(self) -> Any:
        """The wrapped dataset."""
        return self._dftrace_inner

    def __getattr__(self, name: str) -> Any:
        # Unpickling looks up attributes before __dict__ is filled: never recurse.
        if name.startswith("_dftrace") or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return getattr(self._dftrace_inner, name)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_dftrace_options"] = _child_options()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __len__(self) -> int:
        return len(self._dftrace_inner)


class TracedDataset(_Wrapper, Dataset):
    """A map-style dataset whose ``__getitem__`` records a ``data.item`` span with
    ``args.index``. Use :func:`trace_dataset` to make one."""

    def __getitem__(self, index: Any) -> Any:
        if self._dftrace_options is not None and _lifecycle.session() is None:
            _start_in_worker(self._dftrace_options)
        return call_in_span(_ITEM, self._dftrace_inner.__getitem__, (index,),
                            args={"index": index} if type(index) is int else None)

    def __repr__(self) -> str:
        return f"TracedDataset({self._dftrace_inner!r})"


class TracedBatchedDataset(TracedDataset):
    """A :class:`TracedDataset` for datasets that fetch a batch at once through
    ``__getitems__``: one ``data.item`` span per call with ``args.count``."""

    def __getitems__(self, indices: list[Any]) -> Any:
        if self._dftrace_options is not None and _lifecycle.session() is None:
            _start_in_worker(self._dftrace_options)
        return call_in_span(_ITEM, self._dftrace_inner.__getitems__, (indices,),
                            args={"count": len(indices)})


class TracedIterableDataset(_Wrapper, IterableDataset):
    """An iterable dataset whose items are ``data.item`` spans (producing one) with
    ``args.count``. The call that finds the data exhausted is one more span, flagged
    ``args.exhausted`` (its time is real; it is not an item)."""

    def __iter__(self) -> Iterator[Any]:
        if self._dftrace_options is not None and _lifecycle.session() is None:
            _start_in_worker(self._dftrace_options)
        return self._items(iter(self._dftrace_inner))

    @staticmethod
    def _items(it: Iterator[Any]) -> Iterator[Any]:
        # Only the production of each item is a span: the consumer (the fetcher)
        # keeps items across batches, so "holding" one has no meaningful extent.
        count = 0
        while True:
            item = call_in_span(_ITEM, next, (it, _EXHAUSTED), args={"count": count + 1},
                                after=_exhausted_args)
            if item is _EXHAUSTED:
                return
            count += 1
            yield item

    def __repr__(self) -> str:
        return f"TracedIterableDataset({self._dftrace_inner!r})"


class TracedCollate:
    """A collate function recorded as ``data.preprocess.collate`` with
    ``args.items`` (the batch size). Pickles with the function it wraps."""

    def __init__(self, fn: Any):
        self.fn = fn

    def __call__(self, batch: Any) -> Any:
        if not _COLLATE.enabled:
            return self.fn(batch)
        try:
            args = {"items": len(batch)}
        except Exception:
            args = None
        return call_in_span(_COLLATE, self.fn, (batch,), args=args)

    def __repr__(self) -> str:
        return f"TracedCollate({self.fn!r})"


def trace_dataset(dataset: Any) -> Any:
    """Wrap a dataset so each item it produces is a ``data.item`` span, in whatever
    process loads it (DataLoader workers included). Already wrapped: returned as is."""
    if isinstance(dataset, (TracedDataset, TracedIterableDataset)):
        return dataset
    if isinstance(dataset, IterableDataset):
        return TracedIterableDataset(dataset)
    if callable(getattr(dataset, "__getitems__", None)):
        return TracedBatchedDataset(dataset)
    return TracedDataset(dataset)


def trace_collate(fn: Any) -> TracedCollate:
    """Wrap a collate function so each call is a ``data.preprocess.collate`` span."""
    if isinstance(fn, TracedCollate):
        return fn
    return TracedCollate(fn)


class TracedDataLoader:
    """Iterates a DataLoader (or any iterable) with ``dataloader.fetch`` spans; every
    other attribute is the loader's. Made by :func:`trace_dataloader`."""

    def __init__(self, loader: Any):
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        if not _FETCH.enabled:
            return iter(self.loader)
        # Creating the iterator starts the workers (seconds under spawn): its own span.
        with _FETCH_INIT:
            it = iter(self.loader)
        return _FETCH.iter(it)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name == "loader" or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __repr__(self) -> str:
        return f"TracedDataLoader({self.loader!r})"


def trace_dataloader(loader: Any, *, items: bool = True, collate: bool = True) -> TracedDataLoader:
    """Trace a ``torch.utils.data.DataLoader`` with one call; iterate what it returns.

    The main process writes ``fetch.init`` (creating the iterator: worker start-up),
    then per batch ``fetch.iter`` (waiting for it) and ``fetch.block`` (your loop
    body), both with ``args.count``. With ``items`` each worker (or the main process
    when ``num_workers=0``) writes ``data.item`` per ``__getitem__``; with
    ``collate``, ``preprocess.collate`` per batch. Works with ``num_workers>0`` under
    fork, spawn and forkserver. Call it before the loader's first iteration (a
    ``persistent_workers`` loader keeps the dataset its workers started with).

    The loader is changed in place: its ``dataset`` and ``collate_fn`` become traced
    wrappers (attribute access still reaches the originals).
    """
    if isinstance(loader, TracedDataLoader):
        return loader
    if isinstance(loader, DataLoader):
        if getattr(loader, "_iterator", None) is not None:
            warn_once("dataloader-started",
                      "trace_dataloader(): this loader's persistent workers already run; "
                      "their items are not traced")
        if items:
            # DataLoader forbids setting ``dataset`` after __init__; the workers read it
            # from the loader when an iterator is created, so swapping it is safe.
            object.__setattr__(loader, "dataset", trace_dataset(loader.dataset))
        if collate and loader.collate_fn is not None:
            loader.collate_fn = trace_collate(loader.collate_fn)
    return TracedDataLoader(loader)
