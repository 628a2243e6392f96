"""Findings are data: what a check saw on which ranks, and what to do about it.

A check yields :class:`Problem` objects (message, hint, evidence); the runner stamps them with the
check's ID, category and severity and the rank that saw them, giving a :class:`Finding`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable

CATEGORIES = (
    "launcher_env", "topology", "network", "communication", "gpu", "host", "consistency",
    "sampler", "init_order", "teardown", "training_failure", "sagemaker_job", "post_mortem", "internal",
)
SEVERITIES = ("error", "warning", "info")
PHASES = ("preflight", "training", "teardown")


@dataclass(frozen=True)
class Problem:
    """What a check yields: the observed values in `message`, what to do in `hint` (optional
    override of the check's default hint), machine-readable `evidence`, and an optional severity
    override (a check may downgrade or upgrade a single problem: every severity it uses must be
    declared with `@check(..., severities=...)` and explained in its docstring's Severity section)."""

    message: str
    hint: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    severity: str | None = None
    ranks: tuple[int, ...] | None = None  # cross-rank checks name the ranks involved


# `caused_by` of a consequence whose rule knows another rank's failure caused it, but not which
# finding says so: the report names its root cause there (report/build.py).
ROOT_CAUSE = "root_cause"


@dataclass
class Finding:
    """One problem on the ranks named. `time`: when it happened (the event's time, which orders
    causes: the earliest error that is no consequence is the root cause). `caused_by`: None, or
    this finding is a consequence of another: the ID of the finding that explains it (ROOT_CAUSE
    until the report resolves it). A consequence stays in the report, labelled, and is never the
    root cause while a cause exists."""

    id: str
    category: str
    severity: str
    title: str
    message: str
    hint: str
    ranks: list[int] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    phase: str = "preflight"
    time: float = field(default_factory=time.time)
    caused_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        evidence = self.evidence
        if self.caused_by is not None:  # the evidence keys readers of schema 1 know, kept for them
            evidence = {**evidence, "consequence": True,
                        **({"explained_by": self.caused_by} if self.caused_by != ROOT_CAUSE else {})}
        return {
            "id": self.id, "category": self.category, "severity": self.severity,
            "title": self.title, "message": self.message, "hint": self.hint,
            "ranks": sorted(self.ranks), "evidence": evidence, "phase": self.phase,
            "time": self.time, "caused_by": self.caused_by,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Finding":
        evidence = dict(d.get("evidence") or {})
        caused_by = d.get("caused_by")
        if caused_by is None and evidence.get("consequence"):  # a report written before the field
            caused_by = str(evidence.get("explained_by") or ROOT_CAUSE)
        return cls(
            id=str(d["id"]), category=str(d.get("category", "internal")),
            severity=str(d.get("severity", "error")), title=str(d.get("title", "")),
            message=str(d.get("message", "")), hint=str(d.get("hint", "")),
            ranks=[int(r) for r in d.get("ranks", [])], evidence=evidence,
            phase=str(d.get("phase", "preflight")), time=float(d.get("time", 0.0)),
            caused_by=str(caused_by) if caused_by is not None else None,
        )


def severity_rank(severity: str) -> int:
    """0 for error, 1 for warning, 2 for info: sort key, most severe first."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else 0


def format_ranks(ranks: Iterable[int]) -> str:
    """Compact rank lists for messages: [0, 1, 2, 3, 7] -> "0-3, 7"."""
    rs = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(parts)
