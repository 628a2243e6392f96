"""Human-readable text for a report: a verdict line, the root cause, then findings by severity."""
from __future__ import annotations

from typing import Any

from ddp_doctor.findings import format_ranks

HEADINGS = (("error", "Errors"), ("warning", "Warnings"), ("info", "Info"))


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return ""
    return f" [rank {format_ranks(ranks)}]" if len(ranks) == 1 else f" [ranks {format_ranks(ranks)}]"


def _launcher(world: dict[str, Any]) -> str:
    """The launcher as the user knows it: ddp-doctor's own local ranks, or the launcher seen."""
    if world.get("launched_by") == "ddp-doctor":
        ws, nnodes = world.get("world_size"), world.get("nnodes") or 1
        per_node = f"{ws // nnodes} local rank(s)" + (" per node" if nnodes > 1 else "") if ws else "local ranks"
        return f"ddp-doctor ({per_node})"
    return str(world.get("launcher"))


def _where(world: dict[str, Any]) -> str:
    if world.get("planned"):  # sagemaker-check: the job as configured, no rank has run
        count, kind = world.get("instance_count"), world.get("instance_type")
        ws = world.get("world_size")
        return (f"planned job: {count if count is not None else '?'} x {kind or 'instance type unknown'}"
                + (f", {ws} rank(s)" if ws else "") + f", distribution {world.get('distribution') or 'none'}")
    ws = world.get("world_size")
    return ((f"{ws} rank(s)" if ws is not None else "world size unknown")
            + (f" on {world['nnodes']} node(s)" if world.get("nnodes") else "")
            + f", launcher {_launcher(world)}, backend {world.get('backend')}")


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a.get("id"), a.get("message"), a.get("ranks")) == (b.get("id"), b.get("message"), b.get("ranks"))


def _site(f: dict[str, Any]) -> str | None:
    """The user's file:line a finding points to, when its evidence has one and its message does not
    say it already."""
    ev = f.get("evidence") or {}
    at = ev.get("where") if isinstance(ev.get("where"), str) else None  # a hang's "where" is per rank
    where = ev.get("raised_at") or ev.get("user_line") or at
    return str(where) if where and str(where) not in str(f.get("message", "")) else None


def render_text(report: dict[str, Any], *, report_path: str | None = None, verbose: bool = False,
                command: str | None = None) -> str:
    """The report as text, each finding once: the headline (`command`, e.g. "bench-comm", else the
    report's phase), the root cause with the user's line and, under it, its consequences; then the
    other findings by severity. On a failure the info findings and the measurements are only
    counted unless `verbose`: the lines that matter come first and alone."""
    world = report.get("world") or {}
    findings = report.get("findings") or []
    counts = {s: sum(1 for f in findings if f["severity"] == s) for s, _ in HEADINGS}
    status = str(report.get("status", "fail")).upper()
    failed = status in ("FAIL", "INTERRUPTED")
    lines = [f"ddp-doctor {command or report.get('phase', 'preflight')}: {status} "
             f"({counts['error']} error(s), {counts['warning']} warning(s)) - {_where(world)}"]
    cause = report.get("root_cause")
    shown: list[dict[str, Any]] = []
    if cause:
        lines.append(f"Root cause: {cause['id']} {cause['title']}{_ranks(cause.get('ranks', []))}")
        lines.append(f"  {cause['message']}")
        site = _site(cause)
        if site:
            lines.append(f"  at {site}")
        lines.append(f"  Fix: {cause['hint']}")
        shown = [f for f in findings if _same(f, cause)]
        then = [f for f in findings if f.get("caused_by") == cause["id"] and not _same(f, cause)]
        if then:
            lines.append("  Then, as a consequence:")
            for f in then:
                lines.append(f"    {f['id']}{_ranks(f.get('ranks', []))}: {f['message']}")
            shown += then
    rest = [f for f in findings if not any(f is g for g in shown)]
    for severity, heading in HEADINGS:
        group = [f for f in rest if f["severity"] == severity]
        if severity == "error" and cause and group:
            heading = "Other errors"
        if not group or (severity == "info" and not verbose and (failed or len(group) > 5)):
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
    if ar and (verbose or not failed):
        big = max(ar, key=lambda m: m.get("bytes", 0))
        lines.append(f"all_reduce: {big['bytes']} bytes in {big['time_us']:.0f} us, "
                     f"busbw {big['busbw_gbps']:.3f} GB/s, {'correct' if big.get('correct') else 'WRONG'}")
    if report_path:
        lines.append(f"Report: {report_path}")
    return "\n".join(lines)


def verdict_line(report: dict[str, Any], *, report_path: str | None = None, command: str | None = None) -> str:
    """One line for the end of a run, pass included: the status, the root cause (or the counts) and
    where the report is."""
    status = str(report.get("status", "fail")).upper()
    cause = report.get("root_cause")
    findings = report.get("findings") or []
    if cause:
        what = f"{cause['id']}{_ranks(cause.get('ranks', []))} {cause['title']}"
    else:
        errors = sum(1 for f in findings if f["severity"] == "error")
        warnings = sum(1 for f in findings if f["severity"] == "warning")
        what = f"{errors} error(s), {warnings} warning(s)"
    return (f"ddp-doctor {command or report.get('phase', 'preflight')}: {status} - {what}"
            + (f" - report {report_path}" if report_path else ""))
