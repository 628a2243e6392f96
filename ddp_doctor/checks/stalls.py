"""A job that stopped making progress or was stopped (DDP801, DDP808, DDP809, DDP894): where each
rank was, who kept whom waiting, ranks that wait for each other in point-to-point calls, and the
hang restated once the ledgers name the rank that went its own way. Pure functions over the ranks'
heartbeats and stacks.
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.checks.internal import RANK_LOST, event_finding
from ddp_doctor.facts.frames import dumped_threads, is_library_file
from ddp_doctor.findings import Finding, format_ranks
from ddp_doctor.registry import declare

RANK_HUNG = declare(
    "DDP801", category="training_failure", severity="error", title="Training made no progress",
    doc="""
    What: A rank made no progress (its Python stack did not move and no optimizer step ran) for
    --hang-timeout seconds. The finding names the rank(s) that are not where the others are and
    carries every rank's Python stack; then the job is ended.
    Why: One rank stuck outside a collective (a data-loading stall, a rank-dependent branch, a
    rank that skipped a collective) leaves every other rank blocked in the collective until the
    30-minute default timeout.
    Fix: Look at the odd rank's stack: make every rank call the same collectives in the same order
    (no rank-dependent early exit or extra all_reduce), and bound data loading.
    """, cause_class="unknown")


P2P_CYCLE = declare(
    "DDP894", category="training_failure", severity="error",
    title="Every rank waits in a point-to-point call that no rank answers",
    doc="""
    What: At a hang (no progress for --hang-timeout seconds), every rank's stack is inside a
    blocking torch.distributed.send, or every rank's inside torch.distributed.recv: each rank sends
    to a peer that is itself sending (a send/recv cycle, such as two ranks exchanging tensors that
    both send first), or each waits to receive what no rank sends. Read from the ranks' Python
    stacks, whatever the backend; the hang (DDP801) is then its consequence.
    Why: A blocking send completes only when its peer posts the matching receive, and a receive
    only when its peer sends. When every rank blocks on the same side, none reaches the call that
    would release the others, and the job waits until the process group's timeout (30 minutes by
    default).
    Fix: Order the point-to-point calls so that each send meets a receive: even ranks send first
    and odd ranks receive first (or the reverse), or start both sides at once with dist.isend /
    dist.irecv (dist.batch_isend_irecv) and wait on the requests.
    """)

_P2P = ("send", "recv")
_C10D = "distributed_c10d.py"


def _p2p_call(dump: str) -> str | None:
    """The blocking point-to-point call (send / recv) a rank's thread is inside, from its
    faulthandler dump; None when no thread is in one."""
    for thread in sorted(dumped_threads(dump), key=lambda t: not t.current):
        for file, _line, func in thread.frames:
            if func in _P2P and file.endswith(_C10D) and is_library_file(file):
                return func
    return None


def p2p_cycle(hang: Finding, stacks: dict[int, str]) -> Finding | None:
    """DDP894 when every rank of the hang waits in send, or every rank in recv (their stacks say
    so); the hang is restated as its consequence. None otherwise."""
    where = hang.evidence.get("where") or {}
    ranks = sorted(int(r) for r in where)
    if len(ranks) < 2 or any(r not in stacks for r in ranks):
        return None
    calls = {r: _p2p_call(stacks[r]) for r in ranks}
    kinds = set(calls.values())
    if len(kinds) != 1 or None in kinds:
        return None
    [call] = kinds
    parts = "; ".join(f"rank {r}: {where[str(r)]}" for r in ranks)
    what = ("each sends to a peer that is itself sending (a send/recv cycle), and no rank receives" if call == "send"
            else "each waits to receive what no rank sends")
    cycle = event_finding(
        P2P_CYCLE, f"every rank waits in torch.distributed.{call}: {what}. {parts}", rank=None, ranks=ranks,
        phase="training", evidence={"call": call, "where": {str(r): where[str(r)] for r in ranks}})
    timeout = float(hang.evidence.get("timeout") or 0)
    hang.message = (f"no progress for {timeout:g} s; every rank waits in {call} ({P2P_CYCLE.id}, the root cause). "
                    f"{parts}")
    hang.caused_by = P2P_CYCLE.id
    return cycle


INTERRUPTED = declare(
    "DDP808", category="training_failure", severity="error", title="The job was stopped by a signal",
    doc="""
    What: ddp-doctor's parent received SIGTERM, SIGINT or SIGHUP (a stopped SageMaker training job,
    a spot interruption, a cancelled CI job, Kubernetes ending the pod, Ctrl-C) and stopped the
    ranks. The finding names the signal, its sender when known, and where each rank was then; the
    report's status is "interrupted" and the exit status 128 + the signal number.
    Why: A stopped job is neither a pass nor a failure of the script: what matters is where the
    ranks were (a rank stuck in a collective is the reason many jobs get stopped by hand), which
    the ranks' stacks and ledgers taken before they were ended show.
    Fix: If the stop was expected (a planned stop, a spot reclaim), resume from the last
    checkpoint. If the job was stopped because it looked stuck, read where each rank was and the
    ledger findings next to this one: they name the collective the ranks disagreed on.
    """, cause_class="unknown")


SLOW_RANK = declare(
    "DDP809", category="training_failure", severity="warning", title="Ranks waited long for a slow rank",
    doc="""
    What: During training, some ranks waited in a collective past the hang bound while another
    rank was still working (its stack moving): one rank saving a checkpoint, evaluating or loading
    data while the others waited at a barrier or in the next step's all_reduce. The job went on,
    so it was not a hang; the finding names who waited, how long, and where the working rank was.
    Why: Every rank pays for the slowest one at each collective: the waiting ranks' GPUs sit idle
    for that time, and a wait that grows past the collective timeout (30 minutes by default) kills
    the job.
    Fix: Make the slow work shorter or share it: save checkpoints asynchronously or from every rank
    (torch.distributed.checkpoint), evaluate on every rank over a shard, or raise the process
    group's timeout for that step if the wait is expected.
    """, cause_class="unknown")


def _whereabouts(heartbeats: dict[int, dict[str, Any]]) -> tuple[dict[int, Any], set[int]]:
    where = {r: hb.get("where") or hb.get("innermost") for r, hb in heartbeats.items()}
    return where, {r for r, hb in heartbeats.items() if hb.get("in_collective")}


def interrupted_finding(interrupt: Any, heartbeats: dict[int, dict[str, Any]], stacks: dict[int, str],
                        unplaced: dict[str, Any] | None = None) -> Finding:
    """The job stopped by a signal (DDP808), with where each rank was when it came; `unplaced`: the
    script's output a log gave without naming its ranks ({"lines", "last"}), when no rank is placed."""
    where, in_coll = _whereabouts(heartbeats)
    parts = "; ".join(f"rank {r}: {where[r]}" + (" (in a collective)" if r in in_coll else "")
                      + (f", {int(heartbeats[r].get('steps') or 0)} steps" if "steps" in heartbeats[r] else "")
                      for r in sorted(where))
    if parts:
        said = f". {parts}"
    elif unplaced and unplaced.get("lines"):  # the script ran: its lines name no rank
        said = (f" after the script printed {int(unplaced['lines'])} line(s) (the last: {str(unplaced.get('last'))!r}) "
                f"that name no rank, so where each rank was is not known (torchrun --tee 3 prefixes each "
                f"rank's lines with its rank)")
    else:
        said = " before any rank started its script"
    message = f"stopped by {interrupt.describe()}{said}"
    return event_finding(INTERRUPTED, message, rank=None, ranks=sorted(heartbeats),
                         evidence={**interrupt.to_dict(), "where": {str(r): w for r, w in where.items()},
                                   "stacks": {str(r): s for r, s in stacks.items()}}, phase="training")


