"""One builder for the report of a training job, whoever writes it: `ddp-doctor run`'s parent, a
rank under an outside launcher, or a Trainer/Lightning callback. It runs the job's verdict
(checks/job.py) as a stage through the runner, so a bug in a rule becomes a finding (DDP001) in a
report that is still written, and builds the report from the findings."""
from __future__ import annotations

from typing import Any, Iterable

from ddp_doctor import check_runner
from ddp_doctor.checks.job import JobEvidence, exit_code_without_rules, job_findings
from ddp_doctor.findings import Finding
from ddp_doctor.report import build as reportlib


def job_report(ev: JobEvidence, *, world: dict[str, Any], ranks: list[dict[str, Any]] | None = None,
               earlier: Iterable[Finding] = (), more: Iterable[Finding] = (),
               measurements: dict[str, Any] | None = None) -> tuple[dict[str, Any], int]:
    """(the report, the job's exit code). `earlier`: findings made before training (the
    preflight's); `more`: findings the caller made itself (a probe record that never arrived)."""
    earlier = list(earlier)
    value, problems = check_runner.run_rule("the job's verdict", job_findings, ev, earlier)
    if value is None:
        found, code = problems, exit_code_without_rules(ev)
    else:
        found, code = value
    rep = reportlib.build_report(world=world, ranks=list(ranks or []), findings=earlier + found + list(more),
                                 measurements=measurements or {}, phase="training")
    if ev.interrupted is not None:
        rep = reportlib.mark_interrupted(rep, ev.interrupted.to_dict())
    return rep, code
