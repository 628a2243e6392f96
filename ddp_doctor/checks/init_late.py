"""A rank late to init_process_group (DDP879): the cause of a peer's store timeout, decided from
what the ranks did, never from the script's text.

A rank whose init_process_group (or any other wait at the store) timed out waited for someone.
Each process's init call is recorded the moment it is made (init-PID.json: its time, its launcher
rank), so at the moment the waiting rank's wait ended (its deadline: when its init raised) every
launched rank either had called init, or had not: no init record, or one made after that
deadline. A rank that had not is the cause, with where it was then: the innermost line of the
user's code in the position record nearest that moment (its ledger, written when the failing rank
asked for it, or its heartbeat, written every second by its watchdog thread), or, if it ended
before the deadline without calling init, that it ended. The waiting ranks' timeouts are its
consequences.

Only on positive evidence: the waiting rank's own init record must exist (the calls were recorded
in this run), and the late rank must have left a record of its own here (a heartbeat, an outcome,
a ledger: a rank of another node whose records never arrived is not judged). A rank that raised
an error of its own is judged by it (checks/rank_endings.py). Every rank that called init in time
leaves the timeout as it was (the ranks did not reach each other: the store timeout's own
finding, DDP835, says so).

A store wait that timed out outside init (a process group made later, `new_group`, whose key
names the rank it waited for) names the awaited rank and where it was, when the evidence shows it.
"""
from __future__ import annotations

import re
from typing import Any

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.findings import Finding, format_ranks
from ddp_doctor.registry import declare

LATE_TO_INIT = declare(
    "DDP879", category="init_order", severity="error",
    title="A rank was late to init_process_group (a peer's init timed out waiting for it)",
    doc="""
    What: A rank's init_process_group timed out waiting at the rendezvous store, and another rank
    had not called init_process_group by then: it was still doing work of its own before init
    (tokenizing its shard, a download, reading files in a loop), or it ended without ever calling
    init. Decided from what the ranks did: each process's init call is recorded with its time,
    and where the late rank was comes from its heartbeat or ledger at the time the wait expired
    (the innermost line of your code). The finding names the late rank and that line; the waiting
    rank's store timeout (DDP835) is marked as its consequence.
    Why: init_process_group waits for every rank of the world, at most its `timeout=` (30 minutes
    by default for gloo, 10 for NCCL); a rank that arrives later than that makes the others fail
    with a bare "wait timeout ... keys: .../1" that names neither the late rank nor what it was
    doing, and its launcher then stops it as if it were the victim.
    Fix: Do the slow per-rank work after init_process_group (then the ranks wait for each other
    in a collective or a barrier, whose timeout you set the same way), or make it shorter; or
    raise init_process_group's `timeout=` (and, under torchrun with a rendezvous backend, its
    rendezvous bound: `--rdzv-conf join_timeout=...`). A rank that ends without init must call it
    too, or the job must not wait for it.
    """, cause_class="unknown")

_KEY = re.compile(r"wait timeout after \d+ ?ms, keys: \[?'?(?P<key>\S*?/)(?P<rank>\d+)'?\]?\s*$", re.M)
_TIMEOUT_MS = re.compile(r"(?:wait timeout|timed out) after (?P<ms>\d+) ?ms")
_STORE_TIMEOUT = "DDP835"
_NEAR = 5.0  # seconds: a position record further than this from the deadline does not say where a rank was then


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _launcher_rank(call: dict[str, Any]) -> int | None:
    r = (call.get("launcher") or {}).get("rank")
    return r if call.get("launched_rank") and isinstance(r, int) and not isinstance(r, bool) else None


def _exception_text(o: dict[str, Any]) -> str:
    exc = o.get("exception") or {}
    return f"{exc.get('message') or ''}\n{exc.get('traceback') or ''}" if isinstance(exc, dict) else ""


def awaited_rank(text: str) -> tuple[int, str] | None:
    """The rank whose key a timed-out store wait still lacked (torch's "wait timeout after 8000ms,
    keys: /default_pg/0//cpu//0/1": rank 1's), with the key's prefix; None when it names none."""
    m = _KEY.search(text)
    return (int(m["rank"]), m["key"]) if m else None


