"""Whether this dftrace is a source tree without its C engine while another dftrace
this Python could import has it built: a Python started inside a clone after
``pip install .`` imports the tree, and would run the pure-Python engine without a
word. Looked at only when the engine does not load."""

from __future__ import annotations

import glob
import importlib.machinery
import os
import sys

from .state import STATE


def say_if_a_source_tree_shadows_the_engine() -> None:
    """Warn when this dftrace, without its C engine, is a source tree (a Python started
    in a clone after ``pip install .``) while another dftrace this Python could import
    has the engine built: the pure-Python engine would otherwise run without a word."""
    try:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        root = os.path.dirname(here)
        if not any(os.path.exists(os.path.join(root, name)) for name in ("pyproject.toml", "setup.py")):
            return
        places = [os.path.join(os.path.abspath(entry or os.curdir), "dftrace") for entry in sys.path]
        for finder in sys.meta_path:  # an editable install's finder, for one
            if finder is importlib.machinery.PathFinder or not hasattr(finder, "find_spec"):
                continue
            try:
                spec = finder.find_spec("dftrace", None)
            except Exception:
                continue
            if spec is not None and spec.origin:
                places.append(os.path.dirname(spec.origin))
        mine = os.path.realpath(here)
        for place in places:
            if os.path.realpath(place) != mine and glob.glob(os.path.join(place, "_core", "_speedups*")):
                STATE.warn_once("source-tree", (
                    f"imported from the source tree {root!r}, which has no compiled engine: the "
                    f"pure-Python engine runs, several times slower. The dftrace at {place!r} has it: start "
                    f"Python outside the tree, or build the tree in place (pip install -e .)"))
                return
    except Exception:  # only ever a hint
        pass
