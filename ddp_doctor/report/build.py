"""The report: every rank's findings merged into one document (schema_version 1, DESIGN.md).

Pure functions over findings and plain dicts; rendering and writing live in render.py / sinks.py.
"""
from __future__ import annotations

from typing import Any, Iterable

from ddp_doctor.exit_codes import EXIT_FAILED, EXIT_OK
from ddp_doctor.findings import Finding, severity_rank
from ddp_doctor.version import __version__

SCHEMA = "ddp-doctor.report"
SCHEMA_VERSION = 1


def merge_findings(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per (id, message, hint): the same problem seen on many ranks is listed once
    with all their ranks, at the time it was first seen."""
    merged: dict[tuple[str, str, str], Finding] = {}
    for f in findings:
        key = (f.id, f.message, f.hint)
        if key in merged:
            m = merged[key]
            m.ranks = sorted(set(m.ranks) | set(f.ranks))
            m.time = min(m.time, f.time)
        else:
            merged[key] = Finding(**{**f.__dict__, "ranks": sorted(set(f.ranks)),
                                     "evidence": dict(f.evidence)})
    return sorted(merged.values(), key=lambda f: (severity_rank(f.severity), f.time, f.id))


def status_of(findings: Iterable[Finding]) -> str:
    severities = {f.severity for f in findings}
    return "fail" if "error" in severities else "warn" if "warning" in severities else "pass"


def root_cause(findings: Iterable[Finding]) -> Finding | None:
    """The earliest error: the first thing that went wrong, not the ranks that then timed out
    waiting for it. Findings marked `evidence.consequence` (a peer that failed because another
    rank did) are passed over while a real cause exists."""
    errors = [f for f in findings if f.severity == "error"]
    if not errors:
        return None
    causes = [f for f in errors if not f.evidence.get("consequence")] or errors
    return min(causes, key=lambda f: (f.time, f.id))


def build_report(*, world: dict[str, Any], ranks: list[dict[str, Any]], findings: Iterable[Finding],
                 measurements: dict[str, Any] | None = None, phase: str = "preflight") -> dict[str, Any]:
    merged = merge_findings(findings)
    cause = root_cause(merged)
    return {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "tool_version": __version__,
        "status": status_of(merged), "phase": phase, "world": world,
        "ranks": sorted(ranks, key=lambda r: (r.get("rank") is None, r.get("rank") or 0)),
        "findings": [f.to_dict() for f in merged],
        "measurements": measurements or {},
        "root_cause": cause.to_dict() if cause else None,
    }


def exit_code(report: dict[str, Any]) -> int:
    return EXIT_FAILED if report.get("status") == "fail" else EXIT_OK


def findings_of(report: dict[str, Any]) -> list[Finding]:
    return [Finding.from_dict(d) for d in report.get("findings", [])]


def world_of(ctx: Any, *, world_size: int | None = None) -> dict[str, Any]:
    """The report's `world` block from a RankContext."""
    sm = ctx.sagemaker
    return {
        "launcher": ctx.launcher.name, "backend": ctx.backend,
        "world_size": world_size if world_size is not None else ctx.world_size,
        "nnodes": ctx.nnodes, "nproc_per_node": ctx.local_world_size,
        "master_addr": ctx.master_addr, "master_port": ctx.master_port,
        "platform": "sagemaker" if sm is not None else None,
    }


def rank_entry(view: dict[str, Any]) -> dict[str, Any]:
    """The report's per-rank line from a rank's view (see views.collect_view)."""
    return {"rank": view.get("rank"), "local_rank": view.get("local_rank"),
            "node_rank": view.get("node_rank"), "host": view.get("hostname"),
            "device": view.get("device")}