def _deadline(o: dict[str, Any], call: dict[str, Any] | None) -> float | None:
    """When the rank's wait ended: its init call's end (it failed), else its exception's time, else
    its outcome's."""
    if call is not None and call.get("done") and not call.get("ok") and _float(call.get("ended")):
        return _float(call.get("ended"))
    exc = o.get("exception") or {}
    return _float(exc.get("time") if isinstance(exc, dict) else None) or _float(o.get("time"))


def where_then(rank: int, at: float, ledgers: dict[int, dict[str, Any]],
                heartbeats: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """Where `rank` was at `at`: the position record (ledger or heartbeat) with a user's line that is
    nearest that moment, within _NEAR seconds. {"where", "time", "source"}, or None."""
    found: list[dict[str, Any]] = []
    for source, rec in (("ledger", ledgers.get(rank)), ("heartbeat", heartbeats.get(rank))):
        if not isinstance(rec, dict):
            continue
        where, t = rec.get("where"), _float(rec.get("time"))
        if where and t is not None and abs(t - at) <= _NEAR and not rec.get("in_collective"):
            found.append({"where": str(where), "time": t, "source": source})
    return min(found, key=lambda p: abs(p["time"] - at)) if found else None


def _here(rank: int, outcome: dict[str, Any], heartbeats: dict[int, dict[str, Any]], hosts: set[Any]) -> bool:
    """Whether `rank` ran where the waiting ranks' init records were written: a heartbeat of its own
    in this run directory (heartbeats are never copied from other nodes), or an outcome of their
    host. Only then does the lack of an init record of it say that it had not called init."""
    return rank in heartbeats or bool(outcome and outcome.get("host") and outcome.get("host") in hosts)


def _seconds(t: float, at: float) -> str:
    d = t - at
    return f"{abs(d):.1f} s {'after' if d >= 0 else 'before'}"


def late_init_verdict(findings: list[Finding], *, ranks: list[int], outcomes: dict[int, dict[str, Any]],
                      init_calls: list[dict[str, Any]], ledgers: dict[int, dict[str, Any]],
                      heartbeats: dict[int, dict[str, Any]]) -> list[Finding]:
    """`findings` plus DDP879 for the ranks that had not called init_process_group when a rank's
    init timed out waiting (see the module's doc); the waiting ranks' timeouts become its
    consequences. A store timeout outside init names the rank it waited for, where it was known."""
    first_call: dict[int, dict[str, Any]] = {}
    for c in sorted(init_calls, key=lambda c: _float(c.get("time")) or 0.0):
        r = _launcher_rank(c)
        if r is not None:
            first_call.setdefault(r, c)
    timeouts = [f for f in findings if f.id == _STORE_TIMEOUT and f.phase == "training" and f.severity == "error"
                and f.caused_by is None and len(f.ranks) == 1 and f.ranks[0] in outcomes]
    waiting: dict[int, dict[str, Any]] = {}
    for f in timeouts:
        r = f.ranks[0]
        call = first_call.get(r)
        text = _exception_text(outcomes[r])
        deadline = _deadline(outcomes[r], call)
        if deadline is None:
            continue
        in_init = call is not None and call.get("done") and not call.get("ok")
        awaited = awaited_rank(text)
        ms = _TIMEOUT_MS.search(text)
        waiting[r] = {"finding": f, "deadline": deadline, "in_init": bool(in_init), "site": (call or {}).get("site"),
                      "awaited": awaited[0] if awaited else None, "key": awaited[1] if awaited else None,
                      "timeout_s": int(ms["ms"]) / 1000 if ms else None,
                      "called": _float((call or {}).get("time"))}
    in_init = {r: w for r, w in waiting.items() if w["in_init"]}
    found: list[Finding] = []
    if in_init:
        cause = _late_finding(in_init, ranks, outcomes, first_call, ledgers, heartbeats, set(waiting))
        if cause is not None:
            found.append(cause)
            for r in in_init:
                if str(r) in cause.evidence["waiting"]:
                    in_init[r]["finding"].caused_by = cause.id
    for r, w in sorted(waiting.items()):
        if w["finding"].caused_by is None and not w["in_init"]:
            _name_awaited(w, r, ranks, ledgers, heartbeats)
    return findings + found


def _late_finding(waiting: dict[int, dict[str, Any]], ranks: list[int], outcomes: dict[int, dict[str, Any]],
                  first_call: dict[int, dict[str, Any]], ledgers: dict[int, dict[str, Any]],
                  heartbeats: dict[int, dict[str, Any]], all_waiting: set[int]) -> Finding | None:
    deadline = min(w["deadline"] for w in waiting.values())
    hosts = {(outcomes.get(r) or {}).get("host") for r in waiting} - {None}
    late: dict[int, dict[str, Any]] = {}
    for k in sorted(set(ranks) - all_waiting):
        o = outcomes.get(k) or {}
        if o.get("exception"):
            continue  # its own error is its verdict (rank_endings)
        if not _here(k, o, heartbeats, hosts):
            continue  # no record that it ran on the waiting ranks' host (another node's rank): not judged
        call = first_call.get(k)
        called = _float((call or {}).get("time"))
        if called is not None and called <= deadline:
            continue  # it had called init in time
        ended = _float(o.get("time")) if o.get("exit_code") is not None and not o.get("interrupted") else None
        entry: dict[str, Any] = {"init_called": called, "init_site": (call or {}).get("site")}
        if ended is not None and ended <= deadline and called is None:
            entry.update(ended=ended, exit_code=o.get("exit_code"))
        else:
            entry.update(where_then(k, deadline, ledgers, heartbeats) or {})
        late[k] = entry
    if not late:
        return None
    waiters = sorted(waiting)
    w0 = waiting[waiters[0]]
    who_waits = f"rank {waiters[0]}" if len(waiters) == 1 else f"ranks {format_ranks(waiters)}"
    site = f" (at {w0['site']})" if w0.get("site") else ""
    bound = f" after {w0['timeout_s']:g} s, its timeout" if w0.get("timeout_s") else ""
    parts = []
    for k, e in sorted(late.items()):
        if "ended" in e:
            parts.append(f"rank {k} ended (exit status {e['exit_code']}) without calling init_process_group while "
                         f"{who_waits} waited for it in init{site}; the wait timed out{bound}, "
                         f"{deadline - e['ended']:.1f} s after rank {k} ended")
            continue
        head = (f"rank {k} had not called init_process_group when {who_waits}'s init{site} gave up waiting for it"
                f"{bound}")
        if e.get("init_called") is not None:
            head += f" (it called it {_seconds(e['init_called'], deadline)} the wait ended)"
        if e.get("where"):
            head += (f": rank {k} was at {e['where']} (its {e['source']}, {_seconds(e['time'], deadline)} the wait "
                     f"ended), its own work before init")
        else:
            head += f": where rank {k} was then is not known (no heartbeat or ledger of it near that time)"
        parts.append(head)
    ended_only = all("ended" in e for e in late.values())
    hint = ("Make every rank call init_process_group: a rank that returns or exits before init (a rank-"
            "conditional return, sys.exit on one rank) leaves the others waiting until init's timeout."
            if ended_only else
            "Do the slow per-rank work (tokenizing a shard, a download, reading files) after "
            "init_process_group, or make it shorter; or raise init_process_group's timeout= (and, under "
            "torchrun with a rendezvous backend, its rendezvous bound: --rdzv-conf join_timeout=...).")
    late_ranks = sorted(late)
    return event_finding(
        LATE_TO_INIT, "; ".join(parts), rank=None, ranks=late_ranks, hint=hint, phase="training",
        time=min((w["called"] or w["deadline"]) for w in waiting.values()),
        evidence={"late": {str(k): e for k, e in sorted(late.items())},
                  "waiting": {str(r): {k: v for k, v in w.items() if k not in ("finding", "in_init")}
                              for r, w in sorted(waiting.items())},
                  "deadline": deadline, "source": "init_process_group records, heartbeats, ledgers"})


def _name_awaited(w: dict[str, Any], rank: int, ranks: list[int], ledgers: dict[int, dict[str, Any]],
                  heartbeats: dict[int, dict[str, Any]]) -> None:
    """A store wait outside init that timed out on a key torch made for a process group (its
    "//" device part) of a launched rank: the finding names that rank and, when known, where it was."""
    k, key = w.get("awaited"), w.get("key") or ""
    f = w["finding"]
    if k is None or k == rank or k not in ranks or "//" not in key or "awaited_rank" in f.evidence:
        return
    pos = where_then(k, w["deadline"], ledgers, heartbeats)
    f.message += f"; it waited for rank {k}" + (
        f", which was at {pos['where']} (its {pos['source']}, {_seconds(pos['time'], w['deadline'])} the wait ended)"
        if pos else "")
    f.evidence["awaited_rank"] = k
    if pos:
        f.evidence["awaited_where"] = pos
