"""A distributed test's outcome from how each of its ranks ended. A rank that reported success and
then died by SIGABRT is torch 2.13's gloo teardown abort (DOMAIN.md section 2): the test passed,
and the report says so in a note. A rank that died without a result file failed. The root cause
is the earliest failure that is not the consequence of a peer going away.
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field

import ddp_doctor.pytest_plugin.rank_pool.forkserver as _forkserver
import ddp_doctor.pytest_plugin.rank_pool.rank as _rank
import ddp_doctor.time_limit
from ddp_doctor.pytest_plugin.rank_pool.pool import PEER_GRACE_S
from ddp_doctor.pytest_plugin.rank_pool.rank import DESTROY_BOUND_S
from ddp_doctor.pytest_plugin.rank_pool.results import POOL_LOST, RankEnd, RunResult

# A failure with one of these messages is a consequence of a peer that went away first.
PEER_LOSS = ("closed by peer", "reset by peer", "remote worker", "remote process", "broken pipe",
             "connection refused", "peer closed")
# Frames of the rank machinery, left out of a hung rank's stack (the forkserver's own is "<string>").
MACHINERY_FILES = (_forkserver.__file__, _rank.__file__, ddp_doctor.time_limit.__file__, 'File "<string>"')


@dataclass
class Verdict:
    outcome: str                 # passed | failed | skipped
    summary: str                 # one line
    text: str                    # the full failure text (every failing rank's traceback)
    notes: list[str] = field(default_factory=list)


def _user_stack(dump: str) -> str:
    """A faulthandler dump without the rank machinery's own frames."""
    keep = [ln for ln in dump.rstrip().splitlines() if not any(m in ln for m in MACHINERY_FILES)]
    return "\n".join(keep)


def classify(res: RunResult) -> Verdict:
    """The test's outcome from every rank's end: root cause = the earliest failure."""
    failures: list[tuple[float, int, str, str]] = []   # (time, rank, one line, detail)
    skips: list[tuple[float, int, str]] = []
    hung: list[RankEnd] = []
    notes: list[str] = list(res.notes)
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
    lines: list[str] = []
    # Root cause: the earliest failure that is not a peer loss (a rank that crashed is seen by the
    # forkserver a moment after its peers saw the connection drop), else the earliest failure.
    def key(ev: tuple[float, int, str, str, str]) -> tuple[bool, float, int]:
        consequence = ev[2] == "failed" and any(p in (ev[3] + ev[4][-600:]).lower() for p in PEER_LOSS)
        return (consequence, ev[0], ev[1])
    events: list[tuple[float, int, str, str, str]] = (
        [(t, r, "failed", one, detail) for t, r, one, detail in failures]
        + [(t, r, "skipped", f"pytest.skip: {m}", "") for t, r, m in skips])
    events.sort(key=key)
    if events:
        t0, root, kind, one, _ = events[0]
        summary = f"rank {root} {'failed' if kind == 'failed' else 'skipped'} first: {one}"
    else:
        root, t0 = -1, 0.0
        summary = ""
    if res.timed_out:
        live = ", ".join(str(e.rank) for e in hung)
        head = f"timed out after {res.timeout:g} s: rank(s) {live} still running"
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
        why = (f"still running at the {res.timeout:g} s timeout" if e.killed == "timeout"
               else f"still running {PEER_GRACE_S:g} s after rank {root} failed")
        lines.append(f"\n---- rank {e.rank}: {why}; killed. Its Python stack: ----")
        lines.append(_user_stack(e.stack) or "(no stack dump: the rank did not answer SIGUSR1)")
    if notes:
        lines.append("")
        lines.extend(f"note: {n}" for n in notes)
    return Verdict("failed", summary, "\n".join(lines), notes)
