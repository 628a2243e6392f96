"""What a post-mortem (`ddp-doctor analyze`) says of its own evidence (DDP950-DDP955): a rank whose
output is missing, artifacts it could not read, logs in which no failure shows, ranks whose
logs end while they still ran, several jobs among the inputs, and an analysis a stop signal ended.
The job's verdict itself is the same judgement as `ddp-doctor run`'s (checks/job.py); these
findings say what it had to go on, never a silent guess.
Pure functions over plain values."""
from __future__ import annotations

from typing import Any

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.findings import Finding, format_ranks
from ddp_doctor.registry import declare

LOG_MISSING = declare(
    "DDP950", category="post_mortem", severity="warning", title="A rank's output is missing",
    severities=("warning", "info"),
    doc="""
    What: The artifacts name a rank (the launcher's summary, the world size, a flight-recorder
    dump, torchrun's log tree) whose output is not among them, or is empty.
    Why: The rank that failed first is often the one whose log is missing (its node was lost, its
    stream was not collected): the verdict can only judge the ranks it has, and a missing rank may
    be the cause.
    Fix: Collect every rank's output (torchrun --log-dir and --tee 3, each SageMaker host's
    CloudWatch stream, srun --label into one file) and run ddp-doctor analyze again.
    Severity: info when the launcher's summary says how each such rank ended: by a signal (a rank
    killed by SIGKILL or crashed without faulthandler prints nothing) or well (absent from
    torchrun's summary of failed ranks); warning otherwise.
    """)

UNREAD_INPUT = declare(
    "DDP951", category="post_mortem", severity="info", title="An input was not read",
    doc="""
    What: A file among the inputs is none of what ddp-doctor analyze reads (a binary file, a
    truncated or refused flight-recorder dump, a file it may not open); it was skipped.
    Why: What a file holds decides how it is read, never its name; a file that is none of the
    known artifacts is left out rather than guessed at.
    Fix: Nothing, if the file is not an artifact of the job; else pass the file as the job left it
    (not truncated, not compressed).
    """)

NO_FAILURE_FOUND = declare(
    "DDP952", category="post_mortem", severity="warning", title="No failure found in the artifacts",
    doc="""
    What: No rank's output ends in an error, a crash or a kill, and no launcher summary reports a
    failed rank.
    Why: A job whose logs show no failure either succeeded or failed where its logs do not reach
    (the logs were cut before the end, a node's output is missing); a post-mortem cannot tell
    which, so it says so instead of "pass". Inputs of which nothing could be read at all (binary
    data, a file of NUL bytes, a refused dump: DDP951 names each) are no evidence either: the same.
    Fix: If the job failed, add the artifacts that show it: every rank's output to the end, the
    launcher's own output (torchrun's summary), the error files, the flight-recorder dumps.
    """)

STILL_RUNNING = declare(
    "DDP953", category="post_mortem", severity="warning", title="A rank's log ends while it still ran",
    doc="""
    What: A rank's output stops without an error, a crash or a kill while the job failed, and no
    launcher reports how it ended; the finding quotes its last line.
    Why: A rank that stopped printing while the others failed is often where the job hung (blocked
    outside a collective the others wait in), or its output was cut.
    Fix: Look at what the rank was doing at its last line; to know where it was blocked, collect
    stacks (py-spy dump, faulthandler with PYTHONFAULTHANDLER=1 and a signal) or run the job under
    ddp-doctor run, which records each rank's collectives and stacks.
    """)

SEVERAL_JOBS = declare(
    "DDP954", category="post_mortem", severity="warning", title="The inputs hold several jobs",
    doc="""
    What: The inputs hold torchrun log trees of several jobs (several run ids: each `torchrun
    --log-dir` run makes `<run id>_<random>/` there), or consoles of several jobs (two consoles
    hold different output of one rank: its first lines, or the pid torchrun's summary gives it).
    The report is about the newest of them (with the consoles that agree with it); the others
    were not read, and are named.
    Why: Ranks of different jobs judged together make a verdict about no job: one job's failed
    rank would be taken for the cause of another's.
    Fix: Analyze each job's artifacts on their own (one run id's directories, its console, its
    dumps), or pass the job's own directory.
    """)


ANALYSIS_STOPPED = declare(
    "DDP955", category="post_mortem", severity="warning", title="The analysis was stopped by a signal",
    severities=("warning", "info"),
    doc="""
    What: `ddp-doctor analyze` received SIGTERM, SIGINT or SIGHUP (Ctrl-C, a CI job cancelled, a
    scheduler's time limit) while it read the job's artifacts or waited on AWS for a SageMaker
    job's logs. It stopped at once: the report says "interrupted", names the signal, its sender
    when known, what the analysis was doing (the input it was reading) and how many inputs it had
    read, and holds no verdict on the job; the exit status is 128 + the signal number.
    Why: A verdict judged from part of the artifacts would be wrong in both directions (the failed
    rank's log not read yet reads as "no failure found", a half-read console as a rank that hung),
    and a report left from an earlier analysis would be taken for this one's.
    Fix: Run the analysis again when it can finish; for a large input, give it the job's own
    directory (one run id's tree) rather than a whole log volume, or stdin from a file, not from a
    stream that never ends.
    Severity: warning when the stop ended the analysis (status "interrupted", no verdict); info
    when it came after the analysis had ended, while the report was written: the verdict is then
    whole and stands, and the exit status is still 128 + the signal.
    """)

def several_jobs_finding(read: str, left: list[str]) -> Finding:
    return event_finding(
        SEVERAL_JOBS, f"the inputs hold torchrun log trees of {len(left) + 1} jobs: this report is about run id "
        f"{read!r} (the newest); not read: {', '.join(repr(r) for r in left[:10])}"
        + (f" and {len(left) - 10} more" if len(left) > 10 else ""), rank=None, phase="training",
        evidence={"read": read, "not_read": left[:100]})


