"""The package's import graph has no cycle: module-level and function-level imports
alike, so every layer can be read (and loaded) without the ones above it."""

from __future__ import annotations

import ast
import pathlib

import dftrace

PACKAGE = pathlib.Path(dftrace.__file__).resolve().parent


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    if not level:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def import_graph() -> dict[str, set[str]]:
    """Each module -> the package modules it imports (anywhere in its body)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_package, node.level, node.module)
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            for name in names:
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                # a package's own submodules and its parents are not edges of a cycle
                if name and name != mod and not mod.startswith(name + ".") \
                        and not (is_package and name.startswith(mod + ".")):
                    graph[mod].add(name)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_cycle():
    """No module imports, directly or through others, a module that imports it."""
    cycles = find_cycles(import_graph())
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    """The check itself can fail: a two-module loop is reported."""
    assert find_cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
