"""Human-readable text for a report: a verdict line, the root cause, then findings by severity."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ddp_doctor.findings import brief_ranks

HEADINGS = (("error", "Errors"), ("warning", "Warnings"), ("info", "Info"))
# The text is read on a screen: past SCREEN_LINES lines it is written again, tighter (see FITS),
# until it fits; the JSON report keeps everything the text leaves out.
SCREEN_LINES = 40
WIDTH = 200


@dataclass(frozen=True)
class _Fit:
    """How tight the text is written. `width`: a message longer is cut; `per_id`: messages shown
    of the findings that share an ID (one title, one Fix); `per_heading`: IDs shown under a
    heading; `consequences`: those listed under the root cause. None: no limit."""

    width: int | None = None
    per_id: int | None = None
    per_heading: int | None = None
    consequences: int | None = None


# The full text first (what a small job always gets), then tighter ones while it is too long.
FITS = (_Fit(), _Fit(WIDTH, 3, 8, 5), _Fit(WIDTH, 1, 5, 3), _Fit(WIDTH, 1, 3, 1))


def _ranks(ranks: list[int]) -> str:
    if not ranks:
        return ""
    return f" [rank {brief_ranks(ranks)}]" if len(ranks) == 1 else f" [ranks {brief_ranks(ranks)}]"


def _cut(line: str, width: int | None) -> str:
    """A line at most `width` characters long (cut ones end in " ...": the JSON has them whole)."""
    return line if width is None or len(line) <= width else line[: width - 4] + " ..."


def _launcher(world: dict[str, Any]) -> str:
    """The launcher as the user knows it: ddp-doctor's own local ranks, or the launcher seen."""
    if world.get("launched_by") == "ddp-doctor":
        ws, nnodes = world.get("world_size"), world.get("nnodes") or 1
        per_node = f"{ws // nnodes} local rank(s)" + (" per node" if nnodes > 1 else "") if ws else "local ranks"
        return f"ddp-doctor ({per_node})"
    return str(world.get("launcher") or "unknown")


def _where(world: dict[str, Any]) -> str:
    if world.get("planned"):  # sagemaker-check: the job as configured, no rank has run
        count, kind = world.get("instance_count"), world.get("instance_type")
        ws = world.get("world_size")
        return (f"planned job: {count if count is not None else '?'} x {kind or 'instance type unknown'}"
                + (f", {ws} rank(s)" if ws else "") + f", distribution {world.get('distribution') or 'none'}")
    ws = world.get("world_size")
    return ((f"{ws} rank(s)" if ws is not None else "world size unknown")
            + (f" on {world['nnodes']} node(s)" if world.get("nnodes") else "")
            + f", launcher {_launcher(world)}, backend {world.get('backend') or 'unknown'}")


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
    other findings by severity. The info findings are only counted unless `verbose`, whatever the
    status (and on a failure the measurements too): the lines that matter come first and alone. A text longer than a
    screen (SCREEN_LINES) is written tighter (FITS): the findings of one ID under one title and one
    Fix, a few of each, long messages cut; what is left out is counted and stays in the JSON."""
    for fit in FITS:
        lines = _lines(report, report_path, verbose, command, fit)
        if len(lines) <= SCREEN_LINES:
            break
    return "\n".join(lines)


def _lines(report: dict[str, Any], report_path: str | None, verbose: bool, command: str | None,
           fit: _Fit) -> list[str]:
    findings = report.get("findings") or []
    status = str(report.get("status", "fail")).upper()
    failed = status in ("FAIL", "INTERRUPTED")
    lines = [headline(report, command)]
    cause = report.get("root_cause")
    shown: set[int] = set()  # id() of the findings said under the root cause
    if cause:
        lines.append(f"Root cause: {cause['id']} {cause['title']}{_ranks(cause.get('ranks', []))}")
        lines.append(_cut(f"  {cause['message']}", fit.width))
        site = _site(cause)
        if site:
            lines.append(f"  at {site}")
        lines.append(f"  Fix: {cause['hint']}")
        nxt = next_step(cause)
        if nxt:
            lines.append(_cut(f"  Next: {nxt}", fit.width))
        shown = {id(f) for f in findings if _same(f, cause)}
        then = [f for f in findings if f.get("caused_by") == cause["id"] and id(f) not in shown]
        if then:
            lines.append("  Then, as a consequence:")
            for f in then[:fit.consequences]:
                lines.append(_cut(f"    {f['id']}{_ranks(f.get('ranks', []))}: {f['message']}", fit.width))
            if fit.consequences is not None and len(then) > fit.consequences:
                lines.append(f"    ... and {len(then) - fit.consequences} more (in the JSON report)")
            shown |= {id(f) for f in then}
    rest = [f for f in findings if id(f) not in shown]
    for severity, heading in HEADINGS:
        group = [f for f in rest if f["severity"] == severity]
        if severity == "error" and cause and group:
            heading = "Other errors"
        if not group or (severity == "info" and not verbose):  # one rule whatever the status
            if group:
                lines.append(f"{heading}: {len(group)} (shown with --verbose or in the JSON report)")
            continue
        lines.append(f"{heading}:")
        fix = severity != "info" or verbose
        if fit.per_id is None:
            for f in group:
                lines.append(f"  {f['id']} {f['title']}{_ranks(f.get('ranks', []))}")
                lines.append(f"      {f['message']}")
                if fix:
                    lines.append(f"      Fix: {f['hint']}")
            continue
        lines += _by_id(group, fit, fix)
    ar = (report.get("measurements") or {}).get("all_reduce") or []
    if ar and (verbose or not failed):
        big = max(ar, key=lambda m: m.get("bytes", 0))
        lines.append(f"all_reduce: {all_reduce_figure(big)}")
    if report_path:
        lines.append(f"Report: {report_path}")
    return lines


def all_reduce_figure(big: dict[str, Any]) -> str:
    """The largest size of an all_reduce sweep in a few words. A group of one rank crosses no link:
    its time is a local no-op's, so no bandwidth is quoted for it."""
    result = "correct" if big.get("correct") else "WRONG"
    if big.get("nranks") == 1:
        return f"{big['bytes']} bytes over 1 rank: no link crossed, no bandwidth to measure; {result}"
    return f"{big['bytes']} bytes in {big['time_us']:.0f} us, busbw {big['busbw_gbps']:.3f} GB/s, {result}"


