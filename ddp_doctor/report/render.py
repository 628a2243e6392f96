"""Human-readable text for a report: a verdict line, the root cause, then findings by severity."""
from __future__ import annotations

from typing import Any

from ddp_doctor.findings import format_ranks

HEADINGS = (("error", "Errors"), ("warning", "Warnings"), ("info", "Info"))


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return ""
    return f" [rank {format_ranks(ranks)}]" if len(ranks) == 1 else f" [ranks {format_ranks(ranks)}]"


def render_text(report: dict[str, Any], *, report_path: str | None = None, verbose: bool = False,
                command: str | None = None) -> str:
    """The report as text; the headline names `command` (e.g. "bench-comm") when given, else the
    report's phase."""
    world = report.get("world") or {}
    findings = report.get("findings") or []
    counts = {s: sum(1 for f in findings if f["severity"] == s) for s, _ in HEADINGS}
    status = str(report.get("status", "fail")).upper()
    ws = world.get("world_size")
    where = ((f"{ws} rank(s)" if ws is not None else "world size unknown")
             + (f" on {world['nnodes']} node(s)" if world.get("nnodes") else "")
             + f", launcher {world.get('launcher')}, backend {world.get('backend')}")
    lines = [f"ddp-doctor {command or report.get('phase', 'preflight')}: {status} "
             f"({counts['error']} error(s), {counts['warning']} warning(s)) - {where}"]
    cause = report.get("root_cause")
    if cause:
        lines.append(f"Root cause: {cause['id']} {cause['title']}{_ranks(cause.get('ranks', []))}")
        lines.append(f"  {cause['message']}")
        lines.append(f"  Fix: {cause['hint']}")
    for severity, heading in HEADINGS:
        group = [f for f in findings if f["severity"] == severity]
        if not group or (severity == "info" and not verbose and len(group) > 5):
            if group:
                lines.append(f"{heading}: {len(group)} (shown with --verbose or in the JSON report)")
            continue
        lines.append(f"{heading}:")
        for f in group:
            lines.append(f"  {f['id']} {f['title']}{_ranks(f.get('ranks', []))}")
            lines.append(f"      {f['message']}")
            if severity != "info" or verbose:
                lines.append(f"      Fix: {f['hint']}")
    ar = (report.get("measurements") or {}).get("all_reduce") or []
    if ar:
        big = max(ar, key=lambda m: m.get("bytes", 0))
        lines.append(f"all_reduce: {big['bytes']} bytes in {big['time_us']:.0f} us, "
                     f"busbw {big['busbw_gbps']:.3f} GB/s, {'correct' if big.get('correct') else 'WRONG'}")
    if report_path:
        lines.append(f"Report: {report_path}")
    return "\n".join(lines)