def preflight_interrupted_finding(interrupt: Any) -> Finding:
    """The preflight's local launch stopped by a signal (DDP808), dated when the signal came: before
    the ranks it ended went missing."""
    return event_finding(INTERRUPTED, f"stopped by {interrupt.describe()} during the preflight",
                         rank=None, evidence=interrupt.to_dict(), time=interrupt.at)


def lost_to_the_stop(findings: list[Finding], stopped: Finding) -> list[Finding]:
    """The ranks of a stopped preflight launch that left no report (DDP003) were ended by the stop
    (DDP808): consequences of it, not errors of their own (their hint blames a SIGKILL or memory)."""
    for f in findings:
        if f.id == RANK_LOST.id and not f.caused_by:
            f.caused_by = stopped.id
    return findings


def hang_finding(heartbeats: dict[int, dict[str, Any]], stacks: dict[int, str], timeout: float) -> Finding:
    """Name the ranks that are not where the others are: outside a collective while others wait in
    one, or else the minority location."""
    where, in_coll = _whereabouts(heartbeats)
    split = False  # the ranks are in different places with no minority among them
    if in_coll and len(in_coll) < len(heartbeats):
        odd = sorted(set(heartbeats) - in_coll)
    else:
        groups: dict[Any, list[int]] = {}
        for r in sorted(where):
            groups.setdefault(where[r], []).append(r)
        fewest = min(map(len, groups.values()), default=0)
        smallest = [g for g in groups.values() if len(g) == fewest]
        # one minority location names its ranks; a tie (two ranks, two places) names no one
        odd = smallest[0] if len(groups) > 1 and len(smallest) == 1 else []
        split = len(groups) > 1 and not odd
    parts = "; ".join(f"rank {r}: {where[r]}" + (" (in a collective)" if r in in_coll else "")
                      for r in sorted(where))
    if odd:
        head = f"no progress for {timeout:g} s; rank(s) {', '.join(map(str, odd))} not where the others are"
    else:
        head = f"no progress on any rank for {timeout:g} s" + ("; the ranks are in different places" if split else "")
    return event_finding(RANK_HUNG, f"{head}. {parts}", rank=None, ranks=odd or sorted(heartbeats),
                       evidence={"where": {str(r): w for r, w in where.items()},
                                 "in_collective": sorted(in_coll), "timeout": timeout,
                                 "stacks": {str(r): s for r, s in stacks.items()}},
                       phase="training")


