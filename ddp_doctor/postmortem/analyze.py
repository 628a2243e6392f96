"""`ddp-doctor analyze`: the verdict of a job that already ended, from what it left. The artifacts
are read (inputs.py), turned into the evidence the live path gathers (evidence.py), and judged by
the one builder of a training report (training/job_report.py): the same rules, root cause,
consequences and verdict text as `ddp-doctor run`."""
from __future__ import annotations

from typing import Any, Iterable

from ddp_doctor.postmortem.artifacts import Artifacts
from ddp_doctor.postmortem.evidence import PostMortem, build
from ddp_doctor.postmortem.inputs import read_all
from ddp_doctor.training.job_report import job_report


def analyze(paths: Iterable[str], *, world: dict[str, Any] | None = None,
            extra: dict[str, Any] | None = None, art: Artifacts | None = None) -> tuple[dict[str, Any], PostMortem]:
    """(the report, what it was made from). `world`: what the platform knows of the job, merged
    into the report's world; `extra`: merged into measurements.post_mortem (e.g. `sagemaker`);
    `art`: where the inputs are read into (how far the reading got, if it is interrupted)."""
    art = read_all(paths, art)
    art.stage = "judging what was read"
    pm = build(art, platform=world)
    read = {"inputs_read": len(art.read), "inputs_skipped": len(art.skipped),
            "ranks": {str(r): v for r, v in sorted(pm.ranks.items())}, "unplaced": pm.unplaced}
    rep, _ = job_report(pm.evidence, world={**pm.world, **(world or {})}, more=pm.findings,
                        measurements={"post_mortem": {**read, **(extra or {})}})
    return rep, pm


def replay(path: str) -> tuple[dict[str, Any], PostMortem, dict[str, Any]]:
    """(the report judged again from the evidence file at `path`, the evidence as a post-mortem's for
    the trace, the verdict the file recorded when it was written). evidence_file.NotEvidence says
    why the file cannot be judged."""
    from ddp_doctor.training import evidence_file
    from ddp_doctor.training.job_report import replay as judge_again
    doc = evidence_file.read(path)
    judged = judge_again(doc)
    recorded = doc.get("verdict") if isinstance(doc.get("verdict"), dict) else {}
    return judged.report, PostMortem(evidence=judged.job, world=judged.report.get("world") or {}), recorded


def trace(pm: PostMortem, rep: dict[str, Any]) -> dict[str, Any]:
    """The job as a Chrome trace, drawn as `ddp-doctor run --trace` draws it, from what the
    artifacts hold: each rank's collectives (its flight-recorder dump), how it ended, the findings."""
    from ddp_doctor.report import chrome_trace as tracelib
    ev = pm.evidence
    found = tracelib.finding_records(rep)
    lanes: dict[int, dict[str, Any]] = {}
    for r in sorted(set(ev.ranks) | set(found)):
        outcome = ev.outcomes.get(r)
        recs = tracelib.ledger_records(ev.ledgers.get(r))
        recs += tracelib.outcome_records(outcome, ev.crashes[r][1] if r in ev.crashes else None)
        recs += found.get(r, [])
        lanes[r] = {"host": (pm.ranks.get(r) or {}).get("host"), "records": recs}
    return tracelib.chrome_trace(lanes)
