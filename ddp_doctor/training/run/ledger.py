"""Each rank's ledger of collectives, from torch's flight recorder, left in the run directory.

torch (2.5 on, gloo and NCCL alike in 2.13) records every collective a process group issues, DDP's
own included, in a bounded ring buffer (TORCH_FR_BUFFER_SIZE entries). `ddp-doctor run` turns it
on for its ranks, and each rank dumps it into ledger-RANK.json at the endings it lives through:

- "finished" / "destroyed": the script ended normally (with / without the default group gone);
- "failed": the script raised;
- "hung": the parent saw no progress and asked for ledgers (its watchdog thread dumps it, since
  the main thread is blocked inside a collective).

Bounded cost: the dump is a copy of the whole buffer into JSON (up to the buffer's entries), so it
runs only at these endings, never per step; the recording itself is torch's, a fixed-size ring.
The comparison of the ledgers across ranks is not made here (checks/collectives.py).
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from ddp_doctor.checks.signatures import classify
from ddp_doctor.facts.frames import COLLECTIVE_FILES, is_user_file
from ddp_doctor.facts.own_env import set_own
from ddp_doctor.training import records
from ddp_doctor.training.probes import collective_sites

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
OLD_BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"  # torch before the flight recorder covered gloo
DEFAULT_BUFFER = "2000"  # entries: bounded memory per rank


def recorder_env(env: Any, run_dir: str | None = None) -> None:
    """Turn the flight recorder on in the ranks' environment, unless the user chose a size; with
    `run_dir`, NCCL also dumps it there when a collective times out (training/run/nccl_dumps.py).
    Never overrides a value the user set, and marks each value it sets as ddp-doctor's own
    (facts/own_env.py: the run directory is per node, so these are never compared across nodes as
    user settings). `env`: a dict, or os.environ itself (a rank under an outside launcher, before
    its first process group)."""
    if BUFFER_ENV not in env and OLD_BUFFER_ENV not in env:
        set_own(env, BUFFER_ENV, DEFAULT_BUFFER)
        from ddp_doctor.training.run.nccl_dumps import torch_before
        if torch_before(2, 8):  # older torch reads only the NCCL-era name (newer warns it is deprecated)
            set_own(env, OLD_BUFFER_ENV, DEFAULT_BUFFER)
    if run_dir:
        from ddp_doctor.training.run.nccl_dumps import aids_env, dump_env
        dump_env(env, run_dir)
        aids_env(env, run_dir)


def dump() -> dict[str, Any] | None:
    """The flight recorder's dump (entries and pg_config), or None where torch has none."""
    try:
        import torch
        c10d = torch._C._distributed_c10d
        if not hasattr(c10d, "_dump_fr_trace_json"):
            return None
        data = json.loads(c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False))
    except Exception:  # noqa: BLE001 - an old or changed torch: no ledger, never a broken job
        return None
    if not isinstance(data, dict):
        return None
    _add_nccl_entries(data, c10d)
    return data


def _add_nccl_entries(data: dict[str, Any], c10d: Any) -> None:
    """CUDA builds keep NCCL's collectives in a flight recorder of their own: add its entries
    (none when the job made no NCCL group). Not run on a GPU here: guarded, never raises."""
    if not hasattr(c10d, "_dump_nccl_trace_json"):
        return
    try:
        nccl = json.loads(c10d._dump_nccl_trace_json(includeCollectives=True, onlyActive=False))
    except Exception:  # noqa: BLE001 - an old or changed torch: no NCCL entries, never a broken job
        return
    if not isinstance(nccl, dict) or not nccl.get("entries"):
        return
    entries = list(data.get("entries") or [])
    seen = {_identity(e) for e in entries if isinstance(e, dict)}  # one recorder for both: no twice
    entries += [e for e in nccl["entries"] if isinstance(e, dict) and _identity(e) not in seen]
    data["entries"] = entries
    if isinstance(nccl.get("pg_config"), dict):
        data["pg_config"] = {**nccl["pg_config"], **(data.get("pg_config") or {})}


