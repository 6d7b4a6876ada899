"""The rank of this process, from its launcher's environment (torchrun, MPI, SLURM,
Lightning). The rank torch.distributed gives once a process group exists is written
later, by ``Session.set_rank``."""

from __future__ import annotations

import os

from .config import RANK_MAX, ConfigError
from .state import STATE

__all__ = ["detect_rank"]

_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
_LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")


def _env_int(names: tuple[str, ...], strict: bool = False) -> int | None:
    """The first of ``names`` set to a number. With ``strict``, one set to a
    number out of range (0 to 2**31 - 1) raises ConfigError naming it, and one set
    to something else is passed over with a warning naming it (the variable may
    be another program's)."""
    for n in names:
        v = os.environ.get(n, "").strip()
        if v.isascii() and v.isdigit():
            if len(v) <= 10 and int(v) <= RANK_MAX:
                return int(v)
            if strict:
                raise ConfigError(f"{n}={v!r} is invalid: expected an integer from 0 to {RANK_MAX}")
        elif v and strict:
            STATE.warn_once(f"rank-var:{n}", f"{n}={v[:40]!r} is not a rank (an integer from 0 to "
                            f"{RANK_MAX}): it is not read; rank=N sets one")
    return None


def detect_rank(strict: bool = False) -> tuple[int | None, int | None]:
    """(rank, local rank) from the launcher's environment, None when unknown.

    The global rank is the first of RANK, OMPI_COMM_WORLD_RANK, PMI_RANK and
    SLURM_PROCID that is set. Launchers that set only the local rank (Lightning's,
    which sets LOCAL_RANK, NODE_RANK and WORLD_SIZE) give it as
    ``NODE_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK``, or the local rank on node 0."""
    rank, local = _env_int(_RANK_VARS, strict), _env_int(_LOCAL_RANK_VARS)
    if rank is None and local is not None and os.environ.get("WORLD_SIZE"):
        node = _env_int(("NODE_RANK", "GROUP_RANK"))
        per_node = _env_int(("LOCAL_WORLD_SIZE",))
        if not node:
            rank = local
        elif per_node:
            rank = node * per_node + local
    return rank, local
