"""The collective ledger (DDP890-DDP899): every rank's record of the collectives it issued, lined up.

Each rank's ledger is a dict (the `ledger-RANK.json` the collector writes from torch's flight
recorder): {"rank", "pid", "time", "source", "position", "steps", "where", "entries": [...]}, where
`entries` are flight recorder entries as torch dumps them (`collective_seq_id`, `profiling_name`,
`input_sizes`, `input_dtypes`, `process_group`, `retired`, ...). :func:`ledger_findings` is a pure
function of those ledgers: per process group it lines the ranks up by collective sequence number
and reports the first place where they disagree. It decides from what the ranks did (ops, sizes,
sequence numbers, where each rank was), never from a script's text, and says nothing about a rank
whose ledger is empty or missing.
"""
from __future__ import annotations

import os
from typing import Any

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.facts.frames import is_library_file
from ddp_doctor.findings import Finding, format_ranks
from ddp_doctor.registry import declare

COLLECTIVE_MISMATCH = declare(
    "DDP890", category="training_failure", severity="error", title="Ranks issued different collectives",
    doc="""
    What: At the same call number of a process group, the ranks issued different collectives (a
    different operation, or tensors of different sizes or dtypes), as torch's flight recorder
    logged them on each rank. The finding names the call number, what each rank issued and where.
    Why: Collectives are matched by order, not by name: when rank 0's 12th call is an all_reduce of
    3 floats and rank 1's is one of 4 floats (or a broadcast), the ranks exchange the wrong data,
    fail with a size error, or block until the collective timeout. Every later call is shifted too.
    Fix: Make every rank issue the same collectives in the same order with the same shapes and
    dtypes: no rank-dependent collective (an extra all_reduce for logging on rank 0 only, a metric
    reduced on some ranks), and tensors whose shape does not depend on the rank's data (pad, or
    all_gather the sizes first) and whose dtype is the same on every rank (cast before the call).
    """)

RANK_ELSEWHERE = declare(
    "DDP891", category="training_failure", severity="error",
    title="Ranks wait in a collective that another rank never issued",
    doc="""
    What: Some ranks issued a collective and wait in it, while the rank(s) named never issued it:
    they are still running elsewhere in the script (the finding says where, from their stack).
    The named ranks are the cause; the waiting ranks are a consequence.
    Why: A collective completes only when every rank of its process group enters it. A rank that
    skipped it (a rank-dependent branch or early `continue`), or that is busy elsewhere (saving a
    checkpoint, evaluating, stuck in data loading), leaves the others blocked until the collective
    timeout (30 minutes by default), and the job looks hung.
    Fix: Look at where the named rank is: make every rank reach the same collectives (no collective
    inside `if rank == 0:`; a checkpoint save or evaluation on one rank must issue no collective,
    and the others should meet it at a barrier afterwards only if it will get there), and bound
    slow work such as data loading.
    """)

UNEVEN_INPUTS = declare(
    "DDP892", category="training_failure", severity="error",
    title="A rank left the training loop while others wait (uneven inputs)",
    doc="""
    What: A rank finished its training loop (or destroyed its process group) while the other ranks
    still wait in a collective it never issued, typically the gradient all_reduce of one more
    step; or its DataLoader pass ended with fewer batches than the others' and the collective
    after its loop (a barrier, an evaluation's reduce) met their next step's. The finding gives
    the steps each rank ran and the batches each drew where they were recorded.
    Why: DDP synchronises gradients on every backward: when ranks get different numbers of batches
    (a dataset not split evenly, a sampler without drop_last, an iterable dataset), the rank with
    fewer batches leaves the loop and the others block in their extra step until the timeout.
    Fix: Give every rank the same number of batches: DistributedSampler(drop_last=True) or a
    dataset length divisible by the world size, or wrap the loop in
    torch.distributed.algorithms.Join([model]) so that ranks that run out shadow the others.
    """)

NONE_ISSUED_HINT = ("The rank named issued no collective at all before its script ended: it left before the "
                    "first one (a rank-dependent early `return`, `sys.exit()` or `continue` past the loop, such as a "
                    "check of its own data), which no uneven split of batches explains. Make every rank reach the "
                    "same collectives: decide an early stop together (all_reduce the condition, then return on "
                    "every rank), or give every rank data enough to run.")

