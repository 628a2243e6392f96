"""Each launched process's claim of a rank, put in the job's key-value store when it calls
init_process_group (before the call can block): a rank taken twice by processes on different
nodes (rank=LOCAL_RANK, or node_rank x gpus + local_rank with a wrong node_rank) is seen by the
processes themselves, whose run directories hold only their own node's records.

The store is the launcher's (torchrun's agent store at MASTER_ADDR:MASTER_PORT, which every node
reaches; TORCHELASTIC_USE_AGENT_STORE), reached through a client of its own with a short bound
(processes/tcp_store.py), under keys of the job's run (TORCHELASTIC_RUN_ID and restart): per rank
claimed, `add` a counter (this claim's number n) and `set` the claim under `.../RANK/n`. A claim
n > 1 reads the earlier claims of that rank (one wait, one read) and keeps them in its init
record; the first claim looks for a second claim (a quick request at pauses doubling from
WATCH_STEP_S, in a thread of its own, for as long as init has not returned) and keeps it when it
comes. The init record's
`claims` then holds the other processes' claims (host, pid, the rank they claimed, the launcher's
RANK, their line) and checks/init_arguments.py names DDP867 with both hosts. A few requests per
process at init only, never per step, never a collective; every one bounded. Where no store can
be reached the record says so (`claims.error`): the verdict then cannot tell a duplicate across
nodes.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable

from ddp_doctor.time_limit import call_with_time_limit

CLAIM_BOUND = 3.0  # seconds, at most, the claim holds up init_process_group
CONNECT_S = 1.0  # torch's connect timeout for the claim's client
WATCH_S = 1800.0  # the first claim's wait for a second one (torch's default init timeout)
WATCH_STEP_S = 0.25  # the first pause between two looks for a second claim while init waits (doubling)
WATCH_STEP_MAX_S = 5.0  # the longest pause: about 0.2 requests a second a rank in a long init
MAX_OTHERS = 8  # earlier claims of the same rank read


def _prefix(env: Any) -> str | None:
    run = env.get("TORCHELASTIC_RUN_ID")
    if not run:
        return None
    return f"ddp_doctor/claims/{run}/{env.get('TORCHELASTIC_RESTART_COUNT') or '0'}"


def store_address(env: Any) -> tuple[str, int] | None:
    """Where the job's store is when a torchrun agent hosts it for every node; None otherwise."""
    if str(env.get("TORCHELASTIC_USE_AGENT_STORE") or "").lower() not in ("true", "1"):
        return None
    host, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    try:
        return (str(host), int(str(port))) if host and port else None
    except ValueError:
        return None


def claim_of(rec: dict[str, Any], rank: int) -> dict[str, Any]:
    """What other processes read of this one's call: who (host, pid), the rank claimed, the
    launcher's values, and where and how it passed them (redacted: the store has no authentication)."""
    from ddp_doctor.report.redact import redact_obj
    keys = ("pid", "host", "time", "site", "rank_passed", "world_size_passed", "rank_arg", "world_size_arg",
            "arg_text", "rank_computed", "init_method", "store_given", "env", "launched_rank", "launcher")
    return redact_obj({**{k: rec[k] for k in keys if k in rec}, "rank": rank})


def _connect(addr: tuple[str, int]) -> Any:
    from ddp_doctor.processes.tcp_store import connect_store
    return connect_store(addr[0], addr[1], hosting=False, timeout=CONNECT_S)


class RankClaim:
    """One process's claim (see the module's doc). `update(claims)` is called with the record's
    `claims` whenever they change (the caller rewrites the init record)."""

    def __init__(self, rec: dict[str, Any], rank: int, env: Any, update: Callable[[dict[str, Any]], None]):
        self.rec, self.rank, self.env, self.update = rec, rank, env, update
        self.claims: dict[str, Any] = {"rank": rank}

    def put(self) -> dict[str, Any]:
        """Claim the rank and read the earlier claims of it, within CLAIM_BOUND; never raises."""
        addr, prefix = store_address(self.env), _prefix(self.env)
        if addr is None or prefix is None:
            return {}
        self.claims["store"] = f"{addr[0]}:{addr[1]}"
        out = call_with_time_limit(lambda: self._put(addr, f"{prefix}/{self.rank}"), CLAIM_BOUND,
                                   name="ddp-doctor-rank-claim")
        if not out.finished:
            self.claims["error"] = f"the job's store at {addr[0]}:{addr[1]} did not answer within {CLAIM_BOUND:g} s"
        elif out.error is not None:
            self.claims["error"] = f"{type(out.error).__name__}: {out.error}"[:300]
        return self.claims

    def _put(self, addr: tuple[str, int], key: str) -> None:
        from ddp_doctor.processes.tcp_store import op_bound, read_json_keys, store_call
        store = _connect(addr)
        mine = json.dumps(claim_of(self.rec, self.rank), default=str)
        n = int(store_call(lambda: store.add(f"{key}/count", 1), "add(claim count)", op_bound(1.0)))
        store_call(lambda: store.set(f"{key}/{n}", mine), "set(claim)", op_bound(1.0))
        self.claims["number"] = n
        if n > 1:  # earlier claims of this rank: their sets may be a moment behind their adds
            keys = [f"{key}/{i}" for i in range(max(1, n - MAX_OTHERS), n)]
            got = read_json_keys(store, keys, time.monotonic() + 1.0)
            self.claims["others"] = [v for v in got.values() if isinstance(v, dict)]
        else:
            threading.Thread(target=self._watch, args=(store, f"{key}/2"), name="ddp-doctor-claim-watch",
                             daemon=True).start()

    def _watch(self, store: Any, key: str) -> None:
        """The first claim: look for a second claim of the same rank while init has not returned (a
        quick `check` at pauses doubling up to WATCH_STEP_MAX_S, never a wait held in the store: a
        thread inside a store request when the interpreter exits can abort the process); keep it in
        the record. Never raises."""
        import sys
        deadline = time.monotonic() + WATCH_S
        step = WATCH_STEP_S
        try:
            while not (self.rec.get("done") and self.rec.get("ok")) and time.monotonic() < deadline:
                if sys.is_finalizing():
                    return
                if store.check([key]):
                    break
                time.sleep(step)
                step = min(WATCH_STEP_MAX_S, step * 2)  # thousands of ranks in a long init: few requests
            else:
                return  # init worked (nobody else holds this rank), or the bound passed
            if self.rec.get("done") and self.rec.get("ok"):
                return
            other = json.loads(store.get(key).decode("utf-8"))
        except Exception:  # noqa: BLE001 - the store gone (the job ended) or its bound: nothing to keep
            return
        if isinstance(other, dict):
            self.claims["others"] = [other]
            try:
                self.update(self.claims)
            except Exception:  # noqa: BLE001 - a probe never breaks the job
                pass


def claim_rank(rec: dict[str, Any], update: Callable[[dict[str, Any]], None], env: Any = None) -> dict[str, Any]:
    """The record's `claims` for a process a launcher started (empty when nothing was claimed:
    no agent store, not a launched rank, a store the script built, no rank known at the call)."""
    env = os.environ if env is None else env
    if not rec.get("launched_rank") or rec.get("store_given"):
        return {}
    from ddp_doctor.checks.init_arguments import effective_rank
    rank = effective_rank(rec)
    if rank is None or rank < 0:
        return {}
    return RankClaim(rec, rank, env, update).put()
