"""One builder for the report of a training job, whoever writes it: `ddp-doctor run`'s parent, a
rank under an outside launcher, or a Trainer/Lightning callback. It runs the job's verdict
(checks/job.py) as a stage through the runner, so a bug in a rule becomes a finding (DDP001) in a
report that is still written, and builds the report from the findings."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from ddp_doctor import check_runner
from ddp_doctor.checks import host_busy
from ddp_doctor.checks.arrivals import arrival_summary
from ddp_doctor.checks.job import JobEvidence, exit_code_without_rules, job_findings
from ddp_doctor.findings import Finding
from ddp_doctor.report import build as reportlib


@dataclass
class Judged:
    """A job's report, its exit code, the evidence file's content (training/evidence_file.py) that
    lets `ddp-doctor analyze` judge it again, and the evidence judged."""

    report: dict[str, Any]
    code: int
    evidence: dict[str, Any]
    job: JobEvidence


def job_report(ev: JobEvidence, **kwargs: Any) -> tuple[dict[str, Any], int]:
    """(the report, the job's exit code): :func:`judge` for a caller that writes no evidence file."""
    judged = judge(ev, **kwargs)
    return judged.report, judged.code


def judge(ev: JobEvidence, *, world: dict[str, Any], ranks: list[dict[str, Any]] | None = None,
          earlier: Iterable[Finding] = (), more: Iterable[Finding] = (),
          measurements: dict[str, Any] | None = None, history_env: Any = None,
          history: Iterable[Finding] = ()) -> Judged:
    """The job's report, exit code and evidence. `earlier`: findings made before training (the
    preflight's); `more`: findings the caller made itself (a probe record that never arrived);
    `history_env`: the environment naming the history this report will be recorded in, for a
    job that ran here (`run`): its step time is then compared with the hosts' own past (DDP409);
    `history`: those comparisons as judged before (a replay: the history is not in its file)."""
    from ddp_doctor.training import evidence_file
    earlier, more, given = list(earlier), list(more), dict(measurements or {})
    world = reportlib.with_started_ranks(world, ev.probes)  # Ray Train's workers, mp.spawn's children
    if not ev.rank_branches:
        ev.rank_branches = rank_branches_of(ev)
    value, problems = check_runner.run_rule("the job's verdict", job_findings, ev, earlier)
    if value is None:
        found, code = problems, exit_code_without_rules(ev)
    else:
        found, code = value
    measurements = dict(given)
    steps = step_figures(ev.probes)
    if steps:
        measurements["training"] = steps
    arrived = arrival_summary(ev.ledgers, ev.clock_offsets)
    if arrived:
        measurements["arrivals"] = arrived
    load = host_busy.of_ledgers(ev.ledgers)
    if load is not None:  # whether the hosts were busy while it trained: the history compares quiet runs
        measurements["host_load"] = load.summary()
    findings = earlier + found + more
    rep = reportlib.build_report(world=world, ranks=list(ranks or []), findings=findings,
                                 measurements=measurements, phase="training")
    slower = list(history)
    if history_env is not None:  # step times of a job that ended well; earlier host faults of any job
        from ddp_doctor.checks.history_rules import STEP_TIME, against_history
        slower = against_history(rep, history_env, STEP_TIME if steps and rep["status"] in ("pass", "warn") else ())
    if slower:
        rep = reportlib.build_report(world=world, ranks=list(ranks or []), findings=findings + slower,
                                     measurements=measurements, phase="training")
    if ev.interrupted is not None:
        rep = reportlib.mark_interrupted(rep, ev.interrupted.to_dict())
    doc = evidence_file.document(ev, world=world, ranks=list(ranks or []), earlier=earlier, more=more,
                                 history=slower, measurements=given, report=rep, code=code)
    return Judged(rep, code, doc, ev)


def replay(doc: dict[str, Any]) -> Judged:
    """The verdict judged again from an evidence file's content (evidence_file.read): the same
    rules over the same evidence; NotEvidence when a part of it cannot be read."""
    from ddp_doctor.training import evidence_file
    ev = evidence_file.evidence_from_dict(doc.get("evidence"))
    world, ranks, measured = doc.get("world") or {}, doc.get("ranks") or [], doc.get("measurements") or {}
    if not isinstance(world, dict) or not isinstance(ranks, list) or not isinstance(measured, dict):
        raise evidence_file.NotEvidence("its 'world', 'ranks' or 'measurements' is not of the kind written")
    return judge(ev, world=world, ranks=ranks, earlier=evidence_file.findings(doc, "earlier"),
                 more=evidence_file.findings(doc, "more"), history=evidence_file.findings(doc, "history"),
                 measurements=measured)


MAX_SITES = 64  # call sites whose source is read for rank-conditional branches: the distinct lines


def rank_branches_of(ev: JobEvidence) -> dict[str, list[dict[str, Any]]]:
    """The rank-conditional branches (facts/rank_branches.py) around the user's lines the ledgers
    and the crash dumps name: the newest calls' lines first, at most MAX_SITES lines, each file
    read bounded and never when it is not a regular file. {} when the sources are not here (a
    post-mortem on another machine): the verdict then decides without them."""
    from ddp_doctor.checks.collectives import entries_of, site_of
    from ddp_doctor.checks.crash_ledgers import crash_site
    from ddp_doctor.facts.rank_branches import rank_branches_of_file
    # (the site as the verdict names it, the file:line to read): a recorded frame's site is named by
    # its file's base name (checks/collectives.site_of), read from its full path
    sites: list[tuple[str, str]] = []
    for dump, _when in ev.crashes.values():
        found = crash_site(dump) if isinstance(dump, str) else None
        if found and found["site"]:
            sites += [(s, s) for s in [str(found["site"]), *found["callers"]]]
    for ledger in ev.ledgers.values():
        for entry in reversed(entries_of(ledger) if isinstance(ledger, dict) else []):
            site = site_of(entry)
            if site:
                sites.append((site, _full_site(entry) or site))
            callers = entry.get("user_callers")
            sites += [(c, c) for c in (callers if isinstance(callers, list) else []) if isinstance(c, str)]
    out: dict[str, list[dict[str, Any]]] = {}
    for site, full in dict.fromkeys(sites):
        if len(out) >= MAX_SITES:
            break
        path, _, line = full.rpartition(":")
        if site in out or not path or not line.isdigit():
            continue
        out[site] = [{"line": b.line, "condition": b.condition, "taken_when": b.taken_when, "reads": b.reads}
                     for b in rank_branches_of_file(path, int(line))]
    return out


def _full_site(entry: dict[str, Any]) -> str | None:
    """"path:line" of the user's frame a flight recorder entry recorded (its first frame outside the
    libraries), None when it has none."""
    from ddp_doctor.facts.frames import is_library_file
    if entry.get("user_site"):
        return str(entry["user_site"])
    for frame in entry.get("frames") or ():
        if isinstance(frame, dict) and frame.get("filename") and not is_library_file(str(frame["filename"])):
            return f"{frame['filename']}:{frame.get('line')}"
    return None


def step_figures(probes: list[dict[str, Any]]) -> dict[str, Any]:
    """measurements.training: the median time between two optimizer steps (the median of the
    ranks' own medians: DDP holds every rank to one pace), the steps taken, how many ranks measured
    it, and the script (its name and the digest of its content and arguments that the history keys
    the step time by). {} when no rank took 3 steps."""
    from ddp_doctor.comm.stragglers import median
    measured = [p for p in probes if isinstance(p.get("step_interval"), (int, float)) and p["step_interval"] > 0]
    if not measured:
        return {}
    script = next((p["script"] for p in measured if isinstance(p.get("script"), dict)), None) or {}
    return {"median_step_s": round(median([float(p["step_interval"]) for p in measured]), 6),
            "steps": max(int(p.get("steps") or 0) for p in measured), "ranks_measured": len(measured),
            **({"script": str(script.get("name")), "script_key": str(script.get("key"))} if script.get("key") else {})}
