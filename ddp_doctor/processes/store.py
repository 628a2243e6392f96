"""The bounded client of torch's TCPStore, the key-value store the ranks of a job meet at: the
preflight's rendezvous (preflight_ranks/bounded_rendezvous.py) and the ranks' endings across nodes
(training/run/endings.py) go through it.

torch's store client has no bound of its own on its handshake or on an operation (a listener that
accepts and never answers blocks it forever), so each of them runs through call_with_time_limit,
and a call past its bound is abandoned in its thread (a rank process ends with os._exit, which that
thread cannot hold up).
"""
from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any, Callable, TypeVar

from ddp_doctor.time_limit import call_with_time_limit

POLL_S = 0.05  # between two looks at a key another rank is about to write
CONNECT_MARGIN_S = 2.0  # past torch's own connect timeout, before the connection is given up
T = TypeVar("T")


class StoreTimeout(TimeoutError):
    """A store call that did not return within its bound (its thread is abandoned)."""


def connect_store(host: str, port: int, *, hosting: bool, timeout: float) -> Any:
    """Host (rank 0) or join the store, within `timeout` (+ a margin): torch's client retries its
    connection for `timeout` but then waits for its handshake's answer without any bound."""
    import torch.distributed as dist
    bound = timeout + CONNECT_MARGIN_S
    out = call_with_time_limit(lambda: dist.TCPStore(
        host, port, world_size=None, is_master=hosting, timeout=timedelta(seconds=timeout),
        wait_for_workers=False), bound, name="ddp-doctor-store-connect")
    if not out.finished:
        raise StoreTimeout(f"no store answered at {host}:{port} within {bound:g} s")
    if out.error is not None:
        raise out.error
    return out.value


def store_call(fn: Callable[[], T], what: str, bound: float) -> T:
    """One store operation, bounded: torch's client waits forever on a store that stopped
    answering (a hung or stopped host). Past `bound` it raises StoreTimeout."""
    out = call_with_time_limit(fn, max(0.5, bound), name="ddp-doctor-store-op")
    if not out.finished:
        raise StoreTimeout(f"the store did not answer {what} within {max(0.5, bound):g} s")
    if out.error is not None:
        raise out.error
    return out.value  # type: ignore[return-value]


def op_bound(timeout: float) -> float:
    """How long one store operation may take: far above a working store's milliseconds."""
    return max(2.0, min(timeout, 30.0))


def prefixed(store: Any, prefix: str) -> Any:
    import torch.distributed as dist
    return dist.PrefixStore(prefix, store)


def read_json_keys(store: Any, keys: list[str], deadline: float) -> dict[str, Any]:
    """Read the keys that appear before the deadline; the absent ones are left out."""
    out: dict[str, Any] = {}
    pending = list(keys)
    while pending:
        bound = op_bound(deadline - time.monotonic())
        for k in list(pending):
            if store_call(lambda k=k: store.check([k]), f"check({k!r})", bound):
                out[k] = json.loads(store_call(lambda k=k: store.get(k), f"get({k!r})", bound).decode("utf-8"))
                pending.remove(k)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    return out
