"""Shim existing methods with nodes for the length of a ``with`` block.

``dftrace.instrument(obj_or_class, {"method": node, ...})`` wraps methods the user
did not write (a library's Dataset, a model instance) as if they had been decorated,
and puts the originals back when the block ends, whatever way it ends: class-level
shims outlive a failing notebook cell otherwise.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from .._core import tree as _tree
from .._core.state import STATE

__all__ = ["Instrumentation", "instrument"]

_ABSENT = object()


class Instrumentation:
    """The context manager :func:`instrument` returns; reusable, not re-entrant."""

    def __init__(self, target: Any, methods: Mapping[str, Any]):
        if not isinstance(methods, Mapping) or not methods:
            raise TypeError("instrument(target, {'method_name': node, ...}) needs a non-empty "
                            "dict of method names to nodes")
        for name, node in methods.items():
            if not isinstance(name, str):
                raise TypeError(f"instrument: method names are strings; got {name!r}")
            if not isinstance(node, _tree._Traceable):
                raise TypeError(
                    f"instrument: {name!r} maps to {node!r}; give a node such as "
                    "ai.compute.forward or ai.data.item(capture=True)")
        self.target = target
        self.methods = dict(methods)
        # (owner, name, what was in owner.__dict__ before or _ABSENT), in apply order
        self._undo: list[tuple[Any, str, Any]] = []
        self._active = False

    # -- planning -----------------------------------------------------------------------
    def _describe(self) -> str:
        t = self.target
        return t.__qualname__ if inspect.isclass(t) else f"{type(t).__qualname__} instance"

    def _candidates(self) -> list[str]:
        names = [n for n in dir(self.target) if not n.startswith("__")]
        return [n for n in names if callable(getattr(self.target, n, None))]

    def _plan(self, name: str, node: Any) -> tuple[Any, Any, Any]:
        """(owner, shim, previous own attribute) for one method; raises before
        anything is changed when the method cannot be instrumented."""
        t = self.target
        try:
            raw = inspect.getattr_static(t, name)
        except AttributeError:
            import difflib  # only on this error path

            close = difflib.get_close_matches(name, self._candidates(), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise AttributeError(f"instrument: {self._describe()} has no method {name!r}{hint}") from None
        if isinstance(raw, property) or not (callable(raw) or isinstance(raw, (staticmethod, classmethod))):
            raise TypeError(f"instrument: {self._describe()}.{name} is a "
                            f"{type(raw).__name__}, not a method")
        if inspect.isclass(t):
            if not hasattr(type(raw), "__get__"):
                # A callable object stored on a class is not bound to instances; a
                # function shim would be, and would change what the call receives.
                raise TypeError(f"instrument: {t.__qualname__}.{name} is a callable "
                                f"{type(raw).__name__} object, not a method; instrument "
                                "the object itself")
            return t, node.decorate(raw), t.__dict__.get(name, _ABSENT)
        if name.startswith("__") and name.endswith("__"):
            raise TypeError(
                f"instrument: Python looks {name} up on the class, so a shim on one "
                f"instance is never called; instrument the class instead: "
                f"dftrace.instrument({type(t).__qualname__}, {{{name!r}: ...}})")
        own = getattr(t, "__dict__", None)
        if own is None:
            raise TypeError(f"instrument: {self._describe()} has no __dict__ (__slots__?) to "
                            f"hold a shim for {name!r}; instrument its class instead")
        return t, node.decorate(getattr(t, name)), own.get(name, _ABSENT)

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> Instrumentation:
        if self._active:
            raise RuntimeError("this instrument(...) block is already active")
        plans = [(name, *self._plan(name, node)) for name, node in self.methods.items()]
        self._undo = []
        self._active = True
        try:
            for name, owner, shim, previous in plans:
                setattr(owner, name, shim)
                self._undo.append((owner, name, previous))
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        self._restore()
        return False

    def _restore(self) -> None:
        # Reverse order, so a method shimmed twice ends as it started.
        while self._undo:
            owner, name, previous = self._undo.pop()
            try:
                if previous is _ABSENT:
                    delattr(owner, name)
                else:
                    setattr(owner, name, previous)
            except Exception as exc:
                STATE.warn_once(f"instrument-restore:{name}",
                                     f"could not restore {name!r} on {owner!r}: {exc!r}")
        self._active = False

    def __repr__(self) -> str:
        state = "active" if self._active else "inactive"
        return f"<dftrace.instrument {self._describe()} {sorted(self.methods)} {state}>"


def instrument(target: Any, methods: Mapping[str, Any]) -> Instrumentation:
    """Shim methods of ``target`` (a class or an instance) with nodes for the length
    of a ``with`` block, then restore them, also when the block raises::

        with dftrace.instrument(MyDataset, {"__getitem__": ai.data.item(capture=True)}):
            ...

    On a class, instance methods, static methods and class methods are
    shimmed where they are (an inherited one is shadowed on ``target`` and the
    shadow removed afterwards). On an instance, the shim is an attribute of that
    instance only; special methods (``__getitem__``, ``__call__``) must be shimmed
    on the class, where Python looks them up. Every name is checked before anything
    changes.
    """
    return Instrumentation(target, methods)