def _by_id(group: list[dict[str, Any]], fit: _Fit, fix: bool) -> list[str]:
    """The tighter text of one heading's findings: those of one ID under one title (all their
    ranks) and one Fix, `fit.per_id` messages of them (each with its ranks when the ID's are
    several findings'), `fit.per_heading` IDs; the rest counted."""
    ids: dict[str, list[dict[str, Any]]] = {}
    for f in group:
        ids.setdefault(f["id"], []).append(f)
    lines: list[str] = []
    for same in list(ids.values())[:fit.per_heading]:
        first = same[0]
        ranks = sorted({r for f in same for r in f.get("ranks", [])})
        lines.append(f"  {first['id']} {first['title']}{_ranks(ranks)}")
        for f in same[:fit.per_id]:
            # whose message it is, when the title's ranks are several findings' and it does not say
            own = f.get("ranks") or []
            tag = _ranks(own).strip() + " " if own != ranks and brief_ranks(own) not in f["message"] else ""
            lines.append(_cut(f"      {tag}{f['message']}", fit.width))
        if fit.per_id is not None and len(same) > fit.per_id:
            lines.append(f"      ... and {len(same) - fit.per_id} more {first['id']} finding(s) (in the JSON report)")
        if fix:
            lines.append(f"      Fix: {first['hint']}")
    hidden = list(ids)[fit.per_heading:] if fit.per_heading is not None else []
    if hidden:
        count = sum(len(ids[i]) for i in hidden)
        names = ", ".join(hidden[:8]) + (f" and {len(hidden) - 8} more" if len(hidden) > 8 else "")
        lines.append(f"  ... and {count} more finding(s): {names} (in the JSON report)")
    return lines


_COLOURS = {"PASS": "32", "WARN": "33", "FAIL": "31", "INTERRUPTED": "31", "RUNNING": "36"}  # ANSI SGR
_STATUS = re.compile(r"^(ddp-doctor [^:\n]+: )(PASS|WARN|FAIL|INTERRUPTED|RUNNING)\b")


def coloured(text: str) -> str:
    """`text` with its headline's status in colour (green pass, yellow warn, red fail), for a terminal."""
    return _STATUS.sub(lambda m: f"{m.group(1)}\033[1;{_COLOURS[m.group(2)]}m{m.group(2)}\033[0m", text, count=1)


NEXT_STEPS = {
    "fix_code": "fix the code (cause: code); running the job again fails the same way",
    "fix_configuration": "fix the configuration (cause: configuration); running the job again fails the same way",
    "retry": "run the job again (cause: a transient network fault)",
    "exclude_host": "run the job again without {hosts} (cause: the host)",
    "investigate": "look into it before running again (cause: {cause}; the evidence does not say whether a "
                   "retry would pass)",
}


def next_step(cause: dict[str, Any]) -> str:
    """What to do with the job, from the root cause's action (its cause_class, the hosts to leave out)."""
    text = NEXT_STEPS.get(str(cause.get("action") or ""))
    if not text:
        return ""
    ranks = cause.get("ranks") or []
    hosts = ", ".join(cause.get("hosts") or []) or (f"the host of rank {brief_ranks(ranks)}" if ranks else "that host")
    return text.format(hosts=hosts, cause=cause.get("cause_class") or "unknown")


def headline(report: dict[str, Any], command: str | None = None) -> str:
    """The first line of every command's verdict: the command (else the report's phase), the
    status, the counts, the world, the launcher and the backend ("unknown" where not known)."""
    findings = report.get("findings") or []
    counts = {s: sum(1 for f in findings if f["severity"] == s) for s, _ in HEADINGS}
    status = str(report.get("status", "fail")).upper()
    return (f"ddp-doctor {command or report.get('phase', 'preflight')}: {status} "
            f"({counts['error']} error(s), {counts['warning']} warning(s)) - {_where(report.get('world') or {})}")


def verdict_line(report: dict[str, Any], *, report_path: str | None = None, command: str | None = None) -> str:
    """One line for the end of a run, pass included: the headline every verdict starts with, the
    root cause when there is one, and where the report is."""
    cause = report.get("root_cause")
    return (headline(report, command)
            + (f"; root cause {cause['id']}{_ranks(cause.get('ranks', []))} {cause['title']}" if cause else "")
            + (f" - report {report_path}" if report_path else ""))