def _identity(entry: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(str(entry.get(k)) for k in ("record_id", "pg_id", "collective_seq_id", "time_created_ns",
                                             "profiling_name"))


def default_group_is_up() -> bool:
    try:
        import torch.distributed as dist
        return bool(dist.is_available() and dist.is_initialized())
    except Exception:  # noqa: BLE001 - a torch that cannot say: no group, never a broken job
        return False


def write(run_dir: str, rank: int, position: str, *, since_ns: int = 0, steps: int | None = None,
          where: str | None = None, failed_in_collective: bool = False,
          samples: dict[str, Any] | None = None, host_load: dict[str, Any] | None = None) -> bool:
    """Dump the flight recorder into ledger-RANK.json; True if a ledger was written. Entries
    created before `since_ns` (the preflight's own process group, whose entries the buffer
    keeps) are left out. Entries the script issued from Python get its call site (`user_site`).
    `failed_in_collective`: the rank's exception came out of a collective, its newest one, or it
    was inside it when stopped (torch marks a failed collective retired: `failed_here` says it did
    not complete). `samples`: where the rank's main thread was, sampled outside collectives
    (the watchdog's {"total": n, "where": {location: count}}): where a rank that arrives last spends
    its time (checks/arrivals.py). The host's name goes with it: clocks compare within a host.
    `host_load`: how busy the host was while the rank trained (facts/host_load.LoadWindow.to_dict):
    a rank arriving last on a busy host is said with that doubt."""
    try:
        data = dump() or collective_sites.fallback_dump()  # torch without a flight recorder: Python calls
        if data is None:
            return False
        everything = [e for e in data.get("entries") or [] if isinstance(e, dict)]
        if not everything and not default_group_is_up():
            # no collective, no group: the process may be the parent of the ranks (a Ray Train
            # driver, mp.spawn's parent), whose rank number is one of theirs; an empty ledger says nothing
            return False
        # nothing lost when the ring buffer never wrapped: its first record is still there
        complete = any(e.get("record_id") == 0 for e in everything)
        entries = [e for e in everything if int(e.get("time_created_ns") or 0) >= since_ns]
        if data.get("source") != "python_calls":
            collective_sites.annotate(entries)
        if failed_in_collective and entries:
            max(entries, key=lambda e: int(e.get("time_created_ns") or 0))["failed_here"] = True
        records.write_ledger(run_dir, rank, {
            "source": data.get("source") or "flight_recorder", "position": position, "steps": steps, "where": where,
            "since_ns": since_ns, "complete": complete, "entries": entries,
            "pg_config": data.get("pg_config") or {}, "host": os.uname().nodename,
            **({"samples": samples} if samples else {}), **({"host_load": host_load} if host_load else {}),
            **_data_pass()})
        return True
    except Exception:  # noqa: BLE001 - a ledger that cannot be made must not break the user's job
        return False


def _data_pass() -> dict[str, Any]:
    """{"data_pass": {"loader", "batches", "ended", "length"}}: this rank's latest pass over a
    DataLoader (probes/recorder.py), or {} when none was recorded."""
    from ddp_doctor.training.probes.recorder import current_recorder
    rec = current_recorder()
    passing = list(rec.current_pass) if rec is not None and rec.current_pass else None
    if passing is None:
        return {}
    lid, batches, ended, length = passing
    return {"data_pass": {"loader": lid, "batches": batches, "ended": bool(ended), "length": length}}


def requested(run_dir: str, since: float = 0.0) -> bool:
    """Whether a ledger was asked for at `since` or later (an older request is another job's)."""
    try:
        with open(records.ledger_request_path(run_dir), encoding="utf-8") as f:
            return float(json.load(f).get("time") or 0) >= since
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def request(run_dir: str, reason: str = "hang") -> None:
    """Ask every live rank's watchdog for its ledger: the parent on a hang ("hang"), a rank that
    failed before it exits ("peer failed": the launcher is about to stop the others)."""
    records.write_json(records.ledger_request_path(run_dir), {"time": time.time(), "reason": reason})


def request_reason(run_dir: str) -> str | None:
    try:
        with open(records.ledger_request_path(run_dir), encoding="utf-8") as f:
            return str(json.load(f).get("reason") or "hang")
    except (OSError, ValueError, AttributeError):
        return None


def live_ranks(run_dir: str, but: int, since: float = 0.0) -> list[int]:
    """Ranks of this job still in their script (a heartbeat of this job in training, no outcome, a
    live process), counting records written at `since` or later."""
    ended = records.read_outcomes(run_dir, since)
    return sorted(r for r, hb in _training_beats(run_dir, since).items()
                  if r != but and r not in ended and not process_gone(hb.get("pid")))


def unanswered_ranks(run_dir: str, since: float = 0.0) -> list[int]:
    """Ranks of this job whose process lives and that wrote no ledger at `since` or later: the
    ones to ask before the launcher stops them (a rank that wrote its ending may not have written
    its ledger yet)."""
    written = {r for r, d in records.read_ledgers(run_dir).items() if float(d.get("time") or 0) >= since}
    return sorted(r for r, hb in _training_beats(run_dir, since).items()
                  if r not in written and not process_gone(hb.get("pid")))


def vanished_ranks(run_dir: str, but: int, since: float = 0.0, settle: float = 0.0) -> dict[int, dict[str, Any]]:
    """Ranks of this job whose process is gone without an ending: a heartbeat of this job in
    training, no outcome, and no live process with its pid (SIGKILL leaves nothing else). Their
    last heartbeats. Another job's heartbeat never makes a rank "gone" (a false DDP803).

    `settle`: seconds, at most, to wait for a peer still alive without an ending to end or vanish.
    A process SIGKILLed closes its sockets (its peers' collectives fail at once) before the kernel
    marks it a zombie: a peer that failed a moment later may still see it alive."""
    deadline = time.monotonic() + settle
    while True:
        ended = records.read_outcomes(run_dir, since)
        pending = {r: hb for r, hb in _training_beats(run_dir, since).items() if r != but and r not in ended}
        gone = {r: hb for r, hb in pending.items() if process_gone(hb.get("pid"))}
        if len(gone) == len(pending) or time.monotonic() >= deadline:
            return gone
        time.sleep(0.05)


VANISH_SETTLE = 2.0  # seconds a failed rank gives a peer of its node to end or vanish (vanished_ranks)


def _training_beats(run_dir: str, since: float) -> dict[int, dict[str, Any]]:
    # a rank's heartbeat names its job from the start of training on (records.join_job)
    return {r: hb for r, hb in records.read_heartbeats(run_dir, since).items()
            if hb.get("phase") == "training" and records.names_this_job(hb)}


def process_gone(pid: Any) -> bool:
    """No live process has this pid (none at all, or a zombie its parent has not reaped yet).
    False when it cannot be told."""
    import psutil
    try:
        return psutil.Process(int(pid)).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, ValueError, TypeError):
        return False


def from_exception(exc: dict[str, Any] | None) -> tuple[bool, str | None]:
    """(raised inside a collective, the innermost user frame) of an exception record."""
    if not exc:
        return False, None
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', str(exc.get("traceback") or ""))
    sig = classify(f"{exc.get('type')}: {exc.get('message')}")
    in_collective = (any(os.path.basename(f) in COLLECTIVE_FILES for f, _, _ in frames)
                     or (sig is not None and sig.collective))  # errors only a collective raises
    user = [f for f in frames if is_user_file(f[0])]
    where = f"{user[-1][0]}:{user[-1][1]} in {user[-1][2]}" if user else None
    return in_collective, where


def wait_for(run_dir: str, ranks: list[int], since: float, bound: float) -> dict[int, dict[str, Any]]:
    """The ledgers of `ranks` written at `since` or later, waiting at most `bound` seconds."""
    deadline = time.time() + bound
    while True:
        got = {r: d for r, d in records.read_ledgers(run_dir).items() if float(d.get("time", 0)) >= since}
        if set(ranks) <= set(got) or time.time() >= deadline:
            return got
        time.sleep(0.1)