OWN_WAY = declare(
    "DDP893", category="training_failure", severity="error",
    title="A rank issued a collective the other ranks never issue (its code went its own way)",
    doc="""
    What: At one call number of a process group, the rank(s) named issued a collective that no other
    rank has issued in this job (a new line, operation or shape), or issued it out of the order
    every rank had kept until then, while the other ranks issued a collective every rank had issued
    before (the next step's gradient all_reduce, typically) or had ended. The named rank took a
    code path of its own: a collective inside `if rank == 0:` (a barrier after a rank-0 checkpoint
    indented into the block, a metric reduced or `self.log(..., sync_dist=True)` on rank 0 only, an
    evaluation that gathers on rank 0 only), or a loop it left on its own data (a NaN check and
    `break`) before a collective the others never reach. The finding names the rank, the
    collective and its line, and what the others issued instead.
    Why: Collectives are matched by order: the odd rank's call pairs with whatever the others
    issue next, so the ranks exchange the wrong data, fail with a size error, or block until the
    collective timeout (30 minutes by default). The ranks that wait are a consequence: their own
    line is correct.
    Fix: Go to the line named and make every rank reach the same collectives: move a barrier out
    of the `if rank == 0:` block (every rank must call it), reduce metrics on every rank (or use
    `sync_dist=True` on every rank, or `rank_zero_only=True` without syncing), evaluate on every
    rank or under `torch.no_grad()` through `model.module` without collectives, and when one rank
    must stop early (NaN loss), make every rank agree first (all_reduce a stop flag every step).
    """)

# Collectives whose inputs legitimately differ between ranks (scatter's source holds the list,
# all_to_all splits unevenly): only the operation is compared for these.
_UNEVEN_INPUT_OPS = frozenset({"scatter", "all_to_all", "alltoall", "alltoall_base", "all_to_all_single"})
_LEFT_POSITIONS = frozenset({"finished", "destroyed"})
_EVENT_BACKENDS = ("nccl:", "ncclx:", "xccl:")  # their recorder's `state` comes from device events


# ------------------------------------------------------------------------------------ reading

def op_of(entry: dict[str, Any]) -> str:
    name = str(entry.get("profiling_name") or "?")
    return name.rsplit(":", 1)[-1]


def _signature(entry: dict[str, Any]) -> tuple[Any, ...]:
    op = op_of(entry)
    if op in _UNEVEN_INPUT_OPS:
        return (op,)
    sizes = tuple(tuple(s) if isinstance(s, (list, tuple)) else (s,) for s in entry.get("input_sizes") or ())
    dtypes = tuple(str(d) for d in entry.get("input_dtypes") or ())
    return (op, sizes, dtypes)


def _tensors(entry: dict[str, Any]) -> str:
    dtypes = list(entry.get("input_dtypes") or ())
    sizes = list(entry.get("input_sizes") or ())
    parts = []
    for i in range(max(len(dtypes), len(sizes))):
        dtype = dtypes[i] if i < len(dtypes) else "?"
        size = sizes[i] if i < len(sizes) else []
        dims = ", ".join(str(d) for d in size) if isinstance(size, (list, tuple)) else str(size)
        parts.append(f"{dtype}[{dims}]")
    return ", ".join(parts)


def site_of(entry: dict[str, Any]) -> str | None:
    """The user's line that issued the collective: the collector's `user_site`, else the innermost
    recorded frame outside the libraries (facts.frames.is_library_file)."""
    site = entry.get("user_site")
    if site:
        return str(site)
    for frame in entry.get("frames") or ():
        if not isinstance(frame, dict):
            continue
        filename = str(frame.get("filename") or "")
        if is_library_file(filename):
            continue
        line = frame.get("line")
        return f"{os.path.basename(filename)}:{line}" if line is not None else os.path.basename(filename)
    return None


def _describe(entry: dict[str, Any]) -> str:
    text = op_of(entry)
    tensors = _tensors(entry) if op_of(entry) not in _UNEVEN_INPUT_OPS else ""
    if tensors:
        text += f" {tensors}"
    if _inferred(entry):  # where a rank crashed: its tensors went with it
        text = (f"{text} in a DDP model's backward (its gradient all_reduce)" if entry.get("in_backward")
                else text) + " (where it crashed)"
    site = site_of(entry)
    return f"{text} at {site}" if site else text


def _inferred(entry: dict[str, Any]) -> bool:
    """A call inferred for a rank that crashed inside it (checks/crash_ledgers.py): its operation
    and line are known, its tensors are not."""
    return entry.get("inferred") == "crash_dump" and not entry.get("input_sizes")


