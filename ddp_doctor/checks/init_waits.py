"""What the ranks' own init_process_group errors say about init's arguments, where no record of
the call exists (a job that ran without ddp-doctor, read after the fact by `ddp-doctor analyze`):
the same findings as init's records give live (DDP867, DDP868), judged from what each process
waited for when the store's timeout ended its init.

Each process joining a group writes its own key to the rendezvous store and waits for every
other rank's, in rank order; when the group's timeout ends the wait, torch names the key it still
lacked ("wait timeout after 8000ms, keys: /default_pg/0//cpu//0/2": rank 2's), or, when the
store itself waits for its clients, how many joined of how many it expects ("2/4 clients
joined"). Against the ranks the launcher started (0 to N-1):
- a wait for rank N or above, or a store expecting more than N clients: init was given a larger
  world than the processes launched (DDP868);
- the process the launcher started as rank R waiting for rank R's own key: it joined as another
  rank, so rank R is never filled (DDP867: two processes took one rank).
The store's timeout on those ranks (DDP835) is then their consequence.
"""
from __future__ import annotations

import re
from typing import Any

from ddp_doctor.checks.init_arguments import DUPLICATE_RANK, WORLD_SIZE_DIFFERS
from ddp_doctor.checks.internal import event_finding
from ddp_doctor.checks.wrapped_errors import is_library_frame
from ddp_doctor.facts.frames import not_user_code_dirs
from ddp_doctor.findings import Finding, format_ranks

_KEY = re.compile(r"wait timeout after \d+ ?ms, keys: \[?'?(?P<key>\S*?/)(?P<rank>\d+)'?\]?\s*$", re.M)
_CLIENTS = re.compile(r"waiting for clients\. (?P<joined>\d+)/(?P<expected>\d+) clients joined")
_CALL = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[^\n]+)\n'
                   r'(?P<code>[^\n]*\binit_process_group\s*\([^\n]*)$', re.M)


def _in_init(exc: dict[str, Any]) -> bool:
    return "init_process_group" in str(exc.get("traceback") or "")


def _site(exc: dict[str, Any]) -> str | None:
    """The user's line that called init_process_group (the outermost such call in the traceback)."""
    dirs = tuple(not_user_code_dirs())
    for m in _CALL.finditer(str(exc.get("traceback") or "")):
        if not is_library_frame(m["file"], dirs):
            return f"{m['file']}:{m['line']}"
    return None


def _waits(outcomes: dict[int, dict[str, Any]]) -> tuple[dict[int, int], dict[int, tuple[int, int]], dict[int, str]]:
    """(rank -> the rank whose key it waited for, rank -> (joined, expected) clients, rank -> its
    init line), over the ranks whose init ended in the store's timeout."""
    keys: dict[int, int] = {}
    clients: dict[int, tuple[int, int]] = {}
    sites: dict[int, str] = {}
    for r, o in outcomes.items():
        exc = o.get("exception") or {}
        if not exc or not _in_init(exc):
            continue
        text = f"{exc.get('message') or ''}\n{exc.get('traceback') or ''}"
        key = _KEY.search(text)
        joined = _CLIENTS.search(text)
        if key is not None:
            keys[r] = int(key["rank"])
        elif joined is not None:
            clients[r] = (int(joined["joined"]), int(joined["expected"]))
        else:
            continue
        site = _site(exc)
        if site:
            sites[r] = site
    return keys, clients, sites


def _at(sites: dict[int, str], ranks: list[int]) -> str:
    found = sorted({sites[r] for r in ranks if r in sites})
    return f" at {found[0]}" if len(found) == 1 else ""