def several_consoles_finding(read: list[str], left: list[str]) -> Finding:
    return event_finding(
        SEVERAL_JOBS, "the inputs hold consoles that give one rank different output (the same rank, or the same "
        "torchrun local rank on hosts they do not name apart): consoles of more than one job, or of nodes whose "
        "hosts they never name (give such nodes' torchrun --log-dir trees instead); this report reads "
        f"{', '.join(repr(p) for p in read[:5])}"
        + (f" and {len(read) - 5} more" if len(read) > 5 else "") + " (the newest, and those that agree with it); "
        f"not read: {', '.join(repr(p) for p in left[:10])}"
        + (f" and {len(left) - 10} more" if len(left) > 10 else ""),
        rank=None, phase="training", evidence={"read": read[:100], "not_read": left[:100]})


def log_missing_finding(ranks: list[int], known_from: dict[int, str], empty: list[int], *,
                        ending_known: bool = False, unlisted: int = 0, world: int | None = None) -> Finding:
    """Ranks known to the artifacts but without output (`empty`: their file is there, empty).
    `ending_known`: the launcher said how each of them ended (a killed rank prints nothing): info.
    `unlisted`: how many more ranks below `world` the artifacts hold nothing of, too many to list."""
    absent = [r for r in ranks if r not in empty]
    parts = []
    if absent:
        parts.append(f"no output of rank(s) {format_ranks(absent)} is among the inputs")
    if unlisted:
        parts.append(f"nothing of {unlisted:,} more of the {world:,} ranks the artifacts imply (the largest rank "
                     f"or world size they name) is among the inputs; too many to list one by one")
    if empty:
        parts.append(f"the output of rank(s) {format_ranks(empty)} is empty")
    sources = sorted({known_from[r] for r in ranks if r in known_from})
    why = ("; how each ended is known from the launcher" if ending_known else
           ": the verdict judges the other ranks only, and a rank without output may be the cause")
    return event_finding(
        LOG_MISSING, "; ".join(parts) + (f" (known from {', '.join(sources)})" if sources else "") + why,
        rank=None, ranks=ranks, phase="training", severity="info" if ending_known else None,
        evidence={"missing": absent, "empty": empty, "known_from": {str(r): known_from.get(r) for r in ranks},
                  **({"unlisted": unlisted, "world_size": world} if unlisted else {})})


def unread_input_finding(skipped: list[tuple[str, str]]) -> Finding:
    shown = "; ".join(f"{p}: {why}" for p, why in skipped[:10]) + (
        f"; and {len(skipped) - 10} more" if len(skipped) > 10 else "")
    return event_finding(UNREAD_INPUT, f"{len(skipped)} input(s) not read: {shown}", rank=None, phase="training",
                         evidence={"skipped": [{"path": p, "why": why} for p, why in skipped[:100]]})


def no_failure_finding(ranks: list[int], files: int) -> Finding:
    return event_finding(
        NO_FAILURE_FOUND, f"no failure found in {files} file(s) holding the output of "
        f"{len(ranks)} rank(s){' (' + format_ranks(ranks) + ')' if ranks else ''}: no error, crash or kill, "
        f"and no launcher summary of a failed rank; whether the job ended well the artifacts cannot say",
        rank=None, ranks=ranks, phase="training", evidence={"ranks": ranks, "files": files})


def nothing_read_finding(skipped: int) -> Finding:
    """No input could be read as anything analyze reads: DDP952, never a pass."""
    return event_finding(
        NO_FAILURE_FOUND, f"nothing among the inputs ({skipped} skipped) could be read as a rank's log, a "
        f"launcher's output, a torchelastic error file or a flight-recorder dump (DDP951 says why each was "
        f"skipped): there is no evidence to judge, so whether the job ended well cannot be said",
        rank=None, phase="training", evidence={"ranks": [], "files": 0, "skipped": skipped})


def still_running_finding(rank: int, last_line: str | None, time: float | None) -> Finding:
    quoted = f": its last line is {last_line!r}" if last_line else ""
    return event_finding(
        STILL_RUNNING, f"rank {rank}'s output ends without an error, a crash or a kill while the job "
        f"failed{quoted}", rank=rank, phase="training", time=time,
        evidence={"last_line": last_line})



def analysis_stopped_finding(interrupt: Any, stage: str | None, read: int, skipped: int) -> Finding:
    """DDP955 (warning): `interrupt` (a stop signal: describe, to_dict, at) ended the analysis while
    it was at `stage` ("reading logs/rank1.log"), `read` inputs read and `skipped` skipped so far."""
    doing = f" while {stage}" if stage else ""
    return event_finding(
        ANALYSIS_STOPPED, f"the analysis was stopped by {interrupt.describe()}{doing}, {read} input(s) read and "
        f"{skipped} skipped so far: no verdict on the job (one from part of its artifacts could be wrong); run "
        f"ddp-doctor analyze again to judge it", rank=None, phase="training", time=interrupt.at,
        evidence={**interrupt.to_dict(), "stage": stage, "inputs_read": read, "inputs_skipped": skipped})


def late_analysis_stop_finding(interrupt: Any) -> Finding:
    """DDP955 (info): `interrupt` arrived after the analysis had ended: its verdict stands."""
    return event_finding(
        ANALYSIS_STOPPED, f"{interrupt.describe()} arrived after the analysis had ended, while ddp-doctor wrote this "
        f"report: the verdict is whole and stands; the exit status is {interrupt.exit_code} (128 + "
        f"{interrupt.signo}) as the signal asks", rank=None, phase="training", severity="info", time=interrupt.at,
        evidence=interrupt.to_dict())