def _signature_among(entry: dict[str, Any], present: dict[int, dict[str, Any]]) -> tuple[Any, ...]:
    """The call's signature for comparing it with the other ranks' at the same call number: a
    call inferred from a crash (tensors unknown) matches a recorded one of the same operation
    and line, and differs from any other."""
    if not _inferred(entry):
        return _signature(entry)
    for other in present.values():
        if not _inferred(other) and _loose_key(other) == _loose_key(entry):
            return _signature(other)
    return (op_of(entry), "crashed", site_of(entry))


def _entry_evidence(entry: dict[str, Any]) -> dict[str, Any]:
    keys = ("collective_seq_id", "profiling_name", "input_sizes", "input_dtypes", "output_sizes",
            "output_dtypes", "state", "retired", "failed_here", "time_created_ns", "record_id", "user_site")
    out = {k: entry[k] for k in keys if k in entry}
    site = site_of(entry)
    if site:
        out["site"] = site
    return out


def group_of(entry: dict[str, Any]) -> tuple[str, str]:
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        return str(pg[0]), str(pg[1]) if len(pg) > 1 else ""
    return str(entry.get("pg_id", "?")), ""


def seq_of(entry: dict[str, Any]) -> int | None:
    try:
        seq = int(entry.get("collective_seq_id"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return seq if seq > 0 else None


def is_pending(entry: dict[str, Any]) -> bool:
    """The rank was inside this collective when its ledger was written: not retired, or the
    collective its exception came out of (`failed_here`: torch retires a failed one). NCCL's
    recorder also knows completion (`state`, from the collective's CUDA events, while the watchdog
    has not yet retired it): an NCCL entry "completed" is not pending even if not retired."""
    if bool(entry.get("failed_here")):
        return True
    if entry.get("retired", True):
        return False
    return not (str(entry.get("profiling_name") or "").startswith(_EVENT_BACKENDS)
                and entry.get("state") == "completed")


def _is_complete(ledger: dict[str, Any]) -> bool:
    """The recorder kept everything from the first record on (its ring buffer never wrapped): the
    collector says so (`complete`, also for a ledger it cut to the script's own calls), or the
    first record is there."""
    if "complete" in ledger:
        return bool(ledger["complete"])
    return any(e.get("record_id") == 0 for e in entries_of(ledger))


class _Rank:
    """One rank's view of one process group: its calls by sequence number."""

    def __init__(self, rank: int, ledger: dict[str, Any], calls: dict[int, dict[str, Any]]):
        self.rank = rank
        self.ledger = ledger
        self.calls = calls
        self.last = max(calls) if calls else 0
        # in this group; a rank whose script ended waits in nothing (the recorder may not have
        # retired its last call yet when the ledger was written: seen with DDP's last bucket)
        self.waiting = ledger.get("position") not in _LEFT_POSITIONS and any(is_pending(e) for e in calls.values())
        dumped = ledger.get("time")
        self.dumped_ns = int(float(dumped) * 1e9) if isinstance(dumped, (int, float)) else None

    def dumped_before(self, entry: dict[str, Any]) -> bool:
        """This rank, still running, wrote its ledger before `entry` (another rank's call) was even
        issued: it may have issued the same call since. (A rank that finished, destroyed its group
        or hung wrote its final record.)"""
        if self.ledger.get("position") not in (None, "running"):
            return False
        created = entry.get("time_created_ns")
        return self.dumped_ns is not None and isinstance(created, int) and 0 < self.dumped_ns < created


def _waiting_elsewhere(ledger: dict[str, Any], pg: str) -> dict[str, Any] | None:
    """The collective of another process group this rank waits in, if any."""
    for e in reversed(entries_of(ledger)):
        if is_pending(e) and not e.get("is_p2p") and group_of(e)[0] != pg and seq_of(e):
            return e
    return None


def entries_of(ledger: dict[str, Any]) -> list[dict[str, Any]]:
    entries = ledger.get("entries")
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


# How far a rank's call at the disagreement strays from what every rank did before it.
ROUTINE, NEW_ORDER, NEW_CALL = 0, 1, 2


def _key(entry: dict[str, Any]) -> tuple[Any, ...]:
    """A call as the ranks' code issues it: operation, tensors and the user's line (none for the
    collectives torch issues itself, such as DDP's gradient all_reduces)."""
    return (_signature(entry), site_of(entry))


def _loose_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    """A call by its operation and line alone: what is known of a call inferred from a crash."""
    return (op_of(entry), site_of(entry))


class _History:
    """What the ranks of one group issued before call #n: every call, and which call followed
    which. A rank's call at #n that no rank ever issued (or never right after the call before it)
    comes from a path of its own; one that every rank has issued is the job's routine."""

    def __init__(self, ranks: list[_Rank], n: int):
        self.keys: set[tuple[Any, ...]] = set()
        self.pairs: set[tuple[tuple[Any, ...], tuple[Any, ...]]] = set()
        for key_of in (_key, _loose_key):  # a call inferred from a crash is known by its loose key
            for r in ranks:
                for s in sorted(r.calls):
                    if s >= n:
                        break
                    key = key_of(r.calls[s])
                    self.keys.add(key)
                    if s - 1 in r.calls:
                        self.pairs.add((key_of(r.calls[s - 1]), key))

    def novelty(self, rank: _Rank, n: int) -> int:
        entry = rank.calls.get(n)
        if entry is None:
            return ROUTINE
        key_of = _loose_key if _inferred(entry) else _key
        key = key_of(entry)
        if key not in self.keys:
            return NEW_CALL
        before = rank.calls.get(n - 1)
        if before is not None and (key_of(before), key) not in self.pairs:
            return NEW_ORDER
        return ROUTINE


# ------------------------------------------------------------------------------------ judging

def ledger_findings(ledgers: dict[int, dict[str, Any]], *, world_size: int | None = None,
                    branches: dict[str, list[dict[str, Any]]] | None = None) -> list[Finding]:
    """Line every rank's ledger up, per process group, by collective sequence number; report the
    first disagreement of each group (DDP890 mismatch, DDP891 a rank elsewhere while others wait,
    DDP892 a rank that left the loop while others wait). Ranks with an empty or missing ledger
    are not judged. `world_size`, when given, bounds the ranks considered. `branches`: the
    rank-conditional branches around each call site of the user's source ("file:line" -> each
    branch's {"line", "condition", "taken_when", "reads"}, innermost first: facts/rank_branches.py)."""
    usable: dict[int, dict[str, Any]] = {}
    for rank, ledger in sorted(ledgers.items(), key=lambda kv: int(kv[0])):
        r = int(rank)
        if world_size is not None and not 0 <= r < world_size:
            continue
        # an empty ledger says something only when nothing was lost: this rank issued no collective
        if isinstance(ledger, dict) and (entries_of(ledger) or ledger.get("complete") is True):
            usable[r] = ledger

    groups: dict[str, str] = {}
    per_group: dict[str, dict[int, dict[int, dict[str, Any]]]] = {}
    for r, ledger in usable.items():
        for e in entries_of(ledger):
            seq = seq_of(e)
            if e.get("is_p2p") or seq is None:
                continue
            pg, name = group_of(e)
            groups.setdefault(pg, name)
            per_group.setdefault(pg, {}).setdefault(r, {})[seq] = e
    # Every rank belongs to the default group: a rank whose whole record is kept and holds no call
    # of it issued none (others may wait for it there).
    if "0" in per_group:
        for r, ledger in usable.items():
            if r not in per_group["0"] and _is_complete(ledger):
                per_group["0"][r] = {}

    findings: list[Finding] = []
    for pg in sorted(per_group, key=lambda p: (not p.isdigit(), int(p) if p.isdigit() else 0, p)):
        ranks = [_Rank(r, usable[r], calls) for r, calls in sorted(per_group[pg].items())]
        if len(ranks) < 2:
            continue
        findings.extend(_align(pg, groups.get(pg, ""), ranks, branches or {}))
    return findings


def _group_label(pg: str, name: str) -> str:
    return f"process group {pg} ({name})" if name and name != "undefined" else f"process group {pg}"


def _align(pg: str, name: str, ranks: list[_Rank], branches: dict[str, list[dict[str, Any]]]) -> list[Finding]:
    label = _group_label(pg, name)
    seqs = sorted({s for r in ranks for s in r.calls})
    for n in seqs:
        present = {r.rank: r.calls[n] for r in ranks if n in r.calls}
        by_sig: dict[tuple[Any, ...], list[int]] = {}
        for rank, entry in present.items():
            by_sig.setdefault(_signature_among(entry, present), []).append(rank)
        if len(by_sig) > 1:
            return [_mismatch(pg, name, label, n, present, by_sig, ranks, branches)]
        waiting = [r for r in ranks if n in r.calls and is_pending(r.calls[n])]
        # Ranks that never issued call n and are not themselves waiting in this group. A rank whose
        # recorder lost its early calls holds later ones (last >= n) and is not judged; nor is one
        # still running whose ledger was written before the others issued call n (it was only
        # earlier in time).
        behind = [r for r in ranks if r.last < n and not r.waiting
                  and not any(r.dumped_before(w.calls[n]) for w in waiting)]
        if waiting and behind:
            return _stuck(pg, name, label, n, waiting, behind, _History(ranks, n))
    return []


def _who(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def _decide(present: dict[int, dict[str, Any]], by_sig: dict[tuple[Any, ...], list[int]],
            history: _History, by_rank: dict[int, _Rank], n: int,
            branches: dict[str, list[dict[str, Any]]]) -> tuple[list[int], str | None]:
    """The ranks whose path diverged at call #n, and the evidence that decided: the ranks whose
    call is new (or out of the order kept so far) while the others' is routine; else the ranks
    whose call sits in a branch of the source that reads the rank while the others' does not;
    else the minority when one variant is held by more ranks than any other; else nobody (None:
    it cannot be told). Before all of these, what the ranks' data did: ranks whose pass over their
    DataLoader had ended while the others' went on, with more batches, ran out first (uneven
    inputs: the call after their loop met the others' next step)."""
    out = _ran_out(present, by_rank)
    if out:
        return out, "data_ran_out"
    level = {rank: history.novelty(by_rank[rank], n) for rank in present}
    if max(level.values()) > min(level.values()):
        top = max(level.values())
        return sorted(r for r, v in level.items() if v == top), ("new_call" if top == NEW_CALL else "new_order")
    in_branch = {rank: bool(_branches_at(e, branches)) for rank, e in present.items()}
    if any(in_branch.values()) and not all(in_branch.values()):
        return sorted(r for r, b in in_branch.items() if b), "rank_branch"
    groups = sorted(by_sig.values(), key=lambda rs: (-len(rs), rs[0]))
    if len(groups[0]) > len(groups[1]):
        return sorted(r for rs in groups[1:] for r in rs), "majority"
    return sorted(present), None


def _steps_text(ranks: list[_Rank]) -> str:
    counts = {r.ledger.get("steps") for r in ranks}
    if len(counts) == 1 and isinstance(next(iter(counts)), int):
        return f" ({next(iter(counts))} steps done on each)"
    if all(isinstance(r.ledger.get("steps"), int) for r in ranks):
        return " (steps done: " + ", ".join(f"rank {r.rank} {r.ledger['steps']}" for r in ranks) + ")"
    return ""


def _data_pass(rank: _Rank) -> dict[str, Any] | None:
    passing = rank.ledger.get("data_pass")
    return passing if isinstance(passing, dict) and isinstance(passing.get("batches"), int) else None


def _ran_out(present: dict[int, dict[str, Any]], by_rank: dict[int, _Rank]) -> list[int]:
    """The ranks whose latest DataLoader pass ended with fewer batches than every other rank drew
    from the same loader (whose pass may have ended too: a loader that fetches one batch ahead,
    as accelerate's does, ends its pass while the last batch is still being trained on); [] when
    the passes do not say so."""
    passes: dict[int, dict[str, Any]] = {}
    for r in present:
        p = _data_pass(by_rank[r])
        if p is None:
            return []
        passes[r] = p
    if len({p.get("loader") for p in passes.values()}) != 1:
        return []
    ended = [r for r, p in passes.items() if p.get("ended")]
    if not ended:
        return []
    fewest = min(passes[r]["batches"] for r in ended)
    odd = [r for r in ended if passes[r]["batches"] == fewest]
    others = [r for r in passes if r not in odd]
    return sorted(odd) if others and all(passes[r]["batches"] > fewest for r in others) else []


def _branches_at(entry: dict[str, Any], branches: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rank-reading branches around the call's line or, when none, around the innermost of its
    callers' lines that has one (a helper that reduces, called under `if rank == 0:`); each branch
    carries the "site" it encloses."""
    callers = entry.get("user_callers")
    for site in [site_of(entry), *(callers if isinstance(callers, list) else [])]:
        found = branches.get(site) if isinstance(site, str) else None
        if isinstance(found, list):
            kept = [{**b, "site": site} for b in found if isinstance(b, dict) and b.get("condition")]
            if kept:
                return kept
    return []


def _in_branch(entry: dict[str, Any], branches: dict[str, list[dict[str, Any]]]) -> str:
    """" in a branch that reads the rank (...)" for a call whose line, or a caller's, sits in one
    (the innermost named), "" otherwise."""
    found = _branches_at(entry, branches)
    if not found:
        return ""
    b = found[0]
    cond = str(b["condition"])
    called = "" if b["site"] == site_of(entry) else f", around the call at {b['site']}"
    if cond.startswith("@"):
        return f" in a function decorated {cond} (line {b.get('line')}{called}), which runs on some ranks only"
    taken = "false" if b.get("taken_when") == "false" else "true"
    return f" in a branch that reads the rank (`{cond}` {taken} there, line {b.get('line')}{called})"


def _mismatch(pg: str, name: str, label: str, n: int, present: dict[int, dict[str, Any]],
              by_sig: dict[tuple[Any, ...], list[int]], ranks: list[_Rank],
              branches: dict[str, list[dict[str, Any]]]) -> Finding:
    by_rank = {r.rank: r for r in ranks}
    odd, decided_by = _decide(present, by_sig, _History(ranks, n), by_rank, n, branches)
    others = sorted(r for r in present if r not in odd)
    evidence: dict[str, Any] = {
        "process_group": {"id": pg, "name": name}, "collective_seq_id": n, "decided_by": decided_by,
        "ranks": {str(rank): {"entry": _entry_evidence(e), **_whereabouts(by_rank[rank].ledger),
                              "odd": rank in odd,
                              **({"consequence": True} if is_pending(e) and (rank not in odd or not others) else {})}
                  for rank, e in sorted(present.items())},
    }
    for rank, e in present.items():
        found = _branches_at(e, branches)
        if found:
            evidence["ranks"][str(rank)]["rank_branches"] = found
    if decided_by == "data_ran_out":
        return _ran_out_finding(label, n, present, odd, others, by_rank, evidence, branches)
    own_path = decided_by in ("new_call", "new_order", "rank_branch") and (
        {(op_of(present[r]), site_of(present[r])) for r in odd}.isdisjoint(
            {(op_of(present[r]), site_of(present[r])) for r in others}))
    if own_path:
        # a collective of its own (another operation or line): the rank's code went its own way
        what = _describe(present[odd[0]])
        if decided_by == "new_call":
            why = "a collective no other rank issued"
        elif decided_by == "rank_branch":
            why = "which the other ranks did not enter"
        else:
            before = by_rank[odd[0]].calls.get(n - 1)
            why = ("out of the order every rank had kept" +
                   (f" (never before right after {_describe(before)})" if before is not None else ""))
        done = "" if decided_by == "rank_branch" else ", as every rank had before"
        message = (f"{_who(odd)} went its own way at call #{n} of {label}: issued {what}"
                   f"{_in_branch(present[odd[0]], branches)}, {why}; "
                   f"{_who(others)} issued {_describe(present[others[0]])}"
                   f"{_in_branch(present[others[0]], branches)}{done}"
                   + _steps_text([by_rank[r] for r in sorted(present)]))
        return event_finding(OWN_WAY, message, rank=None, ranks=odd, evidence=evidence, phase="training")
    parts = []
    for rs in sorted(by_sig.values(), key=lambda rs: rs[0]):
        parts.append(f"{_who(rs)} {_describe(present[rs[0]])}{_in_branch(present[rs[0]], branches)}")
    message = f"collectives differ at call #{n} of {label}: " + ", ".join(parts)
    if decided_by is None:
        sites = {site_of(e) for e in present.values()}
        if len(sites) == 1 and None not in sites:
            message += f"; every rank issued it from the same line with other tensors: {_what_differs(present)}"
        else:
            message += "; which rank went its own way cannot be told from the ledgers (no call was routine)"
        evidence["undecided"] = True
    elif decided_by in ("new_call", "new_order"):
        message += (f"; {_who(odd)} issued tensors no rank had issued there before, "
                    f"{_who(others)} the ones every rank had")
    return event_finding(COLLECTIVE_MISMATCH, message, rank=None, ranks=odd, evidence=evidence,
                         phase="training")


def _what_differs(present: dict[int, dict[str, Any]]) -> str:
    """What differs between the tensors the ranks issued from one line: their shape (it depends on
    each rank's data), their dtype (made or cast by a rule that differs by rank), or both."""
    sigs = [_signature(e) for e in present.values()]
    shapes, dtypes = ({s[i] if len(s) > i else None for s in sigs} for i in (1, 2))
    if len(dtypes) > 1 and len(shapes) <= 1:
        return ("their dtype differs between ranks (each rank made or cast its tensor by a rule that "
                "depends on the rank or its data)")
    if len(dtypes) > 1:
        return "their shape and dtype depend on each rank's data"
    return "their shape depends on each rank's data"


def _ran_out_finding(label: str, n: int, present: dict[int, dict[str, Any]], odd: list[int], others: list[int],
                     by_rank: dict[int, _Rank], evidence: dict[str, Any],
                     branches: dict[str, list[dict[str, Any]]]) -> Finding:
    """Uneven inputs seen at a mismatch: the ranks whose data ran out left their loop, and their
    next collective (a barrier, an evaluation's reduce) met the others' next step."""
    def drawn(ranks: list[int]) -> str:
        counts = sorted({by_rank[r].ledger["data_pass"]["batches"] for r in ranks})
        text = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        return f"{text} batch" if counts == [1] else f"{text} batches"
    evidence["decided_by"] = "data_ran_out"
    evidence["data_pass"] = {str(r): by_rank[r].ledger["data_pass"] for r in sorted(present)}
    message = (f"{_who(odd)} ran out of batches first: {'its' if len(odd) == 1 else 'their'} DataLoader pass "
               f"ended after {drawn(odd)}, while {_who(others)} drew {drawn(others)} and trained on "
               f"({_describe(present[others[0]])}{_in_branch(present[others[0]], branches)}, call #{n} of {label}); "
               f"{_who(odd)} then issued {_describe(present[odd[0]])}{_in_branch(present[odd[0]], branches)}, "
               f"which met it" + _steps_text([by_rank[r] for r in sorted(present)]))
    return event_finding(UNEVEN_INPUTS, message, rank=None, ranks=odd, evidence=evidence, phase="training")


def _whereabouts(ledger: dict[str, Any]) -> dict[str, Any]:
    return {k: ledger[k] for k in ("position", "steps", "where") if ledger.get(k) is not None}


def _stuck(pg: str, name: str, label: str, n: int, waiting: list[_Rank], behind: list[_Rank],
           history: _History) -> list[Finding]:
    entry = waiting[0].calls[n]
    op = op_of(entry)
    wait_ranks = [r.rank for r in waiting]
    who_waits = f"rank {wait_ranks[0]} waits" if len(wait_ranks) == 1 else f"ranks {format_ranks(wait_ranks)} wait"
    site = site_of(entry)
    waits_text = f"{who_waits} in {op} #{n} of {label}" + (f" (issued at {site})" if site else "")
    waiting_evidence = {str(r.rank): {"entry": _entry_evidence(r.calls[n]), **_whereabouts(r.ledger),
                                      "waiting": True, "consequence": True} for r in waiting}

    left = [r for r in behind if r.ledger.get("position") in _LEFT_POSITIONS]
    failed = [r for r in behind if r.ledger.get("position") == "failed"]
    elsewhere = [r for r in behind if r not in left and r not in failed]
    findings: list[Finding] = []
    base = {"process_group": {"id": pg, "name": name}, "collective_seq_id": n}

    if left and not elsewhere and not failed:
        extra = _extra_collective(pg, name, label, n, waiting, left, history, waiting_evidence)
        if extra is not None:
            return [extra]
    if left:
        steps_known = all(isinstance(r.ledger.get("steps"), int) for r in left + waiting)
        descr = []
        for r in left:
            how = "finished" if r.ledger.get("position") == "finished" else "destroyed its process group"
            ran = f"ran {r.ledger['steps']} steps and " if steps_known else ""
            descr.append(f"rank {r.rank} {ran}{how} after {r.last} collectives of {label}")
        done = ""
        if steps_known:
            counts = sorted({r.ledger["steps"] for r in waiting})
            if len(counts) == 1:
                done = f" ({counts[0]} steps done)"
        who = f"rank {wait_ranks[0]}{done} waits" if len(wait_ranks) == 1 \
            else f"ranks {format_ranks(wait_ranks)}{done} wait"
        them = f"rank {left[0].rank}" if len(left) == 1 else f"ranks {format_ranks(r.rank for r in left)}"
        message = "; ".join(descr) + f"; {who} in {op} #{n}" + (f" (issued at {site})" if site else "") \
            + f", which {them} never issued"
        evidence = {**base, "decided_by": "left_early", "ranks": {
            **{str(r.rank): {"issued": r.last, **_whereabouts(r.ledger),
                             **({"last_entry": _entry_evidence(r.calls[r.last])} if r.last in r.calls else {})}
               for r in left},
            **waiting_evidence}}
        if steps_known:
            evidence["steps"] = {str(r.rank): r.ledger["steps"] for r in sorted(left + waiting, key=lambda r: r.rank)}
        # a rank that issued no collective at all ended before the first one: no uneven split of the
        # data, a rank-dependent early return or exit
        hint = NONE_ISSUED_HINT if all(not r.last for r in left) else None
        findings.append(event_finding(UNEVEN_INPUTS, message, rank=None, ranks=[r.rank for r in left],
                                      evidence=evidence, phase="training", hint=hint))

    if elsewhere:
        descr = []
        for r in elsewhere:
            other = _waiting_elsewhere(r.ledger, pg)
            if other is not None:
                opg, oname = group_of(other)
                at = f"it waits in {op_of(other)} #{seq_of(other)} of {_group_label(opg, oname)}"
                osite = site_of(other)
                if osite:
                    at += f" at {osite}"
            elif r.ledger.get("where"):
                at = f"it is at {r.ledger['where']}"
            else:
                at = f"it is {r.ledger.get('position') or 'running'} (where is unknown)"
            last = f"its last was #{r.last}" if r.last else "it issued none"
            descr.append(f"rank {r.rank} never issued #{n} ({last}): {at}")
        message = f"{waits_text}; " + "; ".join(descr)
        evidence = {**base, "decided_by": "elsewhere", "ranks": {
            **{str(r.rank): {"issued": r.last, **_whereabouts(r.ledger),
                             **({"waits_in": _entry_evidence(o)} if (o := _waiting_elsewhere(r.ledger, pg)) else {})}
               for r in elsewhere},
            **waiting_evidence}}
        findings.append(event_finding(RANK_ELSEWHERE, message, rank=None, ranks=[r.rank for r in elsewhere],
                                      evidence=evidence, phase="training"))
    # A rank that failed is reported by its own exception (DDP800 and the signatures); the ranks
    # waiting for it are a consequence of that, not a new finding here.
    return findings


def _extra_collective(pg: str, name: str, label: str, n: int, waiting: list[_Rank], left: list[_Rank],
                      history: _History, waiting_evidence: dict[str, Any]) -> Finding | None:
    """Ranks that ended while others wait: the waiting ranks went their own way (DDP893) when the
    collective they wait in is one no rank had issued (or not in that order), while the ranks that
    ended had run every step they did. The usual case, the next step's gradient all_reduce, is a
    routine call: then the ranks that ended left early (uneven inputs, DDP892), and None is returned."""
    # Only a call no rank ever issued decides here: after a rank ended, a routine call in a new
    # order is what the first extra step of uneven inputs looks like.
    level = {r.rank: history.novelty(r, n) for r in waiting}
    if not history.keys or min(level.values()) != NEW_CALL:
        return None  # with no call before it, "new" tells nothing: the rank that ended left first
    steps = {r.rank: r.ledger.get("steps") for r in waiting + left}
    counts = {k: v for k, v in steps.items() if isinstance(v, int)}
    if len(counts) == len(steps) and max(counts[r.rank] for r in left) < min(counts[r.rank] for r in waiting):
        return None  # the ranks that ended ran fewer steps: they left early, whatever the others do now
    entry = waiting[0].calls[n]
    odd = [r.rank for r in waiting]
    why = "a collective no other rank issued"
    how = {("finished" if r.ledger.get("position") == "finished" else "destroyed its process group")
           for r in left}
    message = (f"{_who(odd)} went its own way after call #{n - 1} of {label}: "
               f"{'waits' if len(odd) == 1 else 'wait'} in {_describe(entry)} (#{n}), {why}; "
               f"{_who([r.rank for r in left])} {' or '.join(sorted(how))} after "
               + (f"the same {n - 1} collectives" if all(r.last == n - 1 for r in left)
                  else ", ".join(f"{r.last} collectives (rank {r.rank})" for r in left))
               + _steps_text(sorted(waiting + left, key=lambda r: r.rank)))
    evidence = {"process_group": {"id": pg, "name": name}, "collective_seq_id": n, "decided_by": "new_call",
                "ranks": {**{str(r.rank): {"issued": r.last, **_whereabouts(r.ledger)} for r in left},
                          **{k: {**v, "odd": True} for k, v in waiting_evidence.items()}}}
    return event_finding(OWN_WAY, message, rank=None, ranks=odd, evidence=evidence, phase="training")
