"""Browsing a run: :class:`Trace` -> :class:`Calls` -> :class:`Call`, by category,
name and position (``t.compute.forward[0].params.batch.shape``). :meth:`Trace.load`
builds the same objects from trace files.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator
from typing import Any

from .values import render

__all__ = ["Call", "Calls", "Record", "Trace", "TraceKeyError"]



# =====================================================================================
# Browsing: Trace -> Calls -> Call
# =====================================================================================

class TraceKeyError(KeyError, AttributeError):
    """A key that is not in a trace; the message lists the valid ones. Both a
    ``KeyError`` (``t["x"]``) and an ``AttributeError`` (``t.x``), as the two are
    the same lookup."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _missing(key: Any, where: str, keys: list[str], what: str = "key", hint: str = "") -> TraceKeyError:
    import difflib  # only on this error path: keeps `import dftrace` light

    shown = ", ".join(keys) if keys else "(none)"
    plural = "categories" if what == "category" else what + "s"
    msg = f"no {what} {key!r} in {where}; valid {plural}: {shown}"
    close = difflib.get_close_matches(str(key), keys, n=1)
    if close:
        msg += f" (did you mean {close[0]!r}?)"
    if hint:
        msg += f". {hint}"
    return TraceKeyError(msg)


class Record(dict):
    """A dict of captured values whose keys also read as attributes
    (``call.params.batch.shape``)."""

    __slots__ = ()

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        return self[key]

    def __getitem__(self, key: Any) -> Any:
        try:
            return dict.__getitem__(self, key)
        except KeyError:
            raise _missing(key, "this record", [str(k) for k in self]) from None

    def __dir__(self) -> list[str]:
        return sorted(str(k) for k in self)

    def _ipython_key_completions_(self) -> list[str]:
        return [str(k) for k in self]


def _to_record(v: Any) -> Any:
    if isinstance(v, dict):
        return Record({k: _to_record(x) for k, x in v.items()})
    if isinstance(v, list):
        return [_to_record(x) for x in v]
    return v


class _Browsable:
    """Item and attribute access are one lookup; ``dir()`` lists the valid keys."""

    __slots__ = ()

    def _keys(self) -> list[str]:
        raise NotImplementedError

    def _get(self, key: Any) -> Any:
        raise NotImplementedError

    def __getitem__(self, key: Any) -> Any:
        return self._get(key)

    def __getattr__(self, key: str) -> Any:
        # Private and dunder names are never keys: notebooks probe for _repr_png_,
        # _ipython_display_ and friends and must get a plain AttributeError.
        if key.startswith("_"):
            raise AttributeError(key)
        return self._get(key)

    def __dir__(self) -> list[str]:
        public = [k for k in object.__dir__(self) if not k.startswith("_")]
        return sorted(set(self._keys()) | set(public))

    def _ipython_key_completions_(self) -> list[str]:
        return self._keys()

    def keys(self) -> list[str]:
        """The keys valid at this level (also listed by ``dir()``)."""
        return self._keys()

    def __repr__(self) -> str:
        # Notebooks and REPLs show repr(): make it the readable table, as print() does.
        return str(self)


def _fmt_dur(us: float | None) -> str:
    if us is None:
        return "?"
    if us < 1000:
        return f"{us:.0f} µs" if float(us).is_integer() else f"{us:.1f} µs"
    if us < 1_000_000:
        return f"{us / 1000:.3g} ms"
    return f"{us / 1e6:.3g} s"


def _fmt_params(params: dict[str, Any] | None, width: int = 60) -> str:
    if not params:
        return ""
    text = ", ".join(f"{k}={render(v, width)}" for k, v in params.items())
    return text if len(text) <= width else text[: width - 1] + "…"


