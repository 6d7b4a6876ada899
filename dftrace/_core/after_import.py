"""Run a function right after a module is imported, whoever imports it and when.

:func:`when_imported` calls ``callback(module)`` at once when the module is already
imported, else once the import system has executed it: a finder at the front of
``sys.meta_path`` hands out the module's own spec with a loader that runs the
callback after the module's code. Nothing is imported here; a callback that
raises is reported once and the import goes on.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import threading
from typing import Any, Callable

__all__ = ["when_imported"]

#: A callback, or ``"package.module:function"``: imported only when it is called, so
#: a module can ask for code that imports it back without an import cycle.
Callback = Callable[[Any], None] | str

_callbacks: dict[str, list[Callback]] = {}
_lock = threading.RLock()
_looking = threading.local()


def when_imported(name: str, callback: Callback) -> None:
    """``callback(module)`` once ``name`` is imported (now if it is already); a
    callback already waiting for ``name`` is not added again."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            waiting = _callbacks.setdefault(name, [])
            if callback not in waiting:  # asked again (each initialize()): once
                waiting.append(callback)
            if not any(isinstance(f, _Finder) for f in sys.meta_path):
                sys.meta_path.insert(0, _Finder())
            return
    _run(callback, module)


def _run(callback: Callback, module: Any) -> None:
    try:
        if isinstance(callback, str):
            where, _, name = callback.partition(":")
            callback = getattr(importlib.import_module(where), name)
        callback(module)
    except Exception as exc:
        from .state import STATE

        STATE.warn_once(f"after-import:{module.__name__}",
                        f"tracing {module.__name__} failed and was skipped: {exc!r}")


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the callbacks waiting for it."""

    def __init__(self, loader: Any):
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        # The module's spec keeps its own loader (reloads, pickling and importlib's
        # resources see it); only this one load goes through here.
        module.__spec__.loader = self.loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        self.loader.exec_module(module)
        with _lock:
            waiting = _callbacks.pop(module.__name__, [])
        for callback in waiting:
            _run(callback, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _callbacks or getattr(_looking, "name", None) == fullname:
            return None
        _looking.name = fullname
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            _looking.name = None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader)
        return spec
