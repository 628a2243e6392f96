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
    "sampler", "init_order", "teardown", "training_failure", "sagemaker_job", "internal",
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


@dataclass
class Finding:
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "category": self.category, "severity": self.severity,
            "title": self.title, "message": self.message, "hint": self.hint,
            "ranks": sorted(self.ranks), "evidence": self.evidence, "phase": self.phase,
            "time": self.time,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Finding":
        return cls(
            id=str(d["id"]), category=str(d.get("category", "internal")),
            severity=str(d.get("severity", "error")), title=str(d.get("title", "")),
            message=str(d.get("message", "")), hint=str(d.get("hint", "")),
            ranks=[int(r) for r in d.get("ranks", [])], evidence=dict(d.get("evidence") or {}),
            phase=str(d.get("phase", "preflight")), time=float(d.get("time", 0.0)),
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
