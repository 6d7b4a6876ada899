"""The ``pip install`` command that adds an extra to the dftrace a program is running.

``pip install 'dftrace[analysis]'`` is right only where ``pip`` belongs to the
interpreter running dftrace (an activated virtual environment, say). Run as
``.venv/bin/dftrace`` from another shell, the ``pip`` on ``PATH`` is another
environment's, which has no dftrace: the hint then names this interpreter
(``/path/.venv/bin/python -m pip install 'dftrace[analysis]'``). pip installs an
extra of a distribution already installed from its own metadata, so the command
works whether dftrace came from the package index or from a clone.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["import_framework", "pip_install"]


def pip_install(extra: str) -> str:
    """The command that installs ``dftrace[extra]`` into the running interpreter's environment."""
    import shlex  # a message being made: not at ``import dftrace``
    import shutil

    spec = f"'dftrace[{extra}]'"
    try:
        pip = shutil.which("pip")
        here = os.path.dirname(sys.executable)
        if sys.executable and (pip is None or os.path.dirname(pip) != here):
            return f"{shlex.quote(sys.executable)} -m pip install {spec}"
    except (OSError, ValueError):  # an unreadable PATH entry: the plain form
        pass
    return f"pip install {spec}"


def import_framework(module: str, integration: str, framework: str) -> Any:
    """``module`` imported for ``dftrace.<integration>``; when it is missing, an
    ImportError naming ``framework`` and the command that installs the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"dftrace.{integration} needs {framework}, which is not installed; "
                          f"install it with: {pip_install(integration)}") from exc
