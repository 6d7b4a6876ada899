"""What a command is doing, on the terminal: one line on stderr that names the phase
(reading the parts, combining them, building the answers), counts what it can, and
ticks its elapsed time, so no phase that lasts is silent.

The line appears only on a terminal (or when asked), and only for a phase that lasts
longer than ``DELAY_S``; it is gone when the phase ends. A phase without anything to
count still ticks: a thread refreshes the line twice a second.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .deps import require

#: A phase shorter than this draws nothing.
DELAY_S = 1.0
#: How often a phase's line is redrawn while nothing is counted.
_TICK_S = 0.5


def wanted(enabled: bool | None) -> bool:
    """Whether to draw progress: as asked, else when stderr is a terminal."""
    return sys.stderr.isatty() if enabled is None else enabled


class Progress:
    """One phase's line: ``desc``, ``done/total unit`` when there is a total, the
    elapsed time and, with a total, the time left."""

    def __init__(self, desc: str, enabled: bool | None, total: int | None = None, unit: str = "part"):
        self._bar: Any = None
        self._stop = threading.Event()
        if not wanted(enabled) or total == 0:
            return
        tqdm = require("tqdm").tqdm
        shape = ("{desc}: {n_fmt}/{total_fmt} " + unit + "s [{elapsed}<{remaining}]" if total
                 else "{desc} [{elapsed}]")
        self._bar = tqdm(total=total, desc=desc, delay=DELAY_S, leave=False, bar_format=shape,
                         file=sys.stderr)
        threading.Thread(target=self._tick, name="dftrace-progress", daemon=True).start()

    def _tick(self) -> None:
        while not self._stop.wait(_TICK_S):
            bar = self._bar
            if bar is None:
                return
            try:
                if bar._time() - bar.start_t >= DELAY_S:
                    bar.refresh()  # a closed bar draws nothing
            except Exception:  # a closed stream: nothing to draw on
                return

    def update(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        self._stop.set()
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.close()


@contextmanager
def phase(desc: str, enabled: bool | None) -> Iterator[Progress]:
    """A phase with nothing to count: its line names it and ticks its elapsed time."""
    line = Progress(desc, enabled)
    try:
        yield line
    finally:
        line.close()
