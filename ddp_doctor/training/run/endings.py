"""How a rank's ending reaches the other nodes' reports: through the job's key-value store.

Each node's parent (or rank 0 under an outside launcher) reports from its own run directory, which
holds only its node's ranks. So every rank, when its script ends, puts its ending (the outcome
record and the tail of its ledger) in the job's store, and a rank that failed copies the endings
of the ranks on other nodes it finds there into its run directory (`rank-N.json`, `ledger-N.json`,
as if they were local): node 0's report then names a cause that happened on node 3.

The store is the launcher's (torchrun's agent store at MASTER_ADDR:MASTER_PORT, which outlives the
ranks and the script's own process group), reached through a new client connection with a short
timeout, so this works after destroy_process_group and never waits on the user's group. Every
step is bounded (STORE_BOUND in all); nothing here is a collective.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from ddp_doctor.report.redact import redact_obj
from ddp_doctor.time_limit import call_with_time_limit
from ddp_doctor.training import records

STORE_BOUND = 4.0  # seconds, at most, for one rank's whole exchange at its ending
LEDGER_TAIL = 300  # ledger entries carried through the store per rank (the newest)
MAX_FETCH = 256  # other ranks' endings a rank copies (failed ones first)


def _prefix(env: Any) -> str:
    run = env.get("TORCHELASTIC_RUN_ID") or "job"
    restart = env.get("TORCHELASTIC_RESTART_COUNT") or "0"
    return f"ddp_doctor/endings/{run}/{restart}"


def _connect(env: Any, timeout: float) -> Any:
    from ddp_doctor.preflight_run.rendezvous import connect_store
    host, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not host or not port:
        return None
    return connect_store(host, int(port), hosting=False, timeout=timeout)


def ending_of(run_dir: str, rank: int) -> dict[str, Any]:
    """This rank's outcome and the newest entries of its ledger, as left in its run directory."""
    outcome = records.read_outcomes(run_dir).get(rank)
    ledger = records.read_ledgers(run_dir).get(rank)
    if ledger is not None:
        ledger = {**ledger, "entries": (ledger.get("entries") or [])[-LEDGER_TAIL:]}
    # redacted as the rank views are (preflight_run/rank_view.py): the store has no authentication
    # and other nodes keep a copy in their run directory
    return redact_obj({"rank": rank, "host": os.uname().nodename, "outcome": outcome, "ledger": ledger})


def exchange(run_dir: str, rank: int, *, failed: bool, env: Any = None) -> list[int]:
    """Put this rank's ending in the store; when it failed, copy the other nodes' endings into
    `run_dir`. Returns the ranks copied. Bounded by STORE_BOUND; never raises."""
    env = os.environ if env is None else env
    out = call_with_time_limit(lambda: _exchange(run_dir, rank, failed, env), STORE_BOUND,
                               name="ddp-doctor-endings")
    return list(out.value or []) if out.finished and out.error is None else []


def _exchange(run_dir: str, rank: int, failed: bool, env: Any) -> list[int]:
    deadline = time.monotonic() + STORE_BOUND - 0.5
    store = _connect(env, STORE_BOUND / 2)
    if store is None:
        return []
    prefix = _prefix(env)
    store.set(f"{prefix}/{rank}", json.dumps(ending_of(run_dir, rank), default=str))
    store.append(f"{prefix}/ended", f"{rank}{'!' if failed else ''},")
    if not failed:
        return []
    local = set(records.read_outcomes(run_dir)) | set(records.read_heartbeats(run_dir))
    copied: list[int] = []
    # Peers that failed at about the same time may publish a moment later: look twice.
    for attempt in range(2):
        listed = [x for x in store.get(f"{prefix}/ended").decode().split(",") if x]
        failed_first = sorted(listed, key=lambda x: (not x.endswith("!"), int(x.rstrip("!"))))
        for item in failed_first[:MAX_FETCH]:
            r = int(item.rstrip("!"))
            if r in local or r in copied or time.monotonic() > deadline:
                continue
            d = json.loads(store.get(f"{prefix}/{r}"))
            _keep(run_dir, r, d)
            copied.append(r)
        if attempt == 0 and time.monotonic() + 1.0 < deadline:
            time.sleep(1.0)
    return copied


def _keep(run_dir: str, rank: int, ending: dict[str, Any]) -> None:
    """Another node's ending, written where this node's report reads its own ranks' records."""
    if isinstance(ending.get("outcome"), dict):
        records.write_json(records.outcome_path(run_dir, rank), {**ending["outcome"], "remote": True})
    if isinstance(ending.get("ledger"), dict):
        records.write_json(records.ledger_path(run_dir, rank), {**ending["ledger"], "remote": True})