def _text_table(headers: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> str:
    widths = [len(h) for h in headers]
    for r in rows:
        for j, cell in enumerate(r):
            widths[j] = max(widths[j], len(cell))

    def line(cells: list[str]) -> str:
        out = [c.rjust(widths[j]) if j in right else c.ljust(widths[j]) for j, c in enumerate(cells)]
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def _html_table(caption: str, headers: list[str], rows: list[list[str]]) -> str:
    from html import escape as e  # notebooks only
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return (f'<table class="dftrace"><caption>{e(caption)}</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


_MAX_ROWS = 40  # rows a printed table shows before "... N more"

#: What every call has; a parameter of the same name stays reachable as ``.params[...]``.
CALL_FIELDS = ("name", "cat", "params", "result", "error", "duration", "start", "args",
               "children", "parent", "id", "pid", "tid", "ts", "dur", "level")


class Call(_Browsable):
    """One recorded call (a complete event). ``params`` and ``result`` hold the
    captured summaries; ``duration`` and ``start`` are seconds (``start`` from the
    beginning of the trace); ``children`` the calls nested in it."""

    __slots__ = ("name", "cat", "id", "pid", "tid", "ts", "dur", "level", "args", "params",
                 "result", "error", "parent", "_children", "_p_idx", "_t0", "event")

    def __init__(self, event: dict[str, Any]):
        self.event = event
        self.name = str(event.get("name", "?"))
        self.cat = str(event.get("cat", ""))
        self.id = event.get("id")
        self.pid = event.get("pid")
        self.tid = event.get("tid")
        ts, dur = event.get("ts"), event.get("dur")
        self.ts = ts if isinstance(ts, (int, float)) else 0
        self.dur = dur if isinstance(dur, (int, float)) else 0
        raw = event.get("args")
        raw = raw if isinstance(raw, dict) else {}
        self._p_idx = raw.get("p_idx")
        self.level = raw.get("level")
        self.args = Record({k: _to_record(v) for k, v in raw.items()
                            if k not in ("hhash", "level", "p_idx")})
        params = self.args.get("params")
        self.params = params if isinstance(params, Record) else Record()
        self.result = self.args.get("result")
        err = raw.get("error")
        msg = raw.get("error_message")
        self.error = None if err is None else (f"{err}: {msg}" if msg else str(err))
        self.parent: Call | None = None
        self._children: list[Call] = []
        self._t0 = self.ts

    @property
    def duration(self) -> float:
        """Seconds the call took."""
        return self.dur / 1e6

    @property
    def start(self) -> float:
        """Seconds from the start of the trace to the start of this call."""
        return (self.ts - self._t0) / 1e6

    @property
    def children(self) -> Calls:
        """The calls nested directly in this one, in start order."""
        return Calls(self._children, title=f"children of {self.cat}.{self.name}")

    def _keys(self) -> list[str]:
        return list(CALL_FIELDS) + [k for k in self.params if k not in CALL_FIELDS]

    def _get(self, key: Any) -> Any:
        if isinstance(key, str):
            if key in CALL_FIELDS:
                return getattr(self, key)
            if key in self.params:
                return self.params[key]
        raise _missing(key, f"call {self.cat}.{self.name}",
                       [k for k in self.params if k not in CALL_FIELDS] + list(CALL_FIELDS),
                       hint="parameters first, then the fields every call has")

    def _rows(self) -> list[list[str]]:
        rows = [["call", f"{self.cat}.{self.name}"],
                ["start", f"+{_fmt_dur(self.ts - self._t0)}"],
                ["duration", _fmt_dur(self.dur)]]
        for k, v in self.params.items():
            rows.append([f"params.{k}", render(v, 80)])
        if "result" in self.args:
            rows.append(["result", render(self.result, 80)])
        if self.error:
            rows.append(["error", self.error])
        others = {k: v for k, v in self.args.items()
                  if k not in ("params", "result", "error", "error_message")}
        if others:
            rows.append(["args", render(others, 80)])
        if self._children:
            names: dict[str, int] = {}
            for c in self._children:
                names[c.name] = names.get(c.name, 0) + 1
            rows.append(["children", ", ".join(f"{n} ×{k}" for n, k in names.items())])
        return rows

    def __str__(self) -> str:
        rows = self._rows()
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def _repr_html_(self) -> str:
        return _html_table(f"{self.cat}.{self.name}", ["field", "value"], self._rows())


class Calls(_Browsable):
    """Calls in start order. ``[i]`` is one call, ``[name]`` (or ``.name``) the calls
    of a name below this level: ``t.dataloader.fetch.iter[0]``."""

    __slots__ = ("_calls", "_pool", "_prefix", "_title")

    def __init__(self, calls: list[Call], pool: list[Call] | None = None, prefix: str = "",
                 title: str = "calls"):
        self._calls = calls
        self._pool = calls if pool is None else pool
        self._prefix = prefix
        self._title = title

    def __len__(self) -> int:
        return len(self._calls)

    def __iter__(self) -> Iterator[Call]:
        return iter(self._calls)

    def __bool__(self) -> bool:
        return bool(self._calls) or bool(self._pool)

    def _rest(self, name: str) -> str | None:
        p = self._prefix
        if not p:
            return name
        return name[len(p) + 1:] if name.startswith(p + ".") else None

    def _keys(self) -> list[str]:
        keys: dict[str, None] = {}
        for c in self._pool:
            rest = self._rest(c.name)
            if rest:
                keys[rest.split(".", 1)[0]] = None
        return list(keys)

    def _sub(self, key: str) -> Calls | None:
        name = f"{self._prefix}.{key}" if self._prefix else key
        pool = [c for c in self._pool if c.name == name or c.name.startswith(name + ".")]
        if not pool:
            return None
        exact = [c for c in pool if c.name == name]
        # "compute" -> "compute.forward"; a descriptive title ("children of x") -> the name
        title = name if " " in self._title else f"{self._title}.{key}"
        return Calls(exact, pool, name, title)

    def _get(self, key: Any) -> Any:
        if isinstance(key, bool):
            raise TypeError("index calls with an int, a slice or a name")
        if isinstance(key, int):
            try:
                return self._calls[key]
            except IndexError:
                raise IndexError(f"{self._title} has {len(self._calls)} call(s); "
                                 f"index {key} is out of range") from None
        if isinstance(key, slice):
            return Calls(self._calls[key], title=f"{self._title}[{key.start}:{key.stop}]")
        if isinstance(key, str):
            sub: Calls | None = self
            for part in key.split("."):
                sub = sub._sub(part) if sub is not None else None
            if sub is not None:
                return sub
            hint = ""
            if key in CALL_FIELDS and self._calls:
                hint = (f"{self._title} holds {len(self._calls)} call(s): pick one first, "
                        f"e.g. [0].{key}")
            raise _missing(key, self._title, self._keys(), "name", hint)
        raise TypeError(f"index calls with an int, a slice or a name, not {type(key).__name__}")

    @property
    def calls(self) -> list[Call]:
        """The calls as a plain list."""
        return list(self._calls)

    @property
    def total(self) -> float:
        """Seconds spent in these calls (summed)."""
        return sum(c.dur for c in self._calls) / 1e6

    def _table(self) -> tuple[list[str], list[list[str]]]:
        mixed = len({c.name for c in self._calls}) > 1
        headers = ["#"] + (["name"] if mixed else []) + ["start", "duration", "params", "result"]
        rows = []
        for n, c in enumerate(self._calls[:_MAX_ROWS]):
            if c.error:
                result = f"error {c.error}"
            else:
                result = render(c.result, 40) if "result" in c.args else ""
            rows.append([str(n)] + ([c.name] if mixed else [])
                        + [f"+{_fmt_dur(c.ts - c._t0)}", _fmt_dur(c.dur), _fmt_params(c.params), result])
        return headers, rows

    def _heading(self) -> str:
        text = f"{self._title}: {len(self._calls)} call(s), {_fmt_dur(self.total * 1e6)}"
        subs = self._keys()
        if subs:
            text += f"; names below: {', '.join(subs)}"
        return text

    def __str__(self) -> str:
        headers, rows = self._table()
        text = self._heading()
        if rows:
            text += "\n" + _text_table(headers, rows, right={0, 1} if headers[1] == "start" else {0})
        if len(self._calls) > _MAX_ROWS:
            text += f"\n... {len(self._calls) - _MAX_ROWS} more"
        return text

    def _repr_html_(self) -> str:
        headers, rows = self._table()
        return _html_table(self._heading(), headers, rows)


class Trace(_Browsable):
    """A recorded run to browse: ``t.compute`` or ``t["compute"]`` (a category),
    ``t.compute.forward`` (the calls of a name), ``t.compute.forward[0]`` (one call),
    then ``.params``, ``.result``, ``.duration``, ``.args``, ``.children``.

    Made by :func:`~dftrace.trace_in_memory` or :meth:`load`; ``print(t)`` shows a
    summary table and Jupyter renders one (``_repr_html_``).
    """

    __slots__ = ("events", "error", "max_items", "_calls", "_cats")

    def __init__(self, events: Iterable[dict[str, Any]] = (), *, max_items: int | None = None,
                 error: str | None = None):
        self.max_items = max_items
        self._fill(list(events), error)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        """The trace in a file, a directory of files (recursively) or a glob:
        dftrace's files and DFTracer's (nesting is rebuilt from timing when the
        file has no ``p_idx``). Broken lines are skipped."""
        from ..format.reading import iter_trace_lines

        files = _trace_files(path)
        if not files:
            raise FileNotFoundError(f"no trace files at {os.fspath(path)!r}")
        events = [line.event for f in files for line in iter_trace_lines(f)
                  if line.event is not None]
        return cls(events)

    def _fill(self, events: list[dict[str, Any]], error: str | None = None) -> None:
        self.events = events
        self.error = error
        self._calls = _build_calls(events)
        cats: dict[str, list[Call]] = {}
        for c in self._calls:
            cats.setdefault(c.cat, []).append(c)
        self._cats = cats

    # -- browsing ----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._calls)

    def __iter__(self) -> Iterator[Call]:
        return iter(self._calls)

    def _keys(self) -> list[str]:
        return list(self._cats)

    def _get(self, key: Any) -> Any:
        if isinstance(key, (int, slice)) and not isinstance(key, bool):
            return self.calls[key]
        if isinstance(key, str):
            head, _, rest = key.partition(".")
            if head in self._cats:
                cat = Calls(self._cats[head], title=head)
                return cat[rest] if rest else cat
            homes = sorted({c.cat for c in self._calls if c.name.split(".", 1)[0] == key})
            hint = ""
            if homes:
                hint = f"{key!r} is a name in category {homes[0]!r}: use t.{homes[0]}.{key}"
            raise _missing(key, "this trace", self._keys(), "category", hint)
        raise TypeError(f"index a trace with a category name, an int or a slice, "
                        f"not {type(key).__name__}")

    @property
    def calls(self) -> Calls:
        """Every call, in start order."""
        return Calls(self._calls, title="all calls")

    @property
    def roots(self) -> Calls:
        """The calls not nested in another recorded call."""
        return Calls([c for c in self._calls if c.parent is None], title="top-level calls")

    @property
    def categories(self) -> list[str]:
        """Categories in order of their first call."""
        return self._keys()

    @property
    def duration(self) -> float:
        """Seconds from the first call's start to the last call's end."""
        if not self._calls:
            return 0.0
        return (max(c.ts + c.dur for c in self._calls) - self._calls[0].ts) / 1e6

    @property
    def partial(self) -> bool:
        """True when the traced block raised (the trace ends there)."""
        return self.error is not None

    # -- display ----------------------------------------------------------------------
    def _summary(self) -> tuple[str, list[str], list[list[str]]]:
        groups: dict[tuple[str, str], list[Call]] = {}
        for c in self._calls:
            groups.setdefault((c.cat, c.name), []).append(c)
        rows = []
        for (cat, name), calls in groups.items():
            total = sum(c.dur for c in calls)
            captured: dict[str, None] = {}
            for c in calls:
                captured.update(dict.fromkeys(c.params))
            fields = ", ".join(captured)
            if any("result" in c.args for c in calls):
                fields = f"{fields}; result" if fields else "result"
            errors = sum(1 for c in calls if c.error)
            rows.append([cat, name, str(len(calls)), _fmt_dur(total),
                         _fmt_dur(total / len(calls)), fields,
                         f"{errors} error(s)" if errors else ""])
        head = f"dftrace trace: {len(self._calls)} call(s) in {len(self._cats)} categor"
        head += "y" if len(self._cats) == 1 else "ies"
        head += f", {_fmt_dur(self.duration * 1e6)}"
        if self.max_items is not None:
            head += f", sample mode max_items={self.max_items}"
        if self.error:
            head += f"; PARTIAL: the block raised {self.error}"
        headers = ["category", "name", "calls", "total", "mean", "captured", "errors"]
        if not any(r[-1] for r in rows):
            headers = headers[:-1]
            rows = [r[:-1] for r in rows]
        return head, headers, rows

    def __str__(self) -> str:
        head, headers, rows = self._summary()
        if not rows:
            return head
        return head + "\n" + _text_table(headers, rows, right={2, 3, 4})

    def _repr_html_(self) -> str:
        head, headers, rows = self._summary()
        return _html_table(head, headers, rows)


def _build_calls(events: list[dict[str, Any]]) -> list[Call]:
    """Calls from the complete events, in start order, linked to their parents: by
    ``p_idx`` (span ids are unique per process), else by time containment on each
    (pid, tid) track (DFTracer files have no ``p_idx``)."""
    from ..format.names import normalize_phase

    calls = [Call(e) for e in events
             if isinstance(e, dict) and normalize_phase(e.get("ph")) == "X"]
    calls.sort(key=lambda c: (c.ts, c.id if isinstance(c.id, int) else 0))
    if not calls:
        return calls
    t0 = calls[0].ts
    by_id: dict[tuple[Any, Any], Call] = {}
    for c in calls:
        c._t0 = t0
        if c.id is not None:
            by_id[(c.pid, c.id)] = c
    unlinked: dict[tuple[Any, Any], list[Call]] = {}
    for c in calls:
        if c._p_idx is None:
            unlinked.setdefault((c.pid, c.tid), []).append(c)
        elif c._p_idx:
            parent = by_id.get((c.pid, c._p_idx))
            if parent is not None and parent is not c:
                c.parent = parent
                parent._children.append(c)
    for track in unlinked.values():
        track.sort(key=lambda c: (c.ts, -c.dur))
        stack: list[Call] = []
        for c in track:
            while stack and stack[-1].ts + stack[-1].dur < c.ts + c.dur:
                stack.pop()
            if stack:
                c.parent = stack[-1]
                stack[-1]._children.append(c)
            stack.append(c)
    for c in calls:
        if len(c._children) > 1:
            c._children.sort(key=lambda x: (x.ts, x.id if isinstance(x.id, int) else 0))
    return calls


def _trace_files(where: str | os.PathLike[str]) -> list[str]:
    from ..format.names import is_trace_file

    p = os.fspath(where)
    if os.path.isfile(p):
        return [p]
    if os.path.isdir(p):
        found = glob.glob(os.path.join(glob.escape(p), "**", "*"), recursive=True)
    else:
        found = glob.glob(p)
    return sorted(f for f in found if os.path.isfile(f) and is_trace_file(f))

