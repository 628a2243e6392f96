"""How a rank's ending reaches the other nodes' reports: through the job's key-value store.

Each node's parent (or rank 0 under an outside launcher) reports from its own run directory, which
holds only its node's ranks. So every rank, when its script ends, puts its ending (the outcome
record, the tail of its ledger, its probe record, and the preflight's report where it made it) in
the job's store, and a rank that failed copies the endings
of the ranks on other nodes it finds there into its run directory (`rank-N.json`, `ledger-N.json`,
as if they were local): node 0's report then names a cause that happened on node 3.

The last rank of the job to end, and rank 0 (which waits a bounded moment for the others, see
`wait_for_job`), copy every other node's ending: the verdict "pass" needs every rank's ending, and
a rank still running on another node keeps the report "running". A rank that failed also names the
ranks of its node whose process is gone without an ending (SIGKILL, the OOM killer): it puts a
"gone" ending for each in the store, so the other nodes' reports name them too.

The store is the launcher's (torchrun's agent store at MASTER_ADDR:MASTER_PORT, which outlives the
ranks and the script's own process group), reached through a new client connection with a short
timeout, so this works after destroy_process_group and never waits on the user's group. Every
step is bounded (STORE_BOUND in all); nothing here is a collective.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ddp_doctor.report.redact import redact_obj
from ddp_doctor.time_limit import call_with_time_limit
from ddp_doctor.training import records

STORE_BOUND = 4.0  # seconds, at most, for one rank's whole exchange at its ending
# a failed rank waits longer for the other nodes' endings: the rank that saw a peer of its node
# vanish (the cause, under a SIGKILL) publishes only once its own collective failed, a loaded
# host's seconds later
FAILED_BOUND = 10.0
LEDGER_TAIL = 300  # ledger entries carried through the store per rank (the newest)
MAX_FETCH = 256  # other ranks' endings a rank copies (failed ones first)
MAX_PROBE = 1 << 20  # bytes: a probe (or preflight) record larger than this is not carried through the store
JOB_END_WAIT = 60.0  # seconds rank 0, ended well, waits for every rank of the job to end
JOB_END_WAIT_ENV = "DDP_DOCTOR_JOB_END_WAIT"  # overrides JOB_END_WAIT (seconds)


def _prefix(env: Any) -> str:
    run = env.get("TORCHELASTIC_RUN_ID") or "job"
    restart = env.get("TORCHELASTIC_RESTART_COUNT") or "0"
    return f"ddp_doctor/endings/{run}/{restart}"


def _connect(env: Any, timeout: float) -> Any:
    from ddp_doctor.processes.tcp_store import connect_store
    host, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not host or not port:
        return None
    return connect_store(host, int(port), hosting=False, timeout=timeout)


def ending_of(run_dir: str, rank: int) -> dict[str, Any]:
    """This rank's outcome, the newest entries of its ledger and its probe record, as left in its
    run directory (called by the rank's own process: its probe record is probe-<its pid>)."""
    outcome = records.read_outcomes(run_dir).get(rank)
    ledger = records.read_ledgers(run_dir).get(rank)
    if ledger is not None:
        ledger = {**ledger, "entries": (ledger.get("entries") or [])[-LEDGER_TAIL:]}
    probe = _small_json(records.probe_path(run_dir, os.getpid()))
    # the preflight's report, where this rank made it (its findings and figures: every node's
    # verdict then keeps them, and compares the nodes' arrivals on the clocks it measured)
    preflight = _small_json(records.preflight_record_path(run_dir, rank))
    # redacted as the rank views are (preflight_ranks/rank_view.py): the store has no authentication
    # and other nodes keep a copy in their run directory
    return redact_obj({"rank": rank, "host": os.uname().nodename, "outcome": outcome, "ledger": ledger,
                       "probe": probe, **({"preflight": preflight} if preflight is not None else {})})


def _small_json(path: str) -> dict[str, Any] | None:
    """The JSON object in `path` when it is at most MAX_PROBE bytes, else None."""
    try:
        if os.path.getsize(path) <= MAX_PROBE:
            with open(path, encoding="utf-8") as f:
                value = json.load(f)
                return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        pass
    return None


@dataclass
class JobEndings:
    """What the store said of the job's endings at one moment."""
    world: int = 0
    ended: dict[int, str] = field(default_factory=dict)  # rank -> "ok", "failed" or "gone"
    copied: list[int] = field(default_factory=list)  # other nodes' ranks copied into the run directory

    @property
    def complete(self) -> bool:
        """Every rank of the job has an ending (its own, or a peer's word that it is gone)."""
        return self.world > 0 and set(range(self.world)) <= set(self.ended)

    def running(self) -> list[int]:
        return [r for r in range(self.world) if r not in self.ended]


_MARKS = {"!": "failed", "~": "gone"}


def _listed(store: Any, prefix: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for item in store.get(f"{prefix}/ended").decode().split(","):
        item = item.strip()
        kind = _MARKS.get(item[-1:], "ok")
        num = item.rstrip("!~")
        if num.isdigit() and out.get(int(num)) in (None, "gone"):  # a rank's own ending wins
            out[int(num)] = kind
    return out


def _world(env: Any) -> int:
    try:
        return max(0, int(env.get("WORLD_SIZE") or 0))
    except ValueError:
        return 0


def exchange(run_dir: str, rank: int, *, failed: bool, gone: dict[int, dict[str, Any]] | None = None,
             env: Any = None) -> JobEndings:
    """Put this rank's ending in the store (and a "gone" ending for each rank of `gone`: ranks of
    this node whose process ended without one); when it failed, or it is the last rank of the job
    to end, copy the other nodes' endings into `run_dir`. Bounded by STORE_BOUND (FAILED_BOUND for
    a failed rank, which waits for the others' endings); never raises (an empty JobEndings when the
    store cannot be reached)."""
    env = os.environ if env is None else env
    bound = FAILED_BOUND if failed else STORE_BOUND
    out = call_with_time_limit(lambda: _exchange(run_dir, rank, failed, gone or {}, env, bound), bound,
                               name="ddp-doctor-endings")
    return out.value if out.finished and out.error is None and out.value is not None else JobEndings()


def _exchange(run_dir: str, rank: int, failed: bool, gone: dict[int, dict[str, Any]], env: Any,
              bound: float = STORE_BOUND) -> JobEndings:
    deadline = time.monotonic() + bound - 0.5
    store = _connect(env, STORE_BOUND / 2)
    if store is None:
        return JobEndings()
    prefix = _prefix(env)
    store.set(f"{prefix}/{rank}", json.dumps(ending_of(run_dir, rank), default=str))
    store.append(f"{prefix}/ended", f"{rank}{'!' if failed else ''},")
    for r, hb in sorted(gone.items()):
        if not store.check([f"{prefix}/{r}"]):  # its own ending, if it left one, wins
            store.set(f"{prefix}/{r}", json.dumps(redact_obj(
                {"rank": r, "host": os.uname().nodename, "gone": {**hb, "seen_by": rank}}), default=str))
        store.append(f"{prefix}/ended", f"{r}~,")
    job = _look(store, prefix, JobEndings(world=_world(env)))
    if not failed and not job.complete:
        return job
    # Peers that failed at about the same time (or saw a rank of their node vanish) publish a
    # moment later: a failed rank copies what is there, then waits on the store's side until the
    # job's last ending is in (the rank that puts it says so in one key) or its bound, and copies
    # the rest: no rereading of a list that grows with the world while it waits.
    _copy_what_is_listed(store, prefix, run_dir, job, deadline)
    if not job.complete and failed:
        _await_all(store, prefix, deadline - 1.0)  # a second left to copy what came late
        try:
            _look(store, prefix, job)
        except (RuntimeError, OSError, ValueError):  # one slow answer: the first look's list stands
            pass
        _copy_what_is_listed(store, prefix, run_dir, job, deadline)
    return job


def _look(store: Any, prefix: str, job: JobEndings) -> JobEndings:
    """`job` with the endings the store lists now; when every rank has one, says so in one key
    (`{prefix}/all`) that the ranks waiting for the job's end wait for on the store's side. Each
    rank looks after putting its own ending, so the rank whose ending completes the job sees it."""
    job.ended = _listed(store, prefix)
    if job.complete:
        store.set(f"{prefix}/all", "1")
    return job


def _await_all(store: Any, prefix: str, deadline: float) -> None:
    """Wait on the store's side, until `deadline`, for the job's last ending; never raises."""
    from ddp_doctor.processes.tcp_store import wait_keys
    try:
        wait_keys(store, [f"{prefix}/all"], "the job's last ending", deadline)
    except Exception:  # noqa: BLE001 - a slow or gone store: what is listed then is what is known
        pass


def _copy_what_is_listed(store: Any, prefix: str, run_dir: str, job: JobEndings, deadline: float) -> None:
    """_copy, where one slow or malformed answer leaves the rest to the next copy (or uncopied)."""
    try:
        _copy(store, prefix, run_dir, job, deadline)
    except (RuntimeError, OSError, ValueError):
        pass


def _copy(store: Any, prefix: str, run_dir: str, job: JobEndings, deadline: float) -> None:
    """The endings listed in `job` of ranks that left no record here (other nodes'), failed and
    gone ones first, into `run_dir`."""
    local = set(records.read_outcomes(run_dir)) | set(records.read_heartbeats(run_dir))
    order = sorted(job.ended, key=lambda r: (job.ended[r] == "ok", r))
    for r in order[:MAX_FETCH]:
        if r in local or r in job.copied or time.monotonic() > deadline:
            continue
        _keep(run_dir, r, json.loads(store.get(f"{prefix}/{r}")))
        job.copied.append(r)


def job_end_wait(env: Any = None) -> float:
    env = os.environ if env is None else env
    try:
        return min(max(0.0, float(env.get(JOB_END_WAIT_ENV) or JOB_END_WAIT)), 3600.0)
    except ValueError:
        return JOB_END_WAIT


def wait_for_job(run_dir: str, job: JobEndings, bound: float, env: Any = None) -> JobEndings:
    """Rank 0 ended well and the job had not: wait up to `bound` seconds for every rank's ending
    (on the store's side: the rank whose ending completes the job says so in one key), then copy
    the other nodes' endings here. Never raises; the store gone (node 0's launcher ended) ends the
    wait with what was seen."""
    env = os.environ if env is None else env
    if job.world <= 0:
        return job
    out = call_with_time_limit(lambda: _wait_for_job(run_dir, job, bound, env), bound + STORE_BOUND,
                               name="ddp-doctor-job-end")
    return out.value if out.finished and out.error is None and out.value is not None else job


def _wait_for_job(run_dir: str, job: JobEndings, bound: float, env: Any) -> JobEndings:
    store = _connect(env, STORE_BOUND / 2)
    if store is None:
        return job
    prefix = _prefix(env)
    _await_all(store, prefix, time.monotonic() + bound)
    _look(store, prefix, job)
    if job.complete:
        _copy(store, prefix, run_dir, job, time.monotonic() + STORE_BOUND)
    return job


def _keep(run_dir: str, rank: int, ending: dict[str, Any]) -> None:
    """Another node's ending, written where this node's report reads its own ranks' records."""
    if isinstance(ending.get("outcome"), dict):
        records.write_json(records.outcome_path(run_dir, rank), {**ending["outcome"], "remote": True})
    if isinstance(ending.get("ledger"), dict):
        records.write_json(records.ledger_path(run_dir, rank), {**ending["ledger"], "remote": True})
    if isinstance(ending.get("probe"), dict):  # the name share_across_nodes gives it: one copy
        records.write_json(records.remote_probe_path(run_dir, rank), ending["probe"])
    if isinstance(ending.get("preflight"), dict):
        records.write_json(records.preflight_record_path(run_dir, rank), ending["preflight"])
    if isinstance(ending.get("gone"), dict):
        records.write_json(records.gone_path(run_dir, rank), {**ending["gone"], "rank": rank, "remote": True})


def remote_gone(run_dir: str) -> dict[int, dict[str, Any]]:
    """Ranks of other nodes whose process ended without an ending, as a peer on their node saw
    (their last heartbeat, with `seen_by`)."""
    from ddp_doctor.processes.launch_dir import read_by_rank
    return read_by_rank(records.glob_pattern(run_dir, records.GONE_FILE))


# ---------------------------------------------------------------- a hang, across nodes
#
# A hang leaves every rank blocked, so no rank reaches an ending to put in the store. When a node's
# parent finds its ranks hung, each of them (its watchdog thread) puts its hang ending (ledger,
# where it is, its stack) under `hang/RANK`, and raises `hang/asked`. The ranks of the other nodes
# are stalled too (waiting for the blocked one, or blocked themselves); a rank's watchdog, from the
# rank's first stall on, waits for `hang/asked` on the store's side and answers with its own hang
# ending while the rank is stalled. Each rank that
# answers copies the other nodes' hang endings into its run directory (bounded), so every node's
# report lines up every rank's ledger and names the rank on another node, with its line.

HANG_SHARE_WAIT = 6.0  # seconds a rank waits for the other nodes' hang endings
HANG_LOOK_AFTER = 3.0  # a rank stalled this long starts watching for another node's hang
HANG_WATCH_S = 300.0  # one wait of the watch on the store's side (then it waits again)
HANG_WATCH_RETRY_S = (2.0, 60.0)  # s: the pause after a failed connection or wait, doubled up to the last


class HangExchange:
    """One rank's side of a hang across nodes; a store client kept between looks. Never raises;
    every store operation is bounded."""

    def __init__(self, run_dir: str, rank: int, env: Any = None):
        self.run_dir, self.rank = run_dir, rank
        self.env = os.environ if env is None else env
        self._store: Any = None
        self._watch: threading.Thread | None = None
        self._hang_found = threading.Event()
        self.done = False
        self.last_error: str | None = None  # the last store call that failed while sharing

    def _client(self) -> Any:
        if self._store is None:
            self._store = _connect(self.env, 1.0)
        return self._store

    def asked(self, now: float) -> bool:
        """Whether another node found a hang. The first call (this rank's first stall) starts a
        watch that waits for it on the store's side: one request for as long as the job runs, not
        a look every few seconds by every stalled rank of the job, each in a thread of its own."""
        if self._watch is None:
            self._watch = threading.Thread(target=self._watch_for_hang, name="ddp-doctor-hang-watch", daemon=True)
            self._watch.start()
        return self._hang_found.is_set()

    def _watch_for_hang(self) -> None:
        """Wait for `hang/asked` on a client of its own (a wait holds its connection); a wait that
        ends at its bound is made again, a failed one after a pause that doubles. Never raises."""
        from datetime import timedelta
        key = f"{_prefix(self.env)}/hang/asked"
        store, pause = None, HANG_WATCH_RETRY_S[0]
        while not self.done:
            started = time.monotonic()
            try:
                store = store or _connect(self.env, 1.0)
                if store is None:  # no MASTER_ADDR/MASTER_PORT: no store to meet at
                    return
                store.wait([key], timedelta(seconds=HANG_WATCH_S))
                self._hang_found.set()
                return
            except Exception:  # noqa: BLE001 - its bound (wait again), or a store gone or unreachable
                if time.monotonic() - started >= HANG_WATCH_S - 1.0:
                    continue
                store = None
                time.sleep(pause)  # not a poll: a pause before the next connection
                pause = min(2 * pause, HANG_WATCH_RETRY_S[1])

    def share(self, where: str | None, stack: str) -> list[int]:
        """Put this rank's hang ending in the store and ask the other nodes; copy theirs here.
        Returns the ranks copied; writes `hang-shared-RANK.json` when done (the parent waits for it)."""
        self.done = True
        out = call_with_time_limit(lambda: self._share(where, stack), HANG_SHARE_WAIT + 3.0,
                                   name="ddp-doctor-hang-share")
        copied = list(out.value or []) if out.finished and out.error is None else []
        if not copied and self.last_error:
            sys.stderr.write(f"ddp-doctor: rank {self.rank} could not read the other nodes' ranks from the job's "
                             f"store at the hang ({self.last_error}): this node's report names its own ranks only\n")
        records.write_json(records.hang_shared_path(self.run_dir, self.rank), {"time": time.time(), "copied": copied})
        return copied

    def _share(self, where: str | None, stack: str) -> list[int]:
        """Post this rank's ending, then copy the other nodes' once they are there, or those there
        when HANG_SHARE_WAIT passed: the store answers a wait for their keys when they all exist
        (one request, not a look every moment by every rank of the job). A failed connection or
        store call (a loaded host, the store's own 1 s bound) is tried again within that bound:
        one slow answer must not leave this node's report without the other nodes' ranks."""
        from datetime import timedelta
        prefix = f"{_prefix(self.env)}/hang"
        ending = ending_of(self.run_dir, self.rank)
        ending.update(redact_obj({"where": where, "stack": stack[-20000:]}))
        posted = json.dumps(ending, default=str)
        local = set(records.read_heartbeats(self.run_dir))
        try:
            world = int(self.env.get("WORLD_SIZE") or 0)
        except ValueError:
            world = 0
        wanted = [r for r in range(min(world, MAX_FETCH)) if r not in local]
        copied: list[int] = []
        told = False
        deadline = time.monotonic() + HANG_SHARE_WAIT
        while True:
            try:
                store = self._client()
                if store is None:  # no MASTER_ADDR/MASTER_PORT: no store to meet at
                    return copied
                if not told:
                    store.set(f"{prefix}/{self.rank}", posted)
                    store.set(f"{prefix}/asked", "1")
                    told = True
                left = [r for r in wanted if r not in copied]
                keys = [f"{prefix}/{r}" for r in left]
                remaining = deadline - time.monotonic()
                if keys and remaining > 0:
                    try:
                        store.wait(keys, timedelta(seconds=remaining))
                        there = left
                    except RuntimeError as e:  # the bound passed (torch says so in several ways): those there
                        if time.monotonic() < deadline - 0.1:
                            raise OSError(f"the store's wait failed early: {e}") from e
                        there = [r for r, k in zip(left, keys) if store.check([k])]
                    texts = store.multi_get([f"{prefix}/{r}" for r in there]) if there else []
                    for r, text in zip(there, texts):
                        d = json.loads(text)
                        _keep(self.run_dir, r, d)
                        if d.get("stack"):
                            with records.open_private(records.stack_path(self.run_dir, r)) as f:
                                f.write(str(d["stack"]))
                        copied.append(r)
            except (RuntimeError, OSError, ValueError) as e:  # StoreTimeout is an OSError
                self._store = None  # a new connection on the next try
                self.last_error = f"{type(e).__name__}: {e}"
                if time.monotonic() + 0.2 < deadline:
                    time.sleep(0.2)  # not a poll: a pause before the next connection
                    continue
            if set(wanted) <= set(copied) or time.monotonic() >= deadline:
                return copied


def wait_shared(run_dir: str, ranks: list[int], since: float, bound: float) -> None:
    """Wait (at most `bound` seconds) until each of `ranks` has shared its hang across nodes."""
    deadline = time.time() + bound
    while time.time() < deadline:
        done = 0
        for r in ranks:
            try:
                done += os.path.getmtime(records.hang_shared_path(run_dir, r)) >= since
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
