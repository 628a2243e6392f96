"""The plugin's per-session state, kept in ``config.stash``: the resolved settings, the xdist
exchange directory, the visible GPUs, the rank pool and the session preflight's verdict.
Things that cost something (counting GPUs, starting the rank pool) happen on first use.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import pytest

from ddp_doctor.pytest_plugin.settings import Settings


@dataclass
class State:
    settings: Settings
    worker: bool                              # an xdist worker
    exchange: str | None = None               # xdist: directory the controller and workers share
    gpus: int | None = None
    pool: Any = None
    code_cache: dict[str, bytes] = field(default_factory=dict)
    verdict: dict[str, Any] | None = None     # the session preflight's, once known
    nodes: int = 0
    nodes_collected: int = 0
    private_dir: str | None = None


STATE = pytest.StashKey[State]()


def get_state(config: pytest.Config) -> State:
    return config.stash[STATE]


def visible_gpus(state: State) -> int:
    if state.gpus is None:
        from ddp_doctor.facts.host import visible_gpu_count
        state.gpus = visible_gpu_count()
    return state.gpus


def private_dir(state: State) -> str:
    if state.private_dir is None:
        state.private_dir = tempfile.mkdtemp(prefix="ddp-doctor-pytest-")
    return state.private_dir


def pool_of(state: State) -> Any:
    """The session's RankPool, created on first use (imported late: the plugin loads in every
    pytest run, most of which never run a distributed test)."""
    if state.pool is None:
        from ddp_doctor.pytest_plugin.rank_pool import RankPool
        state.pool = RankPool(os.path.join(private_dir(state), "forkserver.log"))
    return state.pool


def cleanup(state: State) -> None:
    """Close the rank pool and remove this process's directories (the controller owns the exchange)."""
    if state.pool is not None:
        state.pool.close()
    import shutil
    for d in (state.private_dir, None if state.worker else state.exchange):
        if d:
            shutil.rmtree(d, ignore_errors=True)