def init_wait_findings(outcomes: dict[int, dict[str, Any]], launched: list[int], *,
                       launched_known: str = "") -> list[Finding]:
    """DDP868 / DDP867 from the store waits that ended the ranks' init (see the module's doc);
    `launched`: the ranks the launcher started, known as `launched_known` says ("stated" by the
    launcher or the platform; "one node": every rank's output of one node, so another node's
    ranks may be missing, which the finding says; "": not known, and a larger world is not
    judged). Nothing when the waits do not decide."""
    world = len(launched)
    if not world or sorted(launched) != list(range(world)):
        return []  # the launcher's ranks are not all known: what is "above" them is not either
    keys, clients, sites = _waits(outcomes)
    time = min((float(outcomes[r].get("time") or 0) for r in {*keys, *clients}), default=0.0)
    found: list[Finding] = []
    beyond = sorted(r for r, k in keys.items() if k >= world)
    larger = sorted(r for r, (_, expected) in clients.items() if expected > world)
    if (beyond or larger) and launched_known:
        ranks = sorted({*beyond, *larger})
        awaited = sorted({keys[r] for r in beyond})
        said = []
        if awaited:
            said.append(f"waited for rank {', '.join(map(str, awaited))} to join")
        if larger:
            joined, expected = clients[larger[0]]
            said.append(f"waited for {expected} processes ({joined} joined)")
        found.append(event_finding(
            WORLD_SIZE_DIFFERS, f"ranks {format_ranks(ranks)} {' and '.join(said)} in init_process_group"
            f"{_at(sites, ranks)}, but the launcher started {world} (ranks {format_ranks(launched)}): init was "
            f"given a larger world (world_size= passed, or WORLD_SIZE changed by the script)"
            + ("" if launched_known == "stated" else "; the artifacts hold one node's ranks: if the job "
               "had more nodes, their ranks never joined instead, and their output says why"),
            rank=None, ranks=ranks, phase="training", time=time,
            evidence={"launcher_world_size": world, "awaited_ranks": awaited,
                      **({"clients": dict(zip(("joined", "expected"), clients[larger[0]]))} if larger else {}),
                      "launched_known": launched_known, "source": "the ranks' store timeouts"}))
        return found
    unfilled = sorted({k for k in keys.values() if keys.get(k) == k})
    if unfilled:
        ranks = sorted(r for r, k in keys.items() if k in unfilled)
        r0 = unfilled[0]
        found.append(event_finding(
            DUPLICATE_RANK, f"ranks {format_ranks(ranks)} waited in init_process_group{_at(sites, ranks)} for "
            f"rank {r0} to join, and the process the launcher started as rank {r0} waited for it too: it "
            f"joined as another rank (rank= passed by hand, or RANK changed by the script), so two processes "
            f"took one rank and rank {r0} is never filled",
            rank=None, ranks=ranks, phase="training", time=time,
            evidence={"unfilled_ranks": unfilled, "awaited": {str(r): k for r, k in sorted(keys.items())},
                      "source": "the ranks' store timeouts"}))
    return found


def init_wait_verdict(findings: list[Finding], outcomes: dict[int, dict[str, Any]],
                      launched: list[int], *, launched_known: str = "") -> list[Finding]:
    """`findings` plus init_wait_findings; the ranks' own timeout errors it explains become its
    consequences."""
    found = init_wait_findings(outcomes, launched, launched_known=launched_known)
    for cause in found:
        for f in findings:
            if f.phase == "training" and f.severity == "error" and f.ranks and set(f.ranks) <= set(cause.ranks):
                f.caused_by = cause.id
    if not found:
        _name_the_awaited(findings, outcomes, launched)
    return findings + found


def _name_the_awaited(findings: list[Finding], outcomes: dict[int, dict[str, Any]], launched: list[int]) -> None:
    """The waits do not decide: a rank's init timed out waiting for a launched rank that left no
    wait of its own (it started late, failed before init, or its launcher stopped it before its
    own wait ended: torchrun stops the others at the first exit). Its timeout finding then says
    which rank it waited for, and that where that rank was is not known from the waits."""
    keys, clients, _ = _waits(outcomes)
    for f in findings:
        r = f.ranks[0] if f.ranks and len(f.ranks) == 1 else None
        k = keys.get(r) if r is not None else None
        if f.id != "DDP835" or k is None or k == r or k not in launched or k in keys or k in clients:
            continue
        f.message += (f"; it waited for rank {k} to join (the key init_process_group still lacked), and rank "
                      f"{k}'s own init left no wait to read: whether it started late, failed before its init, "
                      f"or was stopped before its own wait ended is not known from these waits")
        f.evidence["awaited_rank"] = k
