"""How a run ended when its launcher or ddp-doctor's parent was stopped from outside (DDP810,
DDP811): the launcher (torch's elastic agent) ended before its ranks, or a stop signal arrived
after the run had ended, while ddp-doctor wrote its report. A stop signal that ended the run
itself is DDP808 (stalls.py). Pure functions over what the parent saw.
"""
from __future__ import annotations

import signal
from typing import Any

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.exit_codes import EXIT_FAILED
from ddp_doctor.findings import Finding, format_ranks
from ddp_doctor.registry import declare

LAUNCHER_ENDED = declare(
    "DDP810", category="training_failure", severity="error", title="The launcher ended before its ranks",
    doc="""
    What: torch's elastic agent, the launcher `ddp-doctor run --nproc-per-node N` starts the ranks
    through, ended while ranks that had started had not: killed by a signal no process can catch
    (SIGKILL) or another fatal one, or exited on its own, before the ranks recorded how they
    ended. The finding names the launcher's pid, how it ended and where each rank was (its last
    heartbeat). The ranks die with it (each asks the kernel for that as it starts, and ddp-doctor's
    parent adopts and ends any that outlive it), so none trains on unwatched.
    Why: A killed launcher leaves no exit status for its ranks; without this, the job looked as if
    it had ended well, and its ranks, reparented to init, kept training and holding their ports.
    Fix: Find what ended the launcher: `kill -9` by hand or a script, a scheduler's hard stop, or
    the kernel's out-of-memory killer (`dmesg | grep -i 'killed process'`). To stop a job and keep
    its report, send SIGTERM or SIGINT to `ddp-doctor run` (or to the launcher): the report then
    says "interrupted", with where each rank was.
    """, cause_class="unknown")

LATE_STOP = declare(
    "DDP811", category="teardown", severity="info", title="A stop signal arrived after the run ended",
    doc="""
    What: SIGTERM, SIGINT or SIGHUP reached ddp-doctor's parent after the ranks had ended, while it
    merged and wrote the report. The run's own verdict stands (the report says how the run ended);
    the signal is noted here and the parent exits with 128 + the signal number, as the sender asked.
    Why: A scheduler or a user that stops a job just as it ends must get a whole report, never a
    half-written one or none: the parent holds stop signals until the report is written.
    Fix: Nothing to fix in the job. If the stop was meant for a job still running (a timeout set
    too short, a repeated Ctrl-C), read the verdict above before restarting it.
    """, cause_class="unknown")


def _name(signo: int) -> str:
    try:
        return signal.Signals(signo).name
    except ValueError:
        return f"signal {signo}"


def _where(heartbeats: dict[int, dict[str, Any]]) -> str:
    parts = []
    for r in sorted(heartbeats):
        hb = heartbeats[r]
        where = hb.get("where") or hb.get("innermost")
        steps = hb.get("steps")
        parts.append(f"rank {r}" + (f" at {where}" if where else "")
                     + (f", {int(steps)} steps" if isinstance(steps, int) else ""))
    return "; ".join(parts)


def launcher_ended_finding(code: int, pid: int | None, heartbeats: dict[int, dict[str, Any]], *,
                           phase: str = "training") -> Finding:
    """DDP810: the launcher ended with `code` (negative: killed by that signal, as Popen says it)
    while the ranks in `heartbeats` (rank -> last heartbeat) had no ending of their own."""
    who = f"the launcher (torch's elastic agent{f', pid {pid}' if pid else ''})"
    how = f"was killed by {_name(-code)}" if code < 0 else f"exited with status {code}"
    ranks = sorted(heartbeats)
    during = (f"while rank{'s' if len(ranks) > 1 else ''} {format_ranks(ranks)} "
              f"{'were' if len(ranks) > 1 else 'was'} {'training' if phase == 'training' else 'in the preflight'}"
              if ranks else "before any rank started its script")
    where = _where(heartbeats)
    message = (f"{who} {how} {during}" + (f" ({where})" if where else "")
               + "; the ranks ended with it, none trains on")
    return event_finding(LAUNCHER_ENDED, message, rank=None, ranks=ranks or None, phase=phase,
                         evidence={"launcher_pid": pid, "launcher_exit": code,
                                   "signal": _name(-code) if code < 0 else None,
                                   "where": {str(r): hb.get("where") or hb.get("innermost")
                                             for r, hb in heartbeats.items()}})


def launcher_exit_status(code: int | None) -> int:
    """The job's exit status when its launcher ended on its own before its ranks (DDP810): 128 + the
    signal that killed it (as a shell reports it), else the launcher's own status; EXIT_FAILED when
    it gave none."""
    if code is not None and code < 0:
        return 128 - code
    return code or EXIT_FAILED


def late_stop_finding(interrupt: Any, phase: str = "training") -> Finding:
    """DDP811: `interrupt` (stop_signals.Interrupt) arrived after the run had ended."""
    return event_finding(LATE_STOP, f"{interrupt.describe()} arrived after the run had ended, while ddp-doctor "
                         f"wrote this report: the verdict is the run's own; the exit status is "
                         f"{interrupt.exit_code} (128 + {interrupt.signo}) as the signal asks",
                         rank=None, phase=phase, time=interrupt.at, evidence=interrupt.to_dict())
