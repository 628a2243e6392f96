"""Runs the checks of one stage and turns what they yield into findings.

A check never takes the run down with it: an exception becomes a DDP001 finding and a check that
runs past its bound becomes DDP002 (its daemon thread is abandoned, the run goes on).
"""
from __future__ import annotations

import time
from typing import Any

from ddp_doctor import checks as catalogue
from ddp_doctor import registry
from ddp_doctor.checks import internal as events
from ddp_doctor.findings import Finding, Problem
from ddp_doctor.registry import Check
from ddp_doctor.time_limit import call_with_time_limit


def _call(entry: Check, args: tuple[Any, ...]) -> tuple[list[Problem] | None, BaseException | None, str]:
    def problems() -> list[Any]:
        return [p for p in (entry.func(*args) or ()) if p is not None]  # type: ignore[misc]

    out = call_with_time_limit(problems, entry.timeout, name=f"ddp-doctor-{entry.id}")
    if not out.finished:
        return None, None, "timeout"
    return out.value, out.error, out.traceback


def run_entry(entry: Check, args: tuple[Any, ...], rank: int | None, phase: str = "preflight") -> list[Finding]:
    problems, error, tb = _call(entry, args)
    if tb == "timeout":
        return [events.check_timed_out(entry.id, entry.timeout, title=entry.title, rank=rank, phase=phase)]
    if error is not None:
        return [events.check_raised(entry.id, error, tb, title=entry.title, rank=rank, phase=phase)]
    out = []
    for p in problems or ():
        if not isinstance(p, Problem):
            out.append(events.check_yielded_no_problem(entry.id, p, rank=rank, phase=phase))
            continue
        try:
            out.append(entry.finding(p, rank, phase))
        except ValueError as e:  # a severity the ID cannot carry: the check is wrong, the run goes on
            out.append(events.check_problem_unreportable(entry.id, e, rank=rank, phase=phase))
    return out


def run_stage(stage: str, args: tuple[Any, ...], rank: int | None, *, select: list[str] | None = None,
              skip: list[str] | None = None, phase: str = "preflight",
              timings: list[dict[str, Any]] | None = None) -> list[Finding]:
    """The findings of one stage's checks; with `timings`, one {"name": ID, "cat": "check",
    "title", "category", "start", "end", "found"} record (wall-clock seconds, how many findings) is
    appended per check run."""
    findings: list[Finding] = []
    entries = catalogue.checks_for(stage, select, skip)
    if stage == "local":
        for module, why in sorted(registry.LOAD_ERRORS.items()):
            findings.append(events.check_module_unimportable(module, why, rank=rank, phase=phase))
    for entry in entries:
        start = time.time()
        found = run_entry(entry, args, rank, phase)
        findings.extend(found)
        if timings is not None:
            timings.append({"name": entry.id, "cat": "check", "title": entry.title, "category": entry.category,
                            "start": start, "end": time.time(), "found": len(found)})
    return findings


RULE_TIMEOUT = 60.0  # seconds a whole-job judgement may take (it reads no file and waits on nothing)


def run_rule(name: str, fn: Any, *args: Any, phase: str = "training",
             timeout: float = RULE_TIMEOUT) -> tuple[Any, list[Finding]]:
    """A judgement over the whole job, as a stage: (its value, []), or, when it raises or runs
    past `timeout`, (None, [a DDP001 or DDP002 finding]): a bug in a rule costs its findings,
    never the report."""
    out = call_with_time_limit(lambda: fn(*args), timeout, name=f"ddp-doctor-{name}")
    if not out.finished:
        return None, [events.check_timed_out(name, timeout, rank=None, phase=phase)]
    if out.error is not None:
        return None, [events.check_raised(name, out.error, out.traceback, rank=None, phase=phase)]
    return out.value, []
