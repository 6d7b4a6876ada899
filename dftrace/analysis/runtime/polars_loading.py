"""polars loaded for a command: its allocator (jemalloc) told to return freed pages
soon, unless the user set it, and Ctrl-C given back to Python's handler."""

from __future__ import annotations

import os
import signal
import sys


#: polars' allocator (jemalloc) for a command. Freed pages: polars' own setting keeps
#: them 0.5 s, then marks them free for the kernel to take when it needs them (1 s
#: more, resident until then); these are returned after 30 ms, and then at once. The
#: answers are built in about half a second from tables of every rank-step, each
#: freed as the next is built: with a second's decay they were all still resident
#: when the JSON was written, and the answers were the summary's peak (70 MB above
#: the reading's on 10M events). While files are read, a file's pieces' tables are
#: freed as it is finished, on a thread of its own, beside the next file's first
#: pieces: kept 0.3 s, they were resident together (50 MB of the 10M summary's
#: peak). After 30 ms the peak is 12 % lower for a quarter more page faults and the
#: same time; 10 ms faulted more and saved no more.
#: One arena for all threads: a piece's columns are made on the thread that decodes
#: it and freed on the one that reduced it, and with jemalloc's arenas (four per
#: CPU, each new thread given the least used) the pages freed in one arena were of
#: no use to the threads of the others (a third of the summary's page faults).
#: polars adds a setting found in ``_RJEM_MALLOC_CONF`` after its own, so this one
#: is in force.
POLARS_ALLOCATOR = "dirty_decay_ms:30,muzzy_decay_ms:0,narenas:1"


#: What polars puts first in ``_RJEM_MALLOC_CONF`` as it loads (any setting found there
#: after it). A program that loaded polars hands it on to the programs it starts: in
#: a command started from such a program it is polars' default, not a user's setting.
_POLARS_OWN_ALLOCATOR = "dirty_decay_ms:500,muzzy_decay_ms:1000"


def _users_allocator(inherited: str | None) -> str | None:
    """The user's part of an inherited ``_RJEM_MALLOC_CONF``: None where it is unset or
    only polars' own default, handed on by a program that loaded polars."""
    if inherited is None or inherited == _POLARS_OWN_ALLOCATOR:
        return None
    return inherited.removeprefix(_POLARS_OWN_ALLOCATOR + ",") or None


def load_polars() -> None:
    """Load polars for a command, with its allocator returning freed pages after
    30 ms unless the user's ``_RJEM_MALLOC_CONF`` says otherwise (the setting is read
    once, when polars loads: it is set for that alone, and the variable is left as
    the programs this process starts inherited it), and Ctrl-C given back to Python
    (see ``_python_handles_ctrl_c``)."""
    if "polars" not in sys.modules:
        inherited = os.environ.get("_RJEM_MALLOC_CONF")
        os.environ["_RJEM_MALLOC_CONF"] = _users_allocator(inherited) or POLARS_ALLOCATOR
        try:
            import polars  # noqa: F401
        except ImportError:
            return
        finally:
            if inherited is None:
                os.environ.pop("_RJEM_MALLOC_CONF", None)
            else:
                os.environ["_RJEM_MALLOC_CONF"] = inherited
    _python_handles_ctrl_c()


def _python_handles_ctrl_c() -> None:
    """Give SIGINT back to Python's own handler (or to the disposition the process was
    started with). polars installs a handler of its own when it loads, which raises
    KeyboardInterrupt from within its queries, in whichever thread runs them, besides
    Python's: a Ctrl-C during a query was raised twice, and a process started with
    SIGINT ignored (a background job of a script) was interrupted all the same. With
    Python's handler a Ctrl-C is raised once, in the main thread, as soon as the query
    under way returns (a piece's queries take milliseconds)."""
    try:
        handler = signal.getsignal(signal.SIGINT)
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: not this code's to set
        pass