def hang_explained(hang: Finding, cause: Finding) -> Finding:
    """The hang restated from the ledger's verdict: the ranks it names are the ones whose path
    diverged (never a rank that only waited for them); where each rank was stays."""
    where = hang.evidence.get("where") or {}
    in_coll = {str(r) for r in hang.evidence.get("in_collective") or ()}
    parts = "; ".join(f"rank {r}: {w}" + (" (in a collective)" if r in in_coll else "")
                      for r, w in sorted(where.items(), key=lambda kv: int(kv[0])))
    undecided = bool(cause.evidence.get("undecided"))
    who = ("the ledgers cannot tell which rank went its own way" if undecided else
           f"{'rank' if len(cause.ranks) == 1 else 'ranks'} {format_ranks(cause.ranks)} went its own way")
    timeout = float(hang.evidence.get("timeout") or 0)
    head = f"no progress for {timeout:g} s" if timeout else "no progress"
    hang.message = f"{head}; {who} ({cause.id}, the root cause)" + (f". {parts}" if parts else "")
    hang.ranks = list(cause.ranks) if not undecided else hang.ranks
    hang.caused_by = cause.id
    return hang


def slow_rank_finding(slow: dict[str, Any]) -> Finding:
    """Ranks that waited in a collective for a rank still at work, past the hang bound but not a
    hang (DDP809): who kept whom waiting, how long, and where the working rank was."""
    working, waiting = list(slow.get("working") or []), list(slow.get("waiting") or [])
    where = slow.get("where") or {}
    at = "; ".join(f"rank {r} at {where.get(str(r))}" for r in working if where.get(str(r)))
    who = f"rank {working[0]}" if len(working) == 1 else f"ranks {format_ranks(working)}"
    them = f"rank {waiting[0]}" if len(waiting) == 1 else f"ranks {format_ranks(waiting)}"
    message = (f"{who} kept {them} waiting in a collective for {float(slow.get('waited') or 0):g} s"
               + (f" ({at})" if at else ""))
    return event_finding(SLOW_RANK, message, rank=None, ranks=working, phase="training",
                         evidence={**slow, "waiting": waiting, "working": working})
