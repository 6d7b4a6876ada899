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

__all__ = ["pip_install"]


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
