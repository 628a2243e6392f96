"""The registry of stable IDs, each with a category, a default severity, the stage it runs in,
and a docstring in What / Why / Fix sections that is its documentation. The entries themselves are
declared in the modules of ddp_doctor.checks, which loads them (`ddp_doctor.checks.load_catalogue`).

Two kinds of entries share the registry so that `ddp-doctor explain ID` covers every ID a report
can carry:
- checks, registered with :func:`check` on a function that yields :class:`Problem` objects;
- events, declared with :func:`declare`: findings the machinery itself raises (rendezvous
  failures, a check that crashed), documented the same way.

IDs are never reused: a retired ID stays in :data:`RETIRED`.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

from ddp_doctor.findings import (
    ACTION_OF_CLASS,
    ACTIONS,
    CATEGORIES,
    CAUSE_CLASSES,
    CLASS_OF_CATEGORY,
    SEVERITIES,
    Finding,
    Problem,
)

# Stages, in the order the preflight runs them:
#   local      - (ctx) -> problems; on every rank, no process group needed
#   group      - (ctx, group) -> problems; on every rank, once the process group exists
#   cross_rank - (ctx, views) -> problems; on the reporting rank, over every rank's view
#   event      - raised by the machinery (rendezvous, runner); documentation only
#   job        - (JobContext) -> problems, client side (checks/sagemaker_job.py, sagemaker_account.py)
STAGES = ("local", "group", "cross_rank", "event", "job")
ID_PATTERN = re.compile(r"^DDP\d{3}$")
SECTIONS = ("What", "Why", "Fix")
# Optional docstring sections. "Severity" is required when an ID can be raised at more than one
# severity (declared with `severities=`): it says when the finding is which.
OPTIONAL_SECTIONS = ("Severity",)

# Set (to anything) to make a finding whose severity its ID does not declare an error instead of
# passing it on; tests/test_registry.py also finds such severities in the source.
STRICT_SEVERITIES_ENV = "DDP_DOCTOR_STRICT_SEVERITIES"

# Retired IDs: never hand these out again. {"DDP123": "why it was retired"}
RETIRED: dict[str, str] = {}


@dataclass(frozen=True)
class Check:
    id: str
    category: str
    severity: str
    title: str
    stage: str
    func: Callable[..., Iterable[Problem]] | None
    doc: str
    timeout: float
    # Every severity a finding of this ID can have, most severe first; the default `severity` is
    # one of them. One entry for most IDs; more when the ID escalates or downgrades depending on
    # the situation, which its docstring's Severity section then explains.
    severities: tuple[str, ...] = ()
    # Its findings' evidence holds figures the history keeps with the run (history/from_report.py).
    kept_in_history: bool = False
    # What kind of cause its findings are and what to do with the job (findings.CAUSE_CLASSES,
    # ACTIONS): declared where the category's default (CLASS_OF_CATEGORY) does not fit; filled in
    # at registration.
    cause_class: str = ""
    action: str = ""

    @property
    def severity_label(self) -> str:
        """`warning` for a one-severity ID, `warning/error` (default first) for one that varies."""
        others = [s for s in self.severities if s != self.severity]
        return "/".join([self.severity, *others])

    @property
    def sections(self) -> dict[str, str]:
        return parse_sections(self.doc)

    @property
    def hint(self) -> str:
        return self.sections.get("Fix", "")

    def finding(self, problem: Problem, rank: int | None, phase: str = "preflight") -> Finding:
        severity = problem.severity or self.severity
        if severity not in SEVERITIES:
            raise ValueError(f"{self.id}: a problem with unknown severity {severity!r}")
        if severity not in (self.severities or (self.severity,)) and os.environ.get(STRICT_SEVERITIES_ENV):
            raise ValueError(f"{self.id}: a problem with severity {severity!r}, which the ID does not declare "
                             f"(severities={self.severities}); declare it and explain it in the Severity section")
        ranks = list(problem.ranks) if problem.ranks is not None else ([] if rank is None else [rank])
        cause = problem.cause_class or self.cause_class
        action = problem.action or (ACTION_OF_CLASS[cause] if problem.cause_class else self.action)
        return Finding(
            id=self.id, category=self.category, severity=severity,
            title=self.title, message=problem.message, hint=problem.hint or self.hint,
            ranks=ranks, evidence=dict(problem.evidence), phase=phase, cause_class=cause, action=action,
        )

    def to_dict(self) -> dict[str, Any]:
        # The Severity section becomes "severity_note" (it must not overwrite "severity").
        sections = {("severity_note" if k == "Severity" else k.lower()): v for k, v in self.sections.items()}
        return {"id": self.id, "category": self.category, "severity": self.severity,
                "severities": list(self.severities), "title": self.title, "stage": self.stage,
                "cause_class": self.cause_class, "action": self.action, **sections}


REGISTRY: dict[str, Check] = {}


_SECTION_RE = re.compile(r"^(" + "|".join(SECTIONS + OPTIONAL_SECTIONS) + r"):\s*(.*)$")


def parse_sections(doc: str) -> dict[str, str]:
    """Split a docstring into its `What:` / `Why:` / `Fix:` (and optional `Severity:`) sections
    (each may span lines)."""
    out: dict[str, list[str]] = {}
    current: str | None = None
    for raw in (doc or "").strip().splitlines():
        line = raw.strip()
        m = _SECTION_RE.match(line)
        if m:
            current = m.group(1)
            out[current] = [m.group(2)] if m.group(2) else []
        elif current is not None:
            out[current].append(line)
    return {k: " ".join(x for x in v if x).strip() for k, v in out.items()}


def _register(entry: Check) -> Check:
    if not ID_PATTERN.match(entry.id):
        raise ValueError(f"check ID {entry.id!r} is not of the form DDPnnn")
    if entry.id in REGISTRY or entry.id in RETIRED:
        raise ValueError(f"check ID {entry.id} is already taken (IDs are never reused)")
    if entry.category not in CATEGORIES:
        raise ValueError(f"{entry.id}: unknown category {entry.category!r}")
    if entry.severity not in SEVERITIES:
        raise ValueError(f"{entry.id}: unknown severity {entry.severity!r}")
    if entry.stage not in STAGES:
        raise ValueError(f"{entry.id}: unknown stage {entry.stage!r}")
    declared = set(entry.severities) | {entry.severity}
    unknown = sorted(declared - set(SEVERITIES))
    if unknown:
        raise ValueError(f"{entry.id}: unknown severities {unknown}")
    cause = entry.cause_class or CLASS_OF_CATEGORY[entry.category]
    if cause not in CAUSE_CLASSES:
        raise ValueError(f"{entry.id}: unknown cause class {cause!r}")
    action = entry.action or ACTION_OF_CLASS[cause]
    if action not in ACTIONS:
        raise ValueError(f"{entry.id}: unknown action {action!r}")
    entry = replace(entry, severities=tuple(s for s in SEVERITIES if s in declared), cause_class=cause, action=action)
    if len(entry.severities) > 1 and not entry.sections.get("Severity", "").strip():
        raise ValueError(f"{entry.id} can be {' or '.join(entry.severities)}: its docstring needs a "
                         "Severity: section saying when it is which")
    REGISTRY[entry.id] = entry
    return entry


def check(id: str, *, category: str, severity: str, title: str, stage: str = "local",
          timeout: float = 10.0, severities: Iterable[str] = (), kept_in_history: bool = False,
          cause_class: str = "", action: str = ""
          ) -> Callable[[Callable[..., Iterable[Problem]]], Callable[..., Iterable[Problem]]]:
    """Register a check. The decorated function's docstring is its documentation.

    `severity` is the default; `severities` lists the others its problems may carry
    (`Problem(severity=...)`), which the docstring's Severity section must explain;
    `kept_in_history`: see :attr:`Check.kept_in_history`; `cause_class` and `action`: what kind of
    cause its findings are and what to do with the job, where the category's default does not fit."""
    def wrap(func: Callable[..., Iterable[Problem]]) -> Callable[..., Iterable[Problem]]:
        _register(Check(id=id, category=category, severity=severity, title=title, stage=stage,
                        func=func, doc=func.__doc__ or "", timeout=timeout, severities=tuple(severities),
                        kept_in_history=kept_in_history, cause_class=cause_class, action=action))
        return func
    return wrap


