"""The report: every rank's findings merged into one document (schema_version 1, docs/report-schema.md).

Pure functions over findings and plain dicts; rendering and writing live in render.py / sinks.py.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

from ddp_doctor.exit_codes import EXIT_FAILED, EXIT_OK
from ddp_doctor.findings import ROOT_CAUSE, Finding, format_ranks, severity_rank
from ddp_doctor.version import __version__

SCHEMA = "ddp-doctor.report"
SCHEMA_VERSION = 1


# A mention of ranks in a message or hint: "rank 3", "Rank 3", "ranks 0-3, 7", "rank(s) 1, 2",
# "local rank 1", and torch's log prefix "[rank1]". Only the finding's own ranks are taken out
# (see _normalise): "after rank 1 failed" in rank 0's finding is part of what it says.
_MENTION = re.compile(
    r"(?<![\w=\[])(?P<word>local\s+ranks?|ranks?\(s\)|ranks?)\s+"
    r"(?P<list>\d+(?:(?:\s*,\s*|\s*-\s*)\d+)*)(?!\w|\.\d)", re.I)
_PREFIX = re.compile(r"\[rank(?P<n>\d+)\]")
_PLACEHOLDER = re.compile(r"\x00(?P<kind>[a-z(s)]+)(?P<cap>[01])\x00")


def _expand(pieces: list[str]) -> set[int]:
    """"0-3", "7" -> {0, 1, 2, 3, 7}."""
    out: set[int] = set()
    for p in pieces:
        a, _, b = p.partition("-")
        lo, hi = int(a), int(b or a)
        if hi - lo > 100000:
            return {-1}
        out.update(range(lo, hi + 1))
    return out


def _normalise(text: str, ranks: set[int]) -> str:
    """`text` with every mention of exactly the finding's own ranks replaced by a placeholder that
    remembers the form ("rank", "rank(s)", "local rank", "[rank]") and its capital letter. A
    finding about ranks 0 and 1 keeps "Rank 1 is running ..., but Rank 0 ...": one rank of
    several is part of what it says."""
    if not ranks or not text:
        return text

    def mention(m: re.Match[str]) -> str:
        word = m.group("word")
        pieces = [p.replace(" ", "") for p in re.split(r"\s*,\s*", m.group("list"))]
        for n in range(len(pieces), 0, -1):  # the longest prefix of the list naming exactly its ranks
            if _expand(pieces[:n]) == ranks:
                kind = ("local" if word.lower().startswith("local") else
                        "rank(s)" if word.lower().endswith("(s)") else "rank")
                return f"\x00{kind}{int(word[0].isupper())}\x00{_tail(m.group('list'), pieces[:n])}"
        return m.group(0)

    text = _MENTION.sub(mention, text)
    return _PREFIX.sub(lambda m: "\x00prefix0\x00" if {int(m.group("n"))} == ranks else m.group(0), text)


def _tail(listed: str, taken: list[str]) -> str:
    """What follows the taken pieces of a listed "0-3, 7, 9" (", 9" when "0-3", "7" were taken)."""
    compact = re.sub(r"\s+", "", listed)
    taken_text = ",".join(taken)
    if compact == taken_text:
        return ""
    # the original spacing of the rest is not kept: ", 9"
    rest = compact[len(taken_text):].lstrip(",")
    return ", " + ", ".join(rest.split(",")) if rest else ""


def _render(text: str, ranks: list[int]) -> str:
    """A normalised text with the placeholders written out for the merged `ranks`."""
    listed = format_ranks(ranks)
    many = len(set(ranks)) > 1

    def one(m: re.Match[str]) -> str:
        kind, cap = m.group("kind"), m.group("cap") == "1"
        if kind == "prefix":
            return f"[rank{listed}]" if not many else f"[ranks {listed}]"
        word = {"rank": "ranks" if many else "rank", "rank(s)": "rank(s)",
                "local": "local ranks" if many else "local rank"}[kind]
        return f"{word[0].upper() + word[1:] if cap else word} {listed}"

    return _PLACEHOLDER.sub(one, text)


def merge_findings(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per (id, severity, message and hint modulo the finding's own ranks): the same
    problem seen on many ranks ("rank 0 raised X", "rank 1 raised X") is listed once with all
    their ranks ("ranks 0-1 raised X"), at the time it was first seen. Identical texts merge first
    (so "the host of rank 0" in every rank's hint stays what it says); then texts equal but for
    the mention of their own ranks. Messages that differ in anything else (another rank named,
    another value) stay separate findings. Where the merged findings' evidence differs, each
    rank's is kept under evidence["per_rank"] (keyed by the rank list as format_ranks writes
    it), the earliest one's at the top level as before."""
    exact = _merge(findings, lambda f: (f.id, f.severity, f.message, f.hint), render=False)
    return _merge(exact, lambda f: (f.id, f.severity, _normalise(f.message, set(f.ranks)),
                                    _normalise(f.hint, set(f.ranks))), render=True)


