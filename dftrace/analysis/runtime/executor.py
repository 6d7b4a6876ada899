"""Where the per-partition work runs: in this process, or on a Dask cluster.

Both executors run the same module-level function on each partition (``map``), or
over the partitions a thread takes one after another (``map_stream``, which lets it
start on the next partition while it finishes one), and hand the results back in
partition order, all at once or (``imap``) one after another, a few partitions
ahead, so that what is held is bounded by those few; everything after that (combining, resolving
metadata, rendering) happens in the caller's process. So there is one analysis
code path, and only where its first stage runs differs.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .deps import require
from .progress import Progress

T = TypeVar("T")
R = TypeVar("R")
#: No item left (``imap``).
_NONE = object()

class EmbeddedExecutor:
    """Runs partitions on a thread pool in this process (the default).

    polars releases the GIL while parsing and aggregating, so a few threads keep
    every core busy; ``threads`` defaults to the number of CPUs, at most 8.
    """

    def __init__(self, threads: int | None = None):
        self.threads = threads or min(os.cpu_count() or 1, 8)

    def map(self, fn: Callable[[T], R], items: Sequence[T], *, progress: bool | None = None,
            desc: str = "reading") -> list[R]:
        """Apply ``fn`` to every item and return the results in item order (each
        thread applies it to the items it takes, see :meth:`map_stream`)."""
        return self.map_stream(functools.partial(map, fn), items, progress=progress, desc=desc)

    def map_stream(self, fn: Callable[[Iterable[T]], Iterator[R]], items: Sequence[T], *,
                   progress: bool | None = None, desc: str = "reading") -> list[R]:
        """Like :meth:`map` for an ``fn`` that takes the items one after another and
        yields each one's result in turn, so that it can start on the next item
        while it finishes one: each thread runs ``fn`` over the items it takes."""
        results: list[Any] = [None] * len(items)
        bar = Progress(desc, progress, len(items))
        untaken = iter(range(len(items)))
        lock = threading.Lock()

        def run() -> None:
            taken: list[int] = []

            def take() -> Iterator[T]:
                while True:
                    with lock:
                        i = next(untaken, None)
                    if i is None:
                        return
                    taken.append(i)
                    yield items[i]

            for k, result in enumerate(fn(take())):
                results[taken[k]] = result
                with lock:
                    bar.update()

        try:
            threads = min(self.threads, len(items))
            if threads <= 1:
                run()
            else:
                with ThreadPoolExecutor(threads) as pool:
                    for future in [pool.submit(run) for _ in range(threads)]:
                        future.result()
        finally:
            bar.close()
        return results

    def imap(self, fn: Callable[[T], R], items: Sequence[T], *, progress: bool | None = None,
             desc: str = "reading") -> Iterator[R]:
        """Yield ``fn`` of each item in item order as it is done, with at most
        ``threads + 1`` items being worked on or waiting to be taken: what is held at
        once is bounded by those, whatever the number of items."""
        pool = ThreadPoolExecutor(max(1, min(self.threads, len(items))))
        workers: set[int] = set()

        def work(item: T) -> R:
            workers.add(threading.get_ident())
            return fn(item)

        try:
            yield from _in_order(lambda item: pool.submit(work, item), lambda future: future.result(), items,
                                 self.threads + 1, Progress(desc, progress, len(items)))
        finally:
            # (ended by the garbage collector in one of the pool's threads, it cannot wait
            # for itself: the others end on their own)
            pool.shutdown(wait=threading.get_ident() not in workers, cancel_futures=True)

    def close(self) -> None:
        """Nothing to release; present so both executors can be used alike."""

    def __enter__(self) -> EmbeddedExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EmbeddedExecutor(threads={self.threads})"


class DaskExecutor:
    """Runs partitions on a Dask cluster: an existing scheduler, or a local one.

    ``DaskExecutor("tcp://host:8786")`` connects to a running scheduler (workers
    must see the same file paths, e.g. on a shared file system);
    ``DaskExecutor(workers=4)`` starts a ``LocalCluster`` of four single-threaded
    worker processes on loopback and stops it on :meth:`close`.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        workers: int = 2,
        threads_per_worker: int = 1,
        processes: bool = True,
    ):
        distributed = require("distributed")
        self._cluster = None
        if address is None:
            self._cluster = distributed.LocalCluster(
                n_workers=workers,
                threads_per_worker=threads_per_worker,
                processes=processes,
                host="127.0.0.1",
                dashboard_address=None,
                silence_logs=logging.ERROR,
            )
            self.client = distributed.Client(self._cluster)
        else:
            self.client = distributed.Client(address)
        #: The scheduler's address (also of the local cluster this executor started).
        self.address: str = self.client.scheduler.address
        self._as_completed = distributed.as_completed

    def map(self, fn: Callable[[T], R], items: Sequence[T], *, progress: bool | None = None,
            desc: str = "reading") -> list[R]:
        """Apply ``fn`` to every item on the cluster and return results in item order."""
        futures = self.client.map(fn, list(items), pure=False)
        position = {f.key: i for i, f in enumerate(futures)}
        results: list[Any] = [None] * len(futures)
        bar = Progress(desc, progress, len(futures))
        try:
            for future in self._as_completed(futures):
                results[position[future.key]] = future.result()
                future.release()
                bar.update()
        finally:
            bar.close()
        return results

    def map_stream(self, fn: Callable[[Iterable[T]], Iterator[R]], items: Sequence[T], *,
                   progress: bool | None = None, desc: str = "reading") -> list[R]:
        """:meth:`map` of an ``fn`` that takes items one after another (see
        ``EmbeddedExecutor.map_stream``): a task runs it over its one item."""
        return self.map(functools.partial(_each, fn), items, progress=progress, desc=desc)

    def imap(self, fn: Callable[[T], R], items: Sequence[T], *, progress: bool | None = None,
             desc: str = "reading") -> Iterator[R]:
        """Yield ``fn`` of each item in item order as it is done (see
        ``EmbeddedExecutor.imap``), with at most twice as many items submitted at once
        as the cluster has worker threads."""

        def take(future: Any) -> R:
            result = future.result()
            future.release()
            return result

        window = max(2, 2 * sum(self.client.nthreads().values()))
        yield from _in_order(lambda item: self.client.submit(fn, item, pure=False), take, items, window,
                             Progress(desc, progress, len(items)))

    def close(self) -> None:
        """Disconnect, and stop the local cluster if this executor started one."""
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()

    def __enter__(self) -> DaskExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "local cluster" if self._cluster is not None else "scheduler"
        return f"DaskExecutor({kind} at {self.address})"


def _in_order(submit: Callable[[T], Any], take: Callable[[Any], R], items: Sequence[T], window: int,
              bar: Progress) -> Iterator[R]:
    """``imap``'s loop: each item submitted (``submit`` returns its future), at most
    ``window`` at once, their results taken (``take``) and yielded in item order; what
    was not started when the consumer stops is cancelled."""
    ahead: collections.deque[Any] = collections.deque()
    untaken = iter(items)
    try:
        for item in untaken:
            ahead.append(submit(item))
            if len(ahead) >= window:
                break
        while ahead:
            result = take(ahead.popleft())
            item = next(untaken, _NONE)
            if item is not _NONE:
                ahead.append(submit(item))
            bar.update()
            yield result
    finally:
        for future in ahead:
            future.cancel()
        bar.close()


def _each(fn: Callable[[Iterable[T]], Iterator[R]], item: T) -> R:
    """``fn``'s result for one item (see ``map_stream``)."""
    (result,) = fn([item])
    return result


def default_executor(executor: Any = None) -> Any:
    """Return ``executor``, or a fresh :class:`EmbeddedExecutor` when it is None."""
    return EmbeddedExecutor() if executor is None else executor