def declare(id: str, *, category: str, severity: str, title: str, doc: str,
            severities: Iterable[str] = (), kept_in_history: bool = False,
            cause_class: str = "", action: str = "") -> Check:
    """Declare an event: a finding the machinery raises, documented like a check (`severities`,
    `kept_in_history`, `cause_class` and `action` as for :func:`check`)."""
    return _register(Check(id=id, category=category, severity=severity, title=title,
                           stage="event", func=None, doc=doc, timeout=0.0, severities=tuple(severities),
                           kept_in_history=kept_in_history, cause_class=cause_class, action=action))


EXTRA_MODULES_ENV = "DDP_DOCTOR_CHECK_MODULES"  # users' own check modules, loaded by ddp_doctor.checks

# module name -> why it could not be imported (reported by the runner as DDP001)
LOAD_ERRORS: dict[str, str] = {}


def parse_selectors(values: Iterable[str] | None) -> list[str]:
    """`--select DDP101,network --select DDP2` -> ["DDP101", "network", "DDP2"]."""
    out: list[str] = []
    for v in values or ():
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return out




def _matches(entry: Check, selector: str) -> bool:
    return selector == entry.category or entry.id.startswith(selector.upper())


def selected(entry: Check, select: list[str], skip: list[str]) -> bool:
    """Ruff-style selection: by exact ID, ID prefix (`DDP2`) or category name."""
    if select and not any(_matches(entry, s) for s in select):
        return False
    return not any(_matches(entry, s) for s in skip)
