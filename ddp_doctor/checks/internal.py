"""Findings raised by the machinery itself (runner, rendezvous, report), documented like checks.

These are catalogue entries with no check function: the runner and the rendezvous raise them
through :func:`event_finding` when they observe the situation described.
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.findings import Finding, Problem, format_ranks
from ddp_doctor.registry import EXTRA_MODULES_ENV, declare

CHECK_CRASHED = declare(
    "DDP001", category="internal", severity="error", title="A check crashed",
    doc="""
    What: A ddp-doctor check raised an exception instead of returning its findings.
    Why: The other checks still ran and their findings stand, but this one's question is unanswered.
    Fix: Report it to the ddp-doctor maintainers with the traceback in the finding's evidence; skip
    the check with `--skip ID` meanwhile.
    """)

CHECK_TIMED_OUT = declare(
    "DDP002", category="internal", severity="warning", title="A check did not finish in time",
    doc="""
    What: A check ran past its time bound and was abandoned.
    Why: Every wait in ddp-doctor is bounded so a diagnosis never hangs; a check that blocks (a DNS
    lookup that never answers, a stuck driver call) is itself a sign of trouble on this host.
    Fix: Look at what the check probes (its title says); run `ddp-doctor explain ID` for that check.
    """)

RANK_LOST = declare(
    "DDP003", category="internal", severity="error", title="A rank ended without a report",
    doc="""
    What: A rank process exited (or was killed) before handing its findings to the reporting rank.
    Why: The merged report lacks that rank's view; the exit status says how it ended.
    Fix: Read that rank's stderr above; a signal such as SIGKILL usually means the host ran out of
    memory or the job was cancelled.
    """)

PROBE_RECORD_LOST = declare(
    "DDP006", category="internal", severity="warning", title="A rank's training probe record is missing",
    doc="""
    What: After training, rank 0 waited for every rank's in-training probe record (`ddp-doctor run`)
    and some ranks did not hand theirs in before the gather timed out.
    Why: The training may well have finished on those ranks; only the probes' view of them is
    missing, so the rules that compare ranks (parameters, buffers, data waits) ran without them.
    Fix: Check that those ranks reached the end of the script (their stderr); a rank that is still
    busy long after rank 0 finished (uneven data, a final save on one rank) is also worth a look.
    """)

INVALID_USAGE = declare(
    "DDP004", category="internal", severity="error", title="ddp-doctor was called wrongly",
    doc="""
    What: An option or environment value given to ddp-doctor itself could not be used.
    Why: ddp-doctor cannot run the checks it was asked to run.
    Fix: Correct the option named in the message; `ddp-doctor preflight --help` lists them.
    """, cause_class="configuration")

TOOL_FAILED = declare(
    "DDP005", category="internal", severity="error", title="ddp-doctor itself failed",
    doc="""
    What: ddp-doctor hit an unexpected error of its own on this rank (not in a check).
    Why: The preflight could not finish on this rank; what it had found so far is still reported.
    Fix: Report it to the ddp-doctor maintainers with the traceback in the finding's evidence (set
    DDP_DOCTOR_DEBUG=1 to also print it).
    """)


def event_finding(entry: Any, message: str, *, rank: int | None, hint: str | None = None,
                evidence: dict[str, Any] | None = None, phase: str = "preflight",
                ranks: list[int] | None = None, severity: str | None = None, time: float | None = None,
                caused_by: str | None = None) -> Finding:
    """A finding about an event (not a check's problem): `time` when it happened (default now),
    `caused_by` when it is a consequence (findings.Finding)."""
    problem = Problem(message=message, hint=hint, evidence=evidence or {}, severity=severity,
                      ranks=tuple(ranks) if ranks is not None else None)
    finding = entry.finding(problem, rank, phase)
    if time is not None:
        finding.time = time
    finding.caused_by = caused_by
    return finding


# ---------------------------------------------------------------- what the runner saw a check do

def _named(check: str, title: str | None) -> str:
    return f"{check} ({title})" if title else check


def check_timed_out(check: str, timeout: float, *, title: str | None = None, rank: int | None,
                    phase: str = "preflight") -> Finding:
    """DDP002: `check` (an ID, or the name of a whole-job rule) ran past its bound of `timeout` s."""
    return event_finding(CHECK_TIMED_OUT, f"{_named(check, title)} did not finish within {timeout:g} s",
                         rank=rank, evidence={"check": check, "timeout_s": timeout}, phase=phase)


def check_raised(check: str, error: BaseException, traceback: str, *, title: str | None = None,
                 rank: int | None, phase: str = "preflight") -> Finding:
    """DDP001: `check` (an ID, or the name of a whole-job rule) raised `error`."""
    return event_finding(CHECK_CRASHED, f"{_named(check, title)} raised {type(error).__name__}: {error}",
                         rank=rank, evidence={"check": check, "traceback": traceback}, phase=phase)


def check_yielded_no_problem(check: str, value: Any, *, rank: int | None, phase: str = "preflight") -> Finding:
    """DDP001: the check yielded `value`, which is not a Problem."""
    return event_finding(CHECK_CRASHED, f"{check} yielded {type(value).__name__}, not a Problem",
                         rank=rank, evidence={"check": check}, phase=phase)


def check_problem_unreportable(check: str, why: Exception, *, rank: int | None, phase: str = "preflight") -> Finding:
    """DDP001: the check yielded a problem its ID cannot carry (a severity it does not declare)."""
    return event_finding(CHECK_CRASHED, f"{check} yielded a problem it cannot report: {why}",
                         rank=rank, evidence={"check": check}, phase=phase)


def check_module_unimportable(module: str, why: str, *, rank: int | None, phase: str = "preflight") -> Finding:
    """DDP001: a team's check module (named in DDP_DOCTOR_CHECK_MODULES) could not be imported."""
    return event_finding(CHECK_CRASHED, f"check module {module} (from {EXTRA_MODULES_ENV}) could not be "
                         f"imported: {why}", rank=rank, evidence={"module": module}, phase=phase)


# ---------------------------------------------------------------- ranks the machinery heard nothing from

def launched_rank_lost(rank: int, launcher_exit: int | None, *, timed_out: bool, bound: float) -> Finding:
    """DDP003: local rank `rank` of a launch ddp-doctor started left no report; how the launch ended."""
    how = (f"the launch was stopped after {bound:g} s" if timed_out
           else f"the launcher exited with status {launcher_exit}")
    return event_finding(RANK_LOST, f"local rank {rank} ended without a report ({how})", rank=rank,
                         evidence={"launcher_exit": launcher_exit, "timed_out": timed_out})


def probe_records_missing(missing: list[int], timeout: float) -> Finding:
    """DDP006: ranks that did not hand in their in-training probe record within `timeout` s of rank 0
    finishing training."""
    return event_finding(PROBE_RECORD_LOST, (
        f"rank(s) {format_ranks(missing)} did not hand in their probe record within {timeout:g} s of rank 0 "
        f"finishing training"), rank=None, ranks=missing, phase="training")


def tool_failed(rank: int, error: BaseException, traceback: str) -> Finding:
    """DDP005: ddp-doctor's own code raised `error` on this rank (not in a check)."""
    return event_finding(TOOL_FAILED, f"ddp-doctor failed on rank {rank}: {type(error).__name__}: {error}",
                         rank=rank, evidence={"traceback": traceback})


def checked_in_rank_lost(rank: int, waited_s: float) -> Finding:
    """DDP003: a rank checked in at the rendezvous, then sent no final findings within `waited_s`."""
    return event_finding(RANK_LOST, f"rank {rank} checked in but sent no final findings within {waited_s:g} s",
                         rank=rank)


RECORDS_DEGRADED = declare(
    "DDP813", category="internal", severity="warning", title="ddp-doctor's records could not be kept where asked",
    doc="""
    What: The run directory where `ddp-doctor run` keeps its records (heartbeats, endings, ledgers,
    stacks: `$TMPDIR/ddp-doctor-run-*`, `DDP_DOCTOR_RUN_DIR`, `--run-dir`) could not be made or has
    no room (its file system is full: less than 8 MiB or 256 inodes free, read-only, permission
    denied). The records went to another place (/dev/shm, /var/tmp), named in the message; when no
    place could take them, ddp-doctor's records of the run are incomplete.
    Why: A record that cannot be written reads as a rank that never reported; ddp-doctor moves
    them rather than let its own storage change the job's verdict or exit status, which stay the
    job's own.
    Fix: Free space in (or point TMPDIR / DDP_DOCTOR_RUN_DIR / --run-dir at) a writable directory
    with room; `df -h $TMPDIR` and `df -i $TMPDIR` show what is left.
    """)


def records_moved_finding(note: str, rank: int | None, run_dir: str) -> Finding:
    """DDP813: the records went to `run_dir` rather than where asked; `note` says why (run_dir.py)."""
    return event_finding(RECORDS_DEGRADED, note, rank=rank, evidence={"run_dir": run_dir})