def _merge(findings: Iterable[Finding], key: Any, *, render: bool) -> list[Finding]:
    groups: dict[tuple[str, str, str, str], list[Finding]] = {}
    for f in findings:
        groups.setdefault(key(f), []).append(f)
    merged: list[Finding] = []
    for (_, _, message, hint), group in groups.items():
        first = min(group, key=lambda f: f.time)
        ranks = sorted({r for f in group for r in f.ranks})
        evidence = dict(first.evidence)
        if len(group) > 1:
            per_rank: dict[str, Any] = {}
            for f in group:
                inner = {k: v for k, v in f.evidence.items() if k != "per_rank"}
                for sub, ev in (f.evidence.get("per_rank") or {format_ranks(f.ranks) or "-": inner}).items():
                    per_rank.setdefault(sub, ev)
            if len({repr(v) for v in per_rank.values()}) > 1:
                evidence["per_rank"] = per_rank
            else:
                evidence.pop("per_rank", None)
        again = render and len(group) > 1
        merged.append(Finding(**{**first.__dict__, "ranks": ranks, "evidence": evidence,
                                 "message": _render(message, ranks) if again else first.message,
                                 "hint": _render(hint, ranks) if again else first.hint,
                                 "time": min(f.time for f in group)}))
    return sorted(merged, key=lambda f: (severity_rank(f.severity), f.time, f.id))


def status_of(findings: Iterable[Finding]) -> str:
    severities = {f.severity for f in findings}
    return "fail" if "error" in severities else "warn" if "warning" in severities else "pass"


def root_cause(findings: Iterable[Finding]) -> Finding | None:
    """The earliest error: the first thing that went wrong, not the ranks that then timed out
    waiting for it. Consequences (`caused_by`: a peer that failed because another rank did) are
    passed over while a real cause exists."""
    errors = [f for f in findings if f.severity == "error"]
    if not errors:
        return None
    causes = [f for f in errors if f.caused_by is None] or errors
    return min(causes, key=lambda f: (f.time, f.id))


def build_report(*, world: dict[str, Any], ranks: list[dict[str, Any]], findings: Iterable[Finding],
                 measurements: dict[str, Any] | None = None, phase: str = "preflight") -> dict[str, Any]:
    merged = merge_findings(findings)
    cause = root_cause(merged)
    for f in merged:  # a consequence of "whatever failed first" names it now that it is known
        if f.caused_by == ROOT_CAUSE:
            f.caused_by = cause.id if cause is not None and cause is not f else None
    return {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "tool_version": __version__,
        "status": status_of(merged), "phase": phase, "world": world,
        "ranks": sorted(ranks, key=lambda r: (r.get("rank") is None, r.get("rank") or 0)),
        "findings": [f.to_dict() for f in merged],
        "measurements": measurements or {},
        "root_cause": cause.to_dict() if cause else None,
    }


def exit_code(report: dict[str, Any]) -> int:
    if report.get("status") == "interrupted":
        return 128 + int((report.get("interrupted") or {}).get("signo") or 15)
    return EXIT_FAILED if report.get("status") == "fail" else EXIT_OK


def mark_running(report: dict[str, Any]) -> dict[str, Any]:
    """The preflight's report once the training has started: status "running" (a job still to end
    is never a "pass"), the preflight's own verdict kept under "preflight_status"."""
    return {**report, "status": "running", "phase": "training", "preflight_status": report.get("status")}


def mark_interrupted(report: dict[str, Any], interrupt: dict[str, Any]) -> dict[str, Any]:
    """A job a signal stopped: status "interrupted" whatever its findings (never "pass"), and the
    signal and its sender under "interrupted"."""
    report["status"] = "interrupted"
    report["interrupted"] = dict(interrupt)
    return report


def findings_of(report: dict[str, Any]) -> list[Finding]:
    return [Finding.from_dict(d) for d in report.get("findings", [])]


def world_of(ctx: Any, *, world_size: int | None = None) -> dict[str, Any]:
    """The report's `world` block from a RankContext."""
    sm = ctx.sagemaker
    world = {
        "launcher": ctx.launcher.name, "backend": ctx.backend,
        "world_size": world_size if world_size is not None else ctx.world_size,
        "nnodes": ctx.nnodes, "nproc_per_node": ctx.local_world_size,
        "master_addr": ctx.master_addr, "master_port": ctx.master_port,
        "platform": "sagemaker" if sm is not None else None,
    }
    # the instance type (--instance-type, else SageMaker's word): a fleet's history compares by it
    option = (getattr(ctx, "options", None) or {}).get("instance_type")
    itype = option or (sm.instance_type if sm is not None else None)
    if itype:
        world["instance_type"] = str(itype)
        world["instance_type_from"] = "--instance-type" if option else "the SageMaker environment"
    return world


def rank_entry(view: dict[str, Any]) -> dict[str, Any]:
    """The report's per-rank line from a rank's view (ddp_doctor.preflight_ranks.rank_view.collect_view):
    where it ran, its library versions and its communication variables (NCCL_*, FI_*, GLOO_*, ...,
    redacted in the view), what `ddp-doctor diff` compares between two runs."""
    entry = {"rank": view.get("rank"), "local_rank": view.get("local_rank"),
             "node_rank": view.get("node_rank"), "host": view.get("hostname"),
             "device": view.get("device")}
    if view.get("device_uuid"):  # the GPU itself, whatever index reached it (the history keeps it)
        entry["device_uuid"] = str(view["device_uuid"])
    for key in ("versions", "env"):
        if isinstance(view.get(key), dict):
            entry[key] = dict(view[key])
    return entry
