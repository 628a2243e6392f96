"""What a rank that crashed inside a collective had issued, inferred from its crash dump and its
peers' ledgers.

A rank killed by a native abort (gloo's "Received data size doesn't match ... collective
mismatch?", NCCL's watchdog, a failed assertion) writes no ledger: its process is gone before any
Python code runs. What it leaves is faulthandler's dump, which shows a thread inside a
torch.distributed collective (or a DDP model's backward) called from the user's line. Its peers'
ledgers say the rest: every collective a peer saw complete had every rank in it, the crashed rank
included, so the crashed rank had issued the same calls up to the first one a peer still waits in
(or failed in), and the one it crashed inside is that call number. The inferred ledger is judged
with the others (checks/collectives.py): the crash is then one more rank's position, never
"no Python frame was recorded".
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.checks.collectives import entries_of, group_of, is_pending, op_of, seq_of, site_of
from ddp_doctor.facts.frames import collective_of_frame, is_library_file, thread_in_collective

INFERRED = "crash_dump"  # an entry's or a ledger's `inferred` / `source`: not recorded, inferred


def _op_named(op: str) -> str:
    """The flight recorder's name of the collective a crashed thread was inside ("backward": DDP's
    gradient all_reduce)."""
    return "all_reduce" if op == "backward" else op


def crash_site(dump: str) -> dict[str, Any] | None:
    """Where a crashed rank was, from faulthandler's dump: {"op": the collective it was inside
    ("backward": a DDP model's gradient all_reduce), "site": the user's "file:line" that called it
    (None if no frame of the user's), "function": that frame's function, "callers": the next lines
    of the user's code around it, innermost first}; None when no thread was inside a collective."""
    found = thread_in_collective(dump)
    if found is None:
        return None
    thread, op, index = found
    users = [(file, line, func) for file, line, func in thread.frames[index + 1:] if not is_library_file(file)]
    # every collective the thread was inside (all_gather_object calls all_gather): the one noted
    ops = [o for o in (collective_of_frame(f, fn) for f, _, fn in thread.frames) if o]
    if not users:
        return {"op": op, "site": None, "function": None, "callers": [], "ops": ops}
    return {"op": op, "site": f"{users[0][0]}:{users[0][1]}", "function": users[0][2],
            "callers": [f"{file}:{line}" for file, line, _ in users[1:4]], "ops": ops}


def crash_ledgers(crashes: dict[int, tuple[str, float]], ledgers: dict[int, dict[str, Any]],
                  last_calls: dict[int, dict[str, Any]] | None = None) -> dict[int, dict[str, Any]]:
    """rank -> a ledger inferred for each rank that crashed inside a collective and left none,
    from its dump and the ledgers of the ranks that left one; {} when nothing can be inferred
    (no crash inside a collective, no peer's ledger). `last_calls`: rank -> the newest Python-level
    call it kept through the crash: when it is the call the dump shows, its tensors are known."""
    peers = {int(r): led for r, led in ledgers.items() if entries_of(led)}
    if not peers:
        return {}
    out: dict[int, dict[str, Any]] = {}
    for rank, (dump, when) in sorted(crashes.items()):
        if rank in ledgers or not isinstance(dump, str):
            continue
        site = crash_site(dump)
        if site is None:
            continue
        note = (last_calls or {}).get(rank)
        inferred = _infer(rank, site, peers, when, note if isinstance(note, dict) and note.get("op") in site["ops"]
                          else None)
        if inferred is not None:
            out[rank] = inferred
    return out


def _infer(rank: int, site: dict[str, Any], peers: dict[int, dict[str, Any]], when: float,
           note: dict[str, Any] | None) -> dict[str, Any] | None:
    per_group: dict[str, dict[int, dict[int, dict[str, Any]]]] = {}
    names: dict[str, str] = {}
    for r, led in peers.items():
        for e in entries_of(led):
            seq = seq_of(e)
            if seq is None or e.get("is_p2p"):
                continue
            pg, name = group_of(e)
            names.setdefault(pg, name)
            per_group.setdefault(pg, {}).setdefault(r, {})[seq] = e
    if not per_group:
        return None
    # The group a peer waits (or failed) in; the default group when none does.
    waited = sorted(pg for pg, calls in per_group.items()
                    if any(is_pending(e) for c in calls.values() for e in c.values()))
    pg = "0" if "0" in waited or not waited and "0" in per_group else (waited or sorted(per_group))[0]
    calls = per_group[pg]
    # The call the crashed rank was inside: the first one a peer still waits in or failed in (it
    # saw every earlier one complete, with the crashed rank in it), else one past the last a peer
    # issued (the peers ended; the crashed rank went on alone).
    # A peer that ended had its part of it: a native abort (gloo's on a size mismatch) comes from
    # data a peer sent, so a peer that waits in nothing took part in the crashed rank's call, its
    # latest of the same operation and line.
    ends = []
    for c in calls.values():
        opened = [s for s, e in c.items() if is_pending(e)]
        same = [s for s, e in c.items() if (op_of(e), site_of(e)) == (_op_named(site["op"]), site["site"])
                or site["op"] == "backward" and op_of(e) == "all_reduce" and site_of(e) is None]
        ends.append(min(opened) if opened else max(same) if same else max(c) + 1)
    n = min(ends)
    entries: list[dict[str, Any]] = []
    for s in range(1, n):
        known = next((c[s] for c in calls.values() if s in c), None)
        if known is not None:
            entries.append({**{k: v for k, v in known.items() if k != "failed_here"}, "retired": True,
                            "inferred": INFERRED})
    at_n = next((c[n] for c in calls.values() if n in c), None)
    model = at_n or (entries[-1] if entries else {})
    backend = str(model.get("profiling_name") or "").partition(":")[0]
    op = _op_named(site["op"])
    created = at_n.get("time_created_ns") if at_n else None
    tensors = note if note is not None and isinstance(note.get("input_sizes"), list) and note["input_sizes"] \
        else {"input_sizes": [], "input_dtypes": []}
    entries.append({
        "collective_seq_id": n, "process_group": [pg, names.get(pg, "")],
        "profiling_name": f"{backend or '?'}:{op}", "input_sizes": tensors["input_sizes"],
        "input_dtypes": tensors.get("input_dtypes") or [],
        "retired": False, "failed_here": True, "is_p2p": False, "inferred": INFERRED,
        "time_created_ns": created if isinstance(created, int) else int(when * 1e9),
        **({"user_site": site["site"]} if site["site"] and site["op"] != "backward" else {}),
        **({"user_callers": site["callers"]} if site["callers"] and site["op"] != "backward" else {}),
        **({"in_backward": True} if site["op"] == "backward" else {}),
    })
    where = f"{site['site']} in {site['function']}" if site["site"] else None
    return {"rank": rank, "source": INFERRED, "position": "failed", "steps": None, "where": where,
            "time": when, "complete": all(bool(led.get("complete")) for led in peers.values()),
            "entries": entries, "inferred_from": sorted(peers)}
