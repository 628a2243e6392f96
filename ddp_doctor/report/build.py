"""The report: every rank's findings merged into one document (schema_version 1, docs/report-schema.md).

Pure functions over findings and plain dicts; rendering and writing live in render.py / sinks.py.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any, Iterable, Iterator

from ddp_doctor.exit_codes import EXIT_FAILED, EXIT_OK
from ddp_doctor.findings import ROOT_CAUSE, Finding, brief_ranks, format_ranks, severity_rank
from ddp_doctor.version import __version__

SCHEMA = "ddp-doctor.report"
SCHEMA_VERSION = 1


# A mention of ranks in a message or hint: "rank 3", "Rank 3", "ranks 0-3, 7", "rank(s) 1, 2",
# "local rank 1", brief_ranks' "ranks 0, 8 and 510 more rank(s) in 510 runs", and torch's log
# prefix "[rank1]". Only the finding's own ranks are taken out (see _normalise): "after rank 1
# failed" in rank 0's finding is part of what it says.
_MENTION = re.compile(
    r"(?<![\w=\[])(?P<word>local\s+ranks?|ranks?\(s\)|ranks?)\s+"
    r"(?P<list>\d+(?:(?:\s*,\s*|\s*-\s*)\d+)*)"
    r"(?P<more>\s+and\s+(?P<count>\d+)\s+more\s+rank\(s\)\s+in\s+\d+\s+runs?)?(?!\w|\.\d)", re.I)
_PREFIX = re.compile(r"\[rank(?P<n>\d+)\]")
_PLACEHOLDER = re.compile(r"\x00(?P<kind>[a-z(s)]+)(?P<cap>[01])\x00")


# Past this many findings of one problem that differ only in their numbers (a pid, a size, a
# host's name: one per node of a big job), they are one finding with a few of them as examples
# (see _fold). Fewer stay apart: "WORLD_SIZE=2" on one rank and "=3" on another is the problem.
FOLD_AT = 16
# Evidence kept per merged finding: per-rank evidence and examples, each at most this many
# entries, with a count of what was left out (docs/report-schema.md, "At scale").
MAX_KEPT = 16
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _pieces(pieces: list[str], ranks: set[int]) -> Iterator[set[int]]:
    """The ranks named by each listed piece ("0-3" -> {0, 1, 2, 3}), in order, until one names a
    rank outside `ranks` (a mention of other ranks, or a range too wide to be ranks)."""
    for p in pieces:
        a, _, b = p.partition("-")
        lo, hi = int(a), int(b or a)
        if hi - lo > len(ranks) or not all(r in ranks for r in range(lo, hi + 1)):
            return
        yield set(range(lo, hi + 1))


def _own_prefix(pieces: list[str], ranks: set[int]) -> int:
    """How many of the listed pieces make the longest prefix naming exactly `ranks` (0: none).
    One pass over the pieces, whatever their number."""
    seen: set[int] = set()
    found = 0
    for n, named in enumerate(_pieces(pieces, ranks), 1):
        seen |= named
        if len(seen) == len(ranks):
            found = n
    return found


def _own_brief(pieces: list[str], more: int, ranks: set[int]) -> bool:
    """brief_ranks' "0, 8 and 510 more rank(s) in 510 runs" names `ranks`: every run shown is
    some of them, and the count says how many are left."""
    named = list(_pieces(pieces, ranks))
    return len(named) == len(pieces) and len(set().union(*named)) + more == len(ranks)


def _normalise(text: str, ranks: set[int]) -> str:
    """`text` with every mention of exactly the finding's own ranks replaced by a placeholder that
    remembers the form ("rank", "rank(s)", "local rank", "[rank]") and its capital letter. A
    finding about ranks 0 and 1 keeps "Rank 1 is running ..., but Rank 0 ...": one rank of
    several is part of what it says."""
    if not ranks or not text:
        return text

    def mention(m: re.Match[str]) -> str:
        word = m.group("word")
        kind = ("local" if word.lower().startswith("local") else
                "rank(s)" if word.lower().endswith("(s)") else "rank")
        placeholder = f"\x00{kind}{int(word[0].isupper())}\x00"
        pieces = [p.replace(" ", "") for p in re.split(r"\s*,\s*", m.group("list"))]
        if m.group("more"):
            return placeholder if _own_brief(pieces, int(m.group("count")), ranks) else m.group(0)
        n = _own_prefix(pieces, ranks)  # the longest prefix of the list naming exactly its ranks
        return placeholder + _tail(m.group("list"), pieces[:n]) if n else m.group(0)

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
    """A normalised text with the placeholders written out for the merged `ranks`: at most 6 runs
    of them and how many more (brief_ranks), the finding's `ranks` holding them all."""
    listed = brief_ranks(ranks)
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
    another value) stay separate findings, unless FOLD_AT or more of them differ only in their
    numbers (see _fold). Where the merged findings' evidence differs, each rank's is kept under
    evidence["per_rank"] (keyed by the rank list as format_ranks writes it; ranks with the same
    evidence share one entry; at most MAX_KEPT entries, then evidence["per_rank_left_out"]: how
    many ranks' evidence is not listed), the earliest one's at the top level as before.

    Linear in the findings (a dictionary per pass) but for sorting the ranks and the result."""
    exact = _merge(findings, lambda f: (f.id, f.severity, f.message, f.hint), render=False)
    by_rank = _merge(exact, lambda f: (f.id, f.severity, _normalise(f.message, set(f.ranks)),
                                       _normalise(f.hint, set(f.ranks))), render=True)
    return _fold(by_rank)


def _merge(findings: Iterable[Finding], key: Any, *, render: bool) -> list[Finding]:
    groups: dict[tuple[str, str, str, str], list[Finding]] = {}
    for f in findings:
        groups.setdefault(key(f), []).append(f)
    merged: list[Finding] = []
    for (_, _, message, hint), group in groups.items():
        first = min(group, key=lambda f: f.time)
        ranks = sorted({r for f in group for r in f.ranks})
        evidence = dict(first.evidence)
        # a check's own per_rank (a rank's error on every rank of a big job) is capped as a merge's
        if len(group) > 1 or len(evidence.get("per_rank") or ()) > MAX_KEPT:
            evidence.pop("per_rank", None)
            evidence.pop("per_rank_left_out", None)
            evidence.update(_per_rank(group))
        again = render and len(group) > 1
        merged.append(Finding(**{**first.__dict__, "ranks": ranks, "evidence": evidence,
                                 "message": _render(message, ranks) if again else first.message,
                                 "hint": _render(hint, ranks) if again else first.hint,
                                 "time": min(f.time for f in group)}))
    return sorted(merged, key=lambda f: (severity_rank(f.severity), f.time, f.id))


def _per_rank(group: list[Finding]) -> dict[str, Any]:
    """{"per_rank": {ranks: evidence}} for merged findings whose evidence differs, {} where it is
    the same on every rank. Ranks with equal evidence share an entry; the MAX_KEPT entries of the
    lowest ranks are kept and "per_rank_left_out" counts the ranks of the others."""
    entries: dict[str, tuple[list[int], Any]] = {}  # repr(evidence) -> (ranks, evidence)
    left_out = 0
    for f in group:
        left_out += int(f.evidence.get("per_rank_left_out") or 0)
        merged = f.evidence.get("per_rank")  # a finding merged before (a report read back)
        pairs = ([(_ranks_of(sub), ev) for sub, ev in merged.items()] if merged else
                 [(f.ranks, {k: v for k, v in f.evidence.items() if k not in ("per_rank", "per_rank_left_out")})])
        for ranks, ev in pairs:
            entries.setdefault(repr(ev), ([], ev))[0].extend(ranks)
    if len(entries) + (left_out > 0) <= 1:
        return {}
    ordered = sorted(entries.values(), key=lambda e: min(e[0], default=-1))
    out: dict[str, Any] = {"per_rank": {format_ranks(rs) or "-": ev for rs, ev in ordered[:MAX_KEPT]}}
    left_out += sum(len(set(rs)) for rs, _ in ordered[MAX_KEPT:])
    if left_out:
        out["per_rank_left_out"] = left_out
    return out


def _ranks_of(key: str) -> list[int]:
    """The ranks a per_rank key names ("0-3, 7"; "-" for none)."""
    out: list[int] = []
    for piece in key.split(","):
        a, _, b = piece.strip().partition("-")
        if a.isdigit() and (not b or b.isdigit()):
            out.extend(range(int(a), int(b or a) + 1))
    return out


def _fold(findings: list[Finding]) -> list[Finding]:
    """FOLD_AT or more findings of one ID, severity and cause whose message and hint differ only in
    their numbers (a leftover process's pid on each of 200 nodes) are one finding: the earliest
    one's message, saying how many more are like it, on all their ranks; the others, at most
    MAX_KEPT of them, under evidence["variants"] ({"ranks", "message", "evidence"}) and
    evidence["variants_left_out"] counting the rest. Fewer stay apart, each its own finding, and
    so does every error that is not a consequence: the root cause is the earliest of those, and
    names its own ranks, never a fold's."""
    groups: dict[tuple[Any, ...], list[Finding]] = {}
    for n, f in enumerate(findings):
        if f.severity == "error" and f.caused_by is None:  # a root cause candidate names its own ranks
            groups[(n,)] = [f]
            continue
        key = (f.id, f.severity, f.phase, f.caused_by, _NUMBER.sub("#", f.message), _NUMBER.sub("#", f.hint))
        groups.setdefault(key, []).append(f)
    if all(len(g) < FOLD_AT for g in groups.values()):
        return findings
    out: list[Finding] = []
    for group in groups.values():
        if len(group) < FOLD_AT:
            out += group
            continue
        group = sorted(group, key=lambda f: (f.time, min(f.ranks, default=-1)))
        first, others = group[0], group[1:]
        ranks = sorted({r for f in group for r in f.ranks})
        more = len(ranks) - len(set(first.ranks))
        evidence = {**first.evidence, "variants": [
            {"ranks": sorted(f.ranks), "message": f.message,
             "evidence": {k: v for k, v in f.evidence.items() if k not in ("per_rank", "per_rank_left_out")}}
            for f in others[:MAX_KEPT]]}
        if len(others) > MAX_KEPT:
            evidence["variants_left_out"] = len(others) - MAX_KEPT
        message = (f"{first.message} (and {len(others)} more like it with other values"
                   + (f" on {more} more rank(s)" if more else "") + "; evidence.variants)")
        out.append(Finding(**{**first.__dict__, "ranks": ranks, "evidence": evidence, "message": message}))
    return sorted(out, key=lambda f: (severity_rank(f.severity), f.time, f.id))


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
        "root_cause": _with_hosts(cause.to_dict(), ranks) if cause else None,
    }


def _with_hosts(cause: dict[str, Any], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The root cause, with the hosts of its ranks when the action is to run again without them."""
    if cause.get("action") != "exclude_host":
        return cause
    hosts = sorted({str(r["host"]) for r in ranks if r.get("rank") in cause.get("ranks", []) and r.get("host")})
    return {**cause, "hosts": hosts}


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


def with_started_ranks(world: dict[str, Any], probes: list[dict[str, Any]]) -> dict[str, Any]:
    """The `world` block of a job whose ranks the script started itself (Ray Train's workers,
    torch.multiprocessing.spawn's children), from their probe records (`started_by`, world size,
    host), where the process ddp-doctor watched had no launcher and no world of its own. The
    nodes are counted only when every rank's record is here (a run directory is one node's)."""
    if world.get("world_size") is not None or world.get("launcher") not in (None, "none"):
        return world
    started = [p for p in probes if p.get("started_by") and isinstance(p.get("world_size"), int)]
    if not started:
        return world
    size = max(int(p["world_size"]) for p in started)
    ranks = {p.get("rank") for p in started if isinstance(p.get("rank"), int)}
    out = {**world, "launcher": "/".join(sorted({str(p["started_by"]) for p in started})), "world_size": size}
    if len(ranks) == size:
        per_host = Counter(str(p.get("host")) for p in started if p.get("rank") in ranks)
        out["nnodes"] = len(per_host)
        counts = set(per_host.values())
        out["nproc_per_node"] = counts.pop() if len(counts) == 1 else None
    return out


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
