"""A distributed test's outcome from how each of its ranks ended. A rank that reported success and
then died by SIGABRT is torch 2.13's gloo teardown abort (docs/facts.md, "The gloo teardown abort"): the test passed,
and the report says so in a note. A rank that died without a result file failed. The root cause
of a failed test is the one ddp-doctor's judgement names (rank_pool/judge.py, the judgement of
`ddp-doctor run` with each rank's ledger of collectives), and each rank is labelled by it: the
cause, or a consequence (waiting in the collective at fault, or failed after the cause). Without
a judgement, it is the earliest failure that is not the consequence of a peer going away.
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Any

import ddp_doctor.pytest_plugin.rank_pool.forkserver as _forkserver
import ddp_doctor.pytest_plugin.rank_pool.ledgers as _ledgers
import ddp_doctor.pytest_plugin.rank_pool.worker as _rank
import ddp_doctor.time_limit
import ddp_doctor.training.probes.collective_sites as _collective_sites
from ddp_doctor.pytest_plugin.rank_pool.ledgers import LEFT
from ddp_doctor.pytest_plugin.rank_pool.pool import PEER_GRACE_S
from ddp_doctor.pytest_plugin.rank_pool.results import POOL_LOST, RankEnd, RunResult, leftover_notes
from ddp_doctor.pytest_plugin.rank_pool.worker import DESTROY_BOUND_S

# A failure with one of these messages is a consequence of a peer that went away first.
PEER_LOSS = ("closed by peer", "reset by peer", "remote worker", "remote process", "broken pipe",
             "connection refused", "peer closed")
# Frames of the rank machinery, left out of a hung rank's stack (the forkserver's own is "<string>").
MACHINERY_FILES = (_forkserver.__file__, _rank.__file__, ddp_doctor.time_limit.__file__, 'File "<string>"',
                   _collective_sites.__file__)
MACHINERY_THREADS = (_ledgers.__file__,)  # a thread with a frame here is the machinery's own
LEDGER_LINES = 6     # a rank's newest ledger entries shown in the failure text
MESSAGE_CHARS = 160  # of an exception's first line, in a rank's line of the judgement


@dataclass
class Verdict:
    outcome: str                 # passed | failed | skipped
    summary: str                 # one line
    text: str                    # the full failure text (every failing rank's traceback)
    notes: list[str] = field(default_factory=list)


def _user_stack(dump: str) -> str:
    """A faulthandler dump without the rank machinery's own frames, nor its own threads (the one
    that writes the ledger when asked)."""
    blocks: list[list[str]] = []
    for ln in dump.rstrip().splitlines():
        if ln.startswith(("Thread 0x", "Current thread 0x")) or not blocks:
            blocks.append([])
        blocks[-1].append(ln)
    keep = []
    for block in blocks:
        if any(m in ln for ln in block for m in MACHINERY_THREADS):
            continue
        keep += [ln for ln in block if not any(m in ln for m in MACHINERY_FILES)]
    while keep and not keep[-1].strip():
        keep.pop()
    return "\n".join(keep)


def stopped_stack(e: RankEnd) -> str:
    """What a rank the parent stopped was doing: its Python stack in the test's code, or that it
    had returned from the test and waited for its peers."""
    stack = _user_stack(e.stack)
    if _returned(e):
        head = f"{(e.ledger or {}).get('where') or 'returned from the test'}; waiting for its peers to finish"
        return f"{head}\n{stack}" if stack and "File " in stack else head
    return stack or "(no stack dump: the rank did not answer SIGUSR1)"


def classify(res: RunResult, judgement: dict[str, Any] | None = None) -> Verdict:
    """The test's outcome from every rank's end. A failed test's root cause is the one ddp-doctor's
    `judgement` names (rank_pool/judge.py: the judgement of `ddp-doctor run`, with each rank's
    ledger of collectives); without one, the earliest failure that is not a lost peer."""
    failures: list[tuple[float, int, str, str]] = []   # (time, rank, one line, detail)
    skips: list[tuple[float, int, str]] = []
    hung: list[RankEnd] = []
    notes: list[str] = list(res.notes) + leftover_notes(res)
    for r, e in sorted(res.ends.items()):
        out = e.result
        if out is not None:
            if out["outcome"] == "failed":
                failures.append((out["time"], r, out["message"].splitlines()[0] if out["message"] else "failed",
                                 out["traceback"]))
                continue
            if out["outcome"] == "skipped":
                skips.append((out["time"], r, out["message"]))
                continue
            # reported success: what came after is teardown
            sig = e.signal
            if sig == signal.SIGABRT:
                notes.append(f"rank {r} reported success, then aborted at exit (SIGABRT): torch's gloo "
                             f"teardown abort after a correct destroy_process_group, not a test failure")
            elif e.killed is not None or e.exit_code == 0:
                pass
            elif e.status is not None:
                failures.append((e.exit_time or out["time"], r, f"reported success, then {e.how()} at exit",
                                 e.stderr[-4000:]))
            if out.get("destroy_hung"):
                notes.append(f"rank {r}: destroy_process_group did not return within {DESTROY_BOUND_S:g} s")
            continue
        if e.killed is not None:
            hung.append(e)
            continue
        when = e.exit_time or time.time()
        detail = e.stderr[-4000:] or "(no stderr)"
        failures.append((when, r, f"{e.how()} without reporting a result" if e.status is not None
                         else POOL_LOST, detail))
    ws = res.world_size
    if not failures and not hung:
        if skips:
            reason = skips[0][2]
            where = "all ranks" if len(skips) == ws else f"rank(s) {', '.join(str(s[1]) for s in skips)}"
            return Verdict("skipped", f"{reason} (skipped on {where})", reason, notes)
        return Verdict("passed", "", "", notes)
    # Root cause: the earliest failure that is not a peer loss (a rank that crashed is seen by the
    # forkserver a moment after its peers saw the connection drop), else the earliest failure.
    def key(ev: tuple[float, int, str, str, str]) -> tuple[bool, float, int]:
        consequence = ev[2] == "failed" and any(p in (ev[3] + ev[4][-600:]).lower() for p in PEER_LOSS)
        return (consequence, ev[0], ev[1])
    events: list[tuple[float, int, str, str, str]] = (
        [(t, r, "failed", one, detail) for t, r, one, detail in failures]
        + [(t, r, "skipped", f"pytest.skip: {m}", "") for t, r, m in skips])
    events.sort(key=key)
    if judgement and judgement.get("root_cause"):
        return _judged(res, judgement, events, hung, notes)
    lines: list[str] = []
    if events:
        t0, root, kind, one, _ = events[0]
        summary = f"rank {root} {'failed' if kind == 'failed' else 'skipped'} first: {one}"
    else:
        root, t0 = -1, 0.0
        summary = ""
    if res.timed_out:
        head = _timed_out(res, hung)
        summary = f"{head}; {summary}" if summary else head
    lines.append(summary)
    for i, (t, r, kind, one, detail) in enumerate(events):
        if i == 0:
            lines.append(f"\n---- rank {r}: root cause ({kind} first) ----")
        else:
            lines.append(f"\n---- rank {r}: a peer that {kind} after rank {root} "
                         f"(+{max(t - t0, 0.0):.2f} s) ----")
        lines.append(detail.rstrip() if detail else one)
    for e in hung:
        lines.append(f"\n---- rank {e.rank}: {_killed_why(res, e, root)}; killed. Its Python stack: ----")
        lines.append(_user_stack(e.stack) or "(no stack dump: the rank did not answer SIGUSR1)")
    if notes:
        lines.append("")
        lines.extend(f"note: {n}" for n in notes)
    return Verdict("failed", summary, "\n".join(lines), notes)


def _timed_out(res: RunResult, hung: list[RankEnd]) -> str:
    """"timed out after N s: rank(s) ... still running", never with an empty list."""
    live = ", ".join(str(e.rank) for e in hung)
    return f"timed out after {res.timeout:g} s" + (f": rank(s) {live} still running" if live else "")


def _killed_why(res: RunResult, e: RankEnd, root: int) -> str:
    return (f"still running at the {res.timeout:g} s timeout" if e.killed == "timeout"
            else f"still running {PEER_GRACE_S:g} s after rank {root} failed")


def _who(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)


def _returned(e: RankEnd) -> bool:
    """The rank left the test function (returned, or pytest.skip) and waited for its peers."""
    return bool(e.ledger) and e.ledger.get("position") == LEFT and e.result is None


# ---------------------------------------------------------------- words for the judgement
def _entry_text(entry: dict[str, Any]) -> str:
    """One ledger entry in a line: "#1 barrier at test_x.py:10"."""
    op = str(entry.get("profiling_name") or "?").rsplit(":", 1)[-1]
    sizes = entry.get("input_sizes") or []
    dtypes = entry.get("input_dtypes") or []
    tensors = ", ".join(f"{dtypes[i] if i < len(dtypes) else '?'}[{', '.join(map(str, s))}]"
                        for i, s in enumerate(sizes) if isinstance(s, (list, tuple)))
    site = entry.get("user_site") or entry.get("site")
    seq = entry.get("collective_seq_id")
    return (f"#{seq} " if seq else "") + op + (f" {tensors}" if tensors else "") + (f" at {site}" if site else "")


def _inside(ledger: dict[str, Any] | None) -> dict[str, Any] | None:
    """The collective the rank was in when its ledger was written (not completed, or the one its
    exception came out of), if any."""
    entries = [e for e in (ledger or {}).get("entries") or [] if isinstance(e, dict)]
    return next((e for e in reversed(entries) if e.get("failed_here") or not e.get("retired", True)), None)


def _ledger_lines(ledger: dict[str, Any] | None, keep: int = LEDGER_LINES) -> list[str]:
    if not ledger:
        return ["ledger: none (the rank left none)"]
    entries = [e for e in ledger.get("entries") or [] if isinstance(e, dict)]
    if not entries:
        return ["ledger: no collective issued in the test"]
    more = f", the last {keep}:" if len(entries) > keep else ":"
    out = [f"ledger: {len(entries)} collective(s) in the test{more}"]
    for e in entries[-keep:]:
        state = ("failed here" if e.get("failed_here") else "not completed" if not e.get("retired", True)
                 else "completed")
        out.append(f"  {_entry_text(e)} ({state})")
    return out


def _position(res: RunResult, e: RankEnd, root: int) -> str:
    """Where the rank ended: passed, failed (and where), returned from the test, still running."""
    out = e.result
    where = (e.ledger or {}).get("where") or (e.whereabouts or {}).get("where")
    if out is not None:
        if out["outcome"] == "failed":
            first = out["message"].splitlines()[0] if out["message"] else "failed"
            first = first if len(first) <= MESSAGE_CHARS else first[:MESSAGE_CHARS - 1] + "…"
            return f"failed: {first}" + (f" (at {where})" if where and where not in first else "")
        return "skipped" if out["outcome"] == "skipped" else "passed"
    if e.killed is not None:
        when = (f"killed at the {res.timeout:g} s timeout" if e.killed == "timeout"
                else f"killed {PEER_GRACE_S:g} s after rank {root} failed")
        if _returned(e):
            return f"{where or 'returned from the test'} (finished), waited for its peers; {when}"
        return f"running at {where}; {when}" if where else f"running; {when}"
    return f"{e.how()} without reporting a result"


def _judged(res: RunResult, j: dict[str, Any], events: list[tuple[float, int, str, str, str]],
            hung: list[RankEnd], notes: list[str]) -> Verdict:
    """The failure text from ddp-doctor's judgement (rank_pool/judge.py): the root cause it names
    first, each rank's part and position with its ledger, then each rank's traceback or stack."""
    cause = j["root_cause"]
    causes = sorted(int(r) for r in j.get("cause_ranks") or [])
    waiting = {int(r): e for r, e in (j.get("waiting") or {}).items()}
    conseq = {int(r): str(i) for r, i in (j.get("consequence") or {}).items()}
    root = causes[0] if causes else -1
    who = _who(causes) if causes else "the root cause"

    def part(r: int) -> str | None:
        if r in causes:
            return f"root cause ({cause['id']})"
        if r in waiting:
            return f"waiting in {_entry_text(waiting[r])}, a consequence of {who}"
        if r in conseq:
            inside = _inside(res.ends[r].ledger)
            return f"a consequence of {who} ({conseq[r]})" + (f", in {_entry_text(inside)}" if inside else "")
        return None

    head = f"root cause: {cause['message']} [{cause['id']}]"
    summary = f"timed out after {res.timeout:g} s; {head}" if res.timed_out else head
    lines = [summary]
    if res.timed_out and hung:
        lines.append(_timed_out(res, hung))
    lines += ["", "ddp-doctor's judgement (as `ddp-doctor run` makes it, from each rank's ledger of collectives):"]
    for r in sorted(res.ends):
        e = res.ends[r]
        p = part(r)
        lines.append(f"  rank {r}: " + (f"{p}; " if p else "") + _position(res, e, root))
        lines.extend(f"    {ln}" for ln in _ledger_lines(e.ledger))
    for f in j.get("findings") or []:
        tag = f" (a consequence of {f['caused_by']})" if f.get("caused_by") else ""
        lines.append(f"  {f['id']} {f['severity']}{tag}: {f['message']}")
    t0 = next((t for t, r, *_ in events if r == root), None)
    ordered = sorted(events, key=lambda ev: (ev[1] not in causes,))
    # root-cause ranks that failed with the very same text: shown once, with every rank named
    alike: dict[str, list[int]] = {}
    for _, r, kind, one, detail in ordered:
        if r in causes:
            alike.setdefault(f"{kind}\0{detail or one}", []).append(r)
    for t, r, kind, one, detail in ordered:
        same = alike.get(f"{kind}\0{detail or one}", [r]) if r in causes else [r]
        if same[0] != r:
            continue  # said with the first of them
        p = part(r)
        after = (f" (+{max(t - t0, 0.0):.2f} s after rank {root})" if t0 is not None and r not in causes
                 else "")
        ranks = f"rank {r}" if len(same) == 1 else f"ranks {', '.join(str(x) for x in same)}, the same text"
        lines.append(f"\n---- {ranks}: " + (f"{p}: " if p else "") + f"{kind}{after} ----")
        lines.append(detail.rstrip() if detail else one)
    for e in sorted(hung, key=lambda e: (e.rank not in causes, e.rank)):
        p = part(e.rank)
        lead = f"\n---- rank {e.rank}: " + (f"{p}: " if p else "")
        if _returned(e):
            why = _killed_why(res, e, root).replace("still running", "waiting for its peers")
            lines.append(lead + f"returned from the test; {why}; killed ----")
            continue
        lines.append(lead + f"{_killed_why(res, e, root)}; killed. Its Python stack: ----")
        lines.append(stopped_stack(e))
    if notes:
        lines.append("")
        lines.extend(f"note: {n}" for n in notes)
    return Verdict("failed", summary, "\n".join(lines), notes)
