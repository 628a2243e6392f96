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


# ---------------------------------------------------------------- a hang, across nodes
#
# A hang leaves every rank blocked, so no rank reaches an ending to put in the store. When a node's
# parent finds its ranks hung, each of them (its watchdog thread) puts its hang ending (ledger,
# where it is, its stack) under `hang/RANK`, and raises `hang/asked`. The ranks of the other nodes
# are stalled too (waiting for the blocked one, or blocked themselves); a stalled rank's watchdog
# looks at `hang/asked` every few seconds and answers with its own hang ending. Each rank that
# answers copies the other nodes' hang endings into its run directory (bounded), so every node's
# report lines up every rank's ledger and names the rank on another node, with its line.

HANG_SHARE_WAIT = 6.0  # seconds a rank waits for the other nodes' hang endings
HANG_LOOK_AFTER = 3.0  # a rank stalled this long starts looking for another node's hang
HANG_LOOK_EVERY = 2.0  # seconds between two looks


def multi_node(env: Any = None) -> bool:
    """More ranks in the job than on this node: other nodes exist."""
    env = os.environ if env is None else env
    try:
        return int(env.get("WORLD_SIZE") or 1) > int(env.get("LOCAL_WORLD_SIZE") or env.get("WORLD_SIZE") or 1)
    except ValueError:
        return False


def shared_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"hang-shared-{rank}.json")


class HangExchange:
    """One rank's side of a hang across nodes; a store client kept between looks. Never raises;
    every store operation is bounded."""

    def __init__(self, run_dir: str, rank: int, env: Any = None):
        self.run_dir, self.rank = run_dir, rank
        self.env = os.environ if env is None else env
        self._store: Any = None
        self._last_look = 0.0
        self.done = False

    def _client(self) -> Any:
        if self._store is None:
            self._store = _connect(self.env, 1.0)
        return self._store

    def asked(self, now: float) -> bool:
        """Whether another node found a hang (looked at most every HANG_LOOK_EVERY seconds)."""
        if now - self._last_look < HANG_LOOK_EVERY:
            return False
        self._last_look = now
        out = call_with_time_limit(lambda: bool(self._client().check([f"{_prefix(self.env)}/hang/asked"])),
                                   2.0, name="ddp-doctor-hang-look")
        if not (out.finished and out.error is None):
            self._store = None  # a new connection next time
            return False
        return bool(out.value)

    def share(self, where: str | None, stack: str) -> list[int]:
        """Put this rank's hang ending in the store and ask the other nodes; copy theirs here.
        Returns the ranks copied; writes `hang-shared-RANK.json` when done (the parent waits for it)."""
        self.done = True
        out = call_with_time_limit(lambda: self._share(where, stack), HANG_SHARE_WAIT + 3.0,
                                   name="ddp-doctor-hang-share")
        copied = list(out.value or []) if out.finished and out.error is None else []
        records.write_json(shared_path(self.run_dir, self.rank), {"time": time.time(), "copied": copied})
        return copied

    def _share(self, where: str | None, stack: str) -> list[int]:
        store = self._client()
        if store is None:
            return []
        prefix = f"{_prefix(self.env)}/hang"
        ending = ending_of(self.run_dir, self.rank)
        ending.update(redact_obj({"where": where, "stack": stack[-20000:]}))
        store.set(f"{prefix}/{self.rank}", json.dumps(ending, default=str))
        store.append(f"{prefix}/hung", f"{self.rank},")
        store.set(f"{prefix}/asked", "1")
        local = set(records.read_heartbeats(self.run_dir))
        try:
            world = int(self.env.get("WORLD_SIZE") or 0)
        except ValueError:
            world = 0
        wanted = {r for r in range(min(world, MAX_FETCH)) if r not in local}
        copied: list[int] = []
        deadline = time.monotonic() + HANG_SHARE_WAIT
        while True:
            listed = {int(x) for x in store.get(f"{prefix}/hung").decode().split(",") if x.strip().isdigit()}
            for r in sorted((listed & wanted) - set(copied)):
                d = json.loads(store.get(f"{prefix}/{r}"))
                _keep(self.run_dir, r, d)
                if d.get("stack"):
                    with records.open_private(records.stack_path(self.run_dir, r)) as f:
                        f.write(str(d["stack"]))
                copied.append(r)
            if wanted <= set(copied) or time.monotonic() >= deadline:
                return copied
            time.sleep(0.2)


def wait_shared(run_dir: str, ranks: list[int], since: float, bound: float) -> None:
    """Wait (at most `bound` seconds) until each of `ranks` has shared its hang across nodes."""
    deadline = time.time() + bound
    while time.time() < deadline:
        done = 0
        for r in ranks:
            try:
                done += os.path.getmtime(shared_path(run_dir, r)) >= since
            except OSError:
                pass
        if done >= len(ranks):
            return
        time.sleep(0.1)


def remote_hung(run_dir: str) -> dict[int, dict[str, Any]]:
    """The other nodes' ranks copied here at a hang, as heartbeat-like records (where each was)."""
    return {r: {"where": d.get("where"), "steps": d.get("steps"), "remote": True,
                "in_collective": any(isinstance(e, dict) and not e.get("retired", True)
                                     for e in d.get("entries") or ())}
            for r, d in records.read_ledgers(run_dir).items() if d.get("remote")}
