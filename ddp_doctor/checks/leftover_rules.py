"""Processes a rank's script left running after it ended (DDP816-DDP818), judged from the record
each rank leaves in its outcome (training/run/child_watch.py ends them and says how). Warnings: the
job's exit status and verdict stay the script's.
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.findings import Finding
from ddp_doctor.registry import declare

LEFTOVERS_ENDED = declare(
    "DDP816", category="teardown", severity="warning", title="Processes outlived the rank that started them",
    doc="""
    What: When a rank's script ended (returned or raised), processes it had started were still
    running: plain children, children in a session of their own, double-forked daemons. They are
    found by the process tree, by the rank's session or process group and by a mark ddp-doctor puts
    in the rank's environment (which their environment inherits), never by name; the finding names
    each one (pid, command line with secrets redacted, the TCP ports it listens on, how it was
    found, the script's line that started it where the probes saw it) and ddp-doctor ended them
    (SIGTERM, then SIGKILL after a short grace). The processes the interpreter and torch own
    (multiprocessing's children, torch's compile workers) end with the rank and are left alone.
    The same is done for each rank of a `@pytest.mark.distributed` test: the test keeps its own
    outcome, and a warning in pytest's summary and a note of the test name what was ended.
    Why: Launchers end the rank, not what it started: under plain torchrun these processes outlive
    the job, holding ports (the next job's "address already in use"), memory and GPUs, and a CI
    machine fills with them.
    Fix: Stop what the script starts before it ends: keep the Popen and call terminate() and
    wait() in a finally block (or use it as a context manager); stop servers and daemons at the
    end of training (atexit), or run them outside the training job.
    """)

LEFTOVERS_NOT_ENDED = declare(
    "DDP817", category="teardown", severity="warning", title="Processes left by a rank could not be ended",
    doc="""
    What: A process a rank's script left running (see DDP816) could not be ended: it was still
    alive after SIGTERM, the grace and SIGKILL (a process in uninterruptible sleep, stuck on a
    device or a network file system), or ending it was not permitted (it changed its user).
    Why: It outlives the job, holding whatever it holds (ports, memory, GPUs).
    Fix: End it by hand (`kill -9 PID` with the pid named, as its owner or root); if it stays, see
    what it waits on (`cat /proc/PID/stack`, `cat /proc/PID/wchan`), and stop it in the script.
    """, cause_class="unknown")

LEFTOVERS_UNSEEN = declare(
    "DDP818", category="teardown", severity="info", title="A rank's leftover processes could not be looked for",
    doc="""
    What: At a rank's end, ddp-doctor could not read the process table to find (and end) the
    processes its script left running; the message says why.
    Why: Processes the script started may outlive the job unseen.
    Fix: Look by hand: `ps -eo pid,ppid,sid,args` on the host after the job, and end what the job
    left; report the error to the ddp-doctor maintainers if it persists.
    """, cause_class="unknown")

LISTED = 10          # processes named in a message; the evidence keeps up to EVIDENCE
EVIDENCE = 50
COMMAND_CHARS = 120  # of a command line, in a message
FOUND = {"child": "its child", "descendant": "a descendant", "session": "in its session",
         "process group": "in its process group",
         "environment mark": "reparented away from it (a daemon), found by ddp-doctor's mark in its environment"}
NOT_ENDED = {"still running": "still running after SIGKILL", "not permitted": "not permitted to end it"}


def _command(p: dict[str, Any]) -> str:
    """The (redacted) command line, cut for a message; never inside a masked value ("--token **…"
    would read as a value to redact again, with what follows it in the message)."""
    cmd = str(p.get("cmdline") or "command line not readable")
    if len(cmd) <= COMMAND_CHARS:
        return cmd
    end = COMMAND_CHARS - 1
    while end < len(cmd) and cmd[end - 1] == "*" and cmd[end] == "*":
        end += 1
    return cmd if end >= len(cmd) else cmd[:end] + "…"


def describe(p: dict[str, Any], grace: float) -> str:
    """One leftover in words: "pid 4704 (python -m http.server) listening on 0.0.0.0:8000, its child:
    ended by SIGTERM"."""
    ports = p.get("ports") or []
    listening = f" listening on {', '.join(map(str, ports))}" if ports else ""
    how = FOUND.get(str(p.get("found_by")), str(p.get("found_by") or "found"))
    if p.get("sid") is not None and p.get("sid") == p.get("pid"):
        how += ", in a session of its own"
    ended = str(p.get("ended") or "")
    fate = {"SIGTERM": "ended by SIGTERM", "SIGKILL": f"ended by SIGKILL ({grace:g} s after SIGTERM)",
            "exited": "exited as it was found"}.get(ended) or NOT_ENDED.get(ended, ended)
    started = f", started at {p['started_at']}" if p.get("started_at") else ""
    return f"pid {p.get('pid')} ({_command(p)}){listening}, {how}{started}: {fate}"


def _listed(procs: list[dict[str, Any]], grace: float) -> str:
    text = "; ".join(describe(p, grace) for p in procs[:LISTED])
    return text + (f"; and {len(procs) - LISTED} more" if len(procs) > LISTED else "")


def _count(n: int) -> str:
    return f"{n} process" + ("" if n == 1 else "es")


def rank_leftover_findings(rank: int, record: Any, *, started_by: str = "script") -> list[Finding]:
    """The findings about what one rank's script (or test: `started_by`) left, from the "leftovers"
    record of its outcome."""
    if not isinstance(record, dict):
        return []
    procs = [p for p in record.get("processes") or [] if isinstance(p, dict)]
    try:
        grace = float(record.get("grace") or 0)
    except (TypeError, ValueError):
        grace = 0.0
    out: list[Finding] = []
    ended = [p for p in procs if p.get("ended") not in NOT_ENDED]
    stuck = [p for p in procs if p.get("ended") in NOT_ENDED]
    if ended:
        out.append(event_finding(
            LEFTOVERS_ENDED, f"rank {rank}'s {started_by} left {_count(len(ended))} running after it ended; ddp-doctor "
            f"ended {'it' if len(ended) == 1 else 'them'}: {_listed(ended, grace)}", rank=rank, phase="teardown",
            hint="Stop what the script starts before it ends (Popen.terminate() and wait() in a finally block, "
                 "or the Popen as a context manager; servers and daemons stopped at the end of training): under "
                 "plain torchrun these processes would outlive the job, holding their ports and memory.",
            evidence={"processes": ended[:EVIDENCE], "grace_s": grace}))
    if stuck:
        pids = " ".join(str(p.get("pid")) for p in stuck[:LISTED])
        out.append(event_finding(
            LEFTOVERS_NOT_ENDED, f"rank {rank}'s {started_by} left {_count(len(stuck))} that ddp-doctor could not end: "
            f"{_listed(stuck, grace)}", rank=rank, phase="teardown",
            hint=f"End {'it' if len(stuck) == 1 else 'them'} by hand (`kill -9 {pids}`, as the owner or root); "
                 f"if it stays, /proc/PID/stack shows what it waits on.",
            evidence={"processes": stuck[:EVIDENCE], "grace_s": grace}))
    if record.get("error"):
        out.append(event_finding(
            LEFTOVERS_UNSEEN, f"rank {rank}: the processes its {started_by} left could not be looked for "
            f"({record['error']})", rank=rank, phase="teardown",
            hint="Look by hand after the job (`ps -eo pid,ppid,sid,args`) and end what it left.",
            evidence={"error": str(record["error"])}))
    return out


def leftover_findings(outcomes: dict[int, dict[str, Any]]) -> list[Finding]:
    """Every rank's leftovers, from the outcome records ("leftovers"), one finding per rank and kind."""
    out: list[Finding] = []
    for rank in sorted(outcomes):
        outcome = outcomes[rank]
        if isinstance(outcome, dict):
            out += rank_leftover_findings(rank, outcome.get("leftovers"))
    return out
