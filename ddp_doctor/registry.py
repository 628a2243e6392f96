"""The check catalogue: one registry of stable IDs, each with a category, a default severity, the
stage it runs in, and a docstring in What / Why / Fix sections that is its documentation.

Two kinds of entries share the registry so that `ddp-doctor explain ID` covers every ID a report
can carry:
- checks, registered with :func:`check` on a function that yields :class:`Problem` objects;
- events, declared with :func:`declare`: findings the machinery itself raises (rendezvous
  failures, a check that crashed), documented the same way.

IDs are never reused: a retired ID stays in :data:`RETIRED`.
"""
from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ddp_doctor.findings import CATEGORIES, SEVERITIES, Finding, Problem

# Stages, in the order the preflight runs them:
#   local      - (ctx) -> problems; on every rank, no process group needed
#   group      - (ctx, group) -> problems; on every rank, once the process group exists
#   cross_rank - (ctx, views) -> problems; on the reporting rank, over every rank's view
#   event      - raised by the machinery (rendezvous, runner); documentation only
STAGES = ("local", "group", "cross_rank", "event", "job")  # job: (JobContext) -> problems, client side (sagemaker_job.py)
ID_PATTERN = re.compile(r"^DDP\d{3}$")
SECTIONS = ("What", "Why", "Fix")

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

    @property
    def sections(self) -> dict[str, str]:
        return parse_sections(self.doc)

    @property
    def hint(self) -> str:
        return self.sections.get("Fix", "")

    def finding(self, problem: Problem, rank: int | None, phase: str = "preflight") -> Finding:
        ranks = list(problem.ranks) if problem.ranks is not None else ([] if rank is None else [rank])
        return Finding(
            id=self.id, category=self.category, severity=problem.severity or self.severity,
            title=self.title, message=problem.message, hint=problem.hint or self.hint,
            ranks=ranks, evidence=dict(problem.evidence), phase=phase,
        )

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "category": self.category, "severity": self.severity,
                "title": self.title, "stage": self.stage, **{k.lower(): v for k, v in self.sections.items()}}


REGISTRY: dict[str, Check] = {}


def parse_sections(doc: str) -> dict[str, str]:
    """Split a docstring into its `What:` / `Why:` / `Fix:` sections (each may span lines)."""
    out: dict[str, list[str]] = {}
    current: str | None = None
    for raw in (doc or "").strip().splitlines():
        line = raw.strip()
        m = re.match(r"^(What|Why|Fix):\s*(.*)$", line)
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
    REGISTRY[entry.id] = entry
    return entry


def check(id: str, *, category: str, severity: str, title: str, stage: str = "local",
          timeout: float = 10.0) -> Callable[[Callable[..., Iterable[Problem]]], Callable[..., Iterable[Problem]]]:
    """Register a check. The decorated function's docstring is its documentation."""
    def wrap(func: Callable[..., Iterable[Problem]]) -> Callable[..., Iterable[Problem]]:
        _register(Check(id=id, category=category, severity=severity, title=title, stage=stage,
                        func=func, doc=func.__doc__ or "", timeout=timeout))
        return func
    return wrap


def declare(id: str, *, category: str, severity: str, title: str, doc: str) -> Check:
    """Declare an event: a finding the machinery raises, documented like a check."""
    return _register(Check(id=id, category=category, severity=severity, title=title,
                           stage="event", func=None, doc=doc, timeout=0.0))


CHECK_MODULES = (
    "ddp_doctor.checks.internal",
    "ddp_doctor.checks.rendezvous",
    "ddp_doctor.checks.launcher_env",
    "ddp_doctor.checks.sagemaker_env",
    "ddp_doctor.checks.network",
    "ddp_doctor.checks.communication",
    "ddp_doctor.checks.consistency",
    "ddp_doctor.checks.gpu",
    "ddp_doctor.checks.host",
    "ddp_doctor.checks.sagemaker_job",
    "ddp_doctor.checks.ci_runner",
    "ddp_doctor.checks.training_failures",
    "ddp_doctor.checks.signatures",
    "ddp_doctor.training.sampler_check",
    "ddp_doctor.checks.training_probes",
)


EXTRA_MODULES_ENV = "DDP_DOCTOR_CHECK_MODULES"


def load_catalogue() -> dict[str, Check]:
    """Import every check module (registration happens at import) and return the registry.

    Teams add checks of their own by naming their modules in DDP_DOCTOR_CHECK_MODULES
    (comma-separated); they register with the same decorator and ID rules."""
    extra = [m.strip() for m in os.environ.get(EXTRA_MODULES_ENV, "").split(",") if m.strip()]
    for name in CHECK_MODULES:
        importlib.import_module(name)
    for name in extra:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - a broken plugin is reported, not fatal
            LOAD_ERRORS[name] = f"{type(e).__name__}: {e}"
    return REGISTRY


# module name -> why it could not be imported (reported by the runner as DDP001)
LOAD_ERRORS: dict[str, str] = {}


def get(id: str) -> Check:
    load_catalogue()
    return REGISTRY[id]


def parse_selectors(values: Iterable[str] | None) -> list[str]:
    """`--select DDP101,network --select DDP2` -> ["DDP101", "network", "DDP2"]."""
    out: list[str] = []
    for v in values or ():
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return out


def unknown_selectors(selectors: Iterable[str]) -> list[str]:
    """Selectors that match no ID, ID prefix or category (a usage error)."""
    load_catalogue()
    bad = []
    for s in selectors:
        if s in CATEGORIES:
            continue
        if not any(cid.startswith(s.upper()) for cid in REGISTRY):
            bad.append(s)
    return bad


def _matches(entry: Check, selector: str) -> bool:
    return selector == entry.category or entry.id.startswith(selector.upper())


def selected(entry: Check, select: list[str], skip: list[str]) -> bool:
    """Ruff-style selection: by exact ID, ID prefix (`DDP2`) or category name."""
    if select and not any(_matches(entry, s) for s in select):
        return False
    return not any(_matches(entry, s) for s in skip)


def checks_for(stage: str, select: list[str] | None = None, skip: list[str] | None = None) -> list[Check]:
    load_catalogue()
    return [c for c in sorted(REGISTRY.values(), key=lambda c: c.id)
            if c.stage == stage and selected(c, select or [], skip or [])]
