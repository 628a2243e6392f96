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

# What kind of cause a finding is, and what an orchestrator should do with a job it ended
# (docs/report-schema.md): the code or the configuration is wrong (a retry only burns money), a
# host is bad (run again without it), a transient network fault (run again), or nobody can tell yet.
CAUSE_CLASSES = ("code", "configuration", "host", "network", "unknown")
ACTIONS = ("fix_code", "fix_configuration", "retry", "exclude_host", "investigate")
ACTION_OF_CLASS = {"code": "fix_code", "configuration": "fix_configuration", "host": "exclude_host",
                   "network": "retry", "unknown": "investigate"}
# an ID that declares no class of its own takes its category's (registry.check / declare)
CLASS_OF_CATEGORY = {
    "launcher_env": "configuration", "topology": "configuration", "network": "network",
    "communication": "unknown", "gpu": "host", "host": "host", "consistency": "configuration",
    "sampler": "code", "init_order": "code", "teardown": "code", "training_failure": "code",
    "sagemaker_job": "configuration", "post_mortem": "unknown", "internal": "unknown",
}


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
    # this problem's kind of cause and action, where the evidence decides it rather than the ID
    # (a SIGKILL the OOM killer sent); None: the check's declared ones
    cause_class: str | None = None
    action: str | None = None


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
    cause_class: str = ""  # one of CAUSE_CLASSES; "" for the category's (CLASS_OF_CATEGORY)
    action: str = ""       # one of ACTIONS; "" for the class's (ACTION_OF_CLASS)

    @property
    def kind(self) -> tuple[str, str]:
        """(cause_class, action): as declared, else the category's class and that class's action."""
        cause = self.cause_class or CLASS_OF_CATEGORY.get(self.category, "unknown")
        return cause, self.action or ACTION_OF_CLASS[cause]

    def to_dict(self) -> dict[str, Any]:
        evidence = self.evidence
        if self.caused_by is not None:  # the evidence keys readers of schema 1 know, kept for them
            evidence = {**evidence, "consequence": True,
                        **({"explained_by": self.caused_by} if self.caused_by != ROOT_CAUSE else {})}
        return {
            "id": self.id, "category": self.category, "severity": self.severity,
            "title": self.title, "message": self.message, "hint": self.hint,
            "ranks": sorted(r for r in self.ranks if r >= 0), "evidence": evidence, "phase": self.phase,
            "time": self.time, "caused_by": self.caused_by,
            "cause_class": self.kind[0], "action": self.kind[1],
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
            cause_class=str(d.get("cause_class") or "") if d.get("cause_class") in CAUSE_CLASSES else "",
            action=str(d.get("action") or "") if d.get("action") in ACTIONS else "",
        )


def severity_rank(severity: str) -> int:
    """0 for error, 1 for warning, 2 for info: sort key, most severe first."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else 0


def _runs(ranks: Iterable[int]) -> list[tuple[int, int]]:
    """[0, 1, 2, 3, 7] -> [(0, 3), (7, 7)]: the consecutive runs of a rank list, sorted."""
    runs: list[tuple[int, int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r)
        else:
            runs.append((r, r))
    return runs


def _run_text(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def format_ranks(ranks: Iterable[int]) -> str:
    """Compact rank lists for messages: [0, 1, 2, 3, 7] -> "0-3, 7"."""
    return ", ".join(_run_text(lo, hi) for lo, hi in _runs(ranks))


def brief_ranks(ranks: Iterable[int], parts: int = 6) -> str:
    """format_ranks for a line a person reads: at most `parts` runs, then how many ranks the
    rest holds ("0, 8, 16, 24, 32, 40 and 506 more rank(s) in 506 runs"), so a line stays short
    whatever the world size. Where the full list is kept, it is a finding's `ranks`; the report
    reads this form back only to recognise a finding's own ranks (report/build.py)."""
    runs = _runs(ranks)
    shown = ", ".join(_run_text(lo, hi) for lo, hi in runs[:parts])
    if len(runs) <= parts:
        return shown
    rest = runs[parts:]
    return (f"{shown} and {sum(hi - lo + 1 for lo, hi in rest)} more rank(s) in {len(rest)} "
            + ("run" if len(rest) == 1 else "runs"))
