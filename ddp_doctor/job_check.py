"""The job check: the stage "job" checks (DDP900-DDP999) run on a planned SageMaker job into a report.

    JobSpec (CLI flags, a JSON/YAML file, or a dict from a notebook)
        -> JobContext (the spec + lazily created boto3 clients, every AWS answer cached)
        -> checks in stage "job" (ddp_doctor.checks.sagemaker_job and .sagemaker_account)
        -> findings -> report (same schema as preflight)

What is inside: check_job (the Python API), run_checks (also run by `ddp-doctor sagemaker-check`),
failure_findings (DDP900 / DDP901 for the AWS calls that could not be made) and world_of_job (the
report's world block). An orchestrator beside api.py: ddp_doctor.sagemaker describes the platform
and never imports the checks, the runner or the report.

An AWS call that fails for want of permission, credentials or a reachable endpoint never raises:
:meth:`JobContext.call` records it and the report carries it as DDP900 (a permission is missing,
named as IAM writes it, e.g. ``ec2:DescribeSecurityGroups``) or DDP901 (AWS could not be asked).

Python API (notebooks)::

    from ddp_doctor.sagemaker import check_job
    report = check_job({"instance_type": "ml.p4d.24xlarge", "instance_count": 2,
                        "distribution": {"torch_distributed": {"enabled": True}}, ...})
    report["status"]  # "pass" | "warn" | "fail"
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from ddp_doctor import check_runner
from ddp_doctor import checks as catalogue
from ddp_doctor.checks.sagemaker_job import AWS_UNREACHABLE, PERMISSION_MISSING, STAGE
from ddp_doctor.facts.instances import is_gpu_type
from ddp_doctor.findings import Finding, Problem
from ddp_doctor.registry import selected
from ddp_doctor.report import build as reportlib
from ddp_doctor.sagemaker.aws import JobContext, require_boto3
from ddp_doctor.sagemaker.spec import JobSpec, processes_per_instance


def world_of_job(spec: JobSpec, gpus: int | None, region: str | None = None) -> dict[str, Any]:
    """The report's world block for the planned job."""
    ppn = processes_per_instance(spec, gpus)
    name = spec.distribution_name
    launcher = {"torch_distributed": "torchrun", "smdistributed": "mpirun", "pytorchddp": "mpirun",
                "mpi": "mpirun", "none": "python"}.get(name, "unknown")
    backend = ("smddp" if name in ("smdistributed", "pytorchddp")
               else "nccl" if is_gpu_type(spec.instance_type or "") else None)
    count = spec.instance_count if spec.instance_count and spec.instance_count > 0 else None
    return {
        "launcher": launcher, "backend": backend,
        "world_size": ppn * count if ppn and count else None,
        "nnodes": count, "nproc_per_node": ppn, "master_addr": None, "master_port": None,
        "platform": "sagemaker", "planned": True, "instance_type": spec.instance_type,
        "instance_count": spec.instance_count, "distribution": name,
        "gpus_per_instance": gpus, "region": region or spec.region,
    }


def failure_findings(ctx: JobContext) -> list[Finding]:
    """DDP900 / DDP901 findings for the AWS calls that could not be made."""
    out = []
    failures = sorted(ctx.failures.values(), key=lambda f: (f.kind != "unreachable", f.permission))
    who = ctx.caller_arn() if any(f.kind == "denied" for f in failures) else None
    for f in failures:
        for_checks = f" (needed by {', '.join(sorted(f.checks))})" if f.checks else ""
        evidence = {"permission": f.permission, "operation": f.operation, "service": f.service,
                    "error_code": f.code, "checks": sorted(f.checks)}
        if f.kind == "denied":
            msg = (f"{f.operation} was denied ({f.code}): {who or 'the caller'} lacks {f.permission}"
                   f"{for_checks}; those checks were not done. AWS said: {f.message}")
            hint = (f"Grant {f.permission} to {who or 'the identity you run ddp-doctor as'} (an IAM policy "
                    f'statement {{"Effect": "Allow", "Action": "{f.permission}", "Resource": "*"}}), or '
                    f"verify what {', '.join(sorted(f.checks)) or 'the check'} covers by hand.")
            out.append(PERMISSION_MISSING.finding(Problem(message=msg, hint=hint, evidence=evidence), None,
                                                  "preflight"))
        else:  # unreachable, or any other failure: AWS could not be asked
            msg = (f"{f.operation} ({f.permission}) could not be called: {f.code}: {f.message}{for_checks}; "
                   f"those checks were not done")
            out.append(AWS_UNREACHABLE.finding(Problem(message=msg, evidence=evidence), None, "preflight"))
    return out


def run_checks(ctx: JobContext, *, select: list[str] | None = None, skip: list[str] | None = None) -> dict[str, Any]:
    """Run every job check on `ctx` and build the report."""
    findings = []
    for entry in catalogue.checks_for(STAGE, select, skip):
        ctx.current_check = entry.id
        findings.extend(check_runner.run_entry(entry, (ctx,), rank=None))
    ctx.current_check = None
    # DDP900 / DDP901 are selected as the checks are: `--skip DDP901` checks the settings offline
    findings.extend(f for f in failure_findings(ctx)
                    if selected(PERMISSION_MISSING if f.id == PERMISSION_MISSING.id else AWS_UNREACHABLE,
                                select or [], skip or []))
    # GPUs per instance: the table's, or EC2's for a type the table lacks (asked only if AWS answers).
    reached = not any(f.kind == "unreachable" for f in ctx.failures.values())
    gpus = ctx.gpus_per_instance() if reached else ctx.spec.gpus_per_instance
    return reportlib.build_report(world=world_of_job(ctx.spec, gpus, ctx.region), ranks=[], findings=findings)


def check_job(spec: JobSpec | Mapping[str, Any], session: Any = None, *, select: Iterable[str] | None = None,
              skip: Iterable[str] | None = None) -> dict[str, Any]:
    """Check a planned SageMaker training job; returns the report dict (schema_version 1).

    `spec` is a :class:`JobSpec` or a dict of estimator settings (instance_type, instance_count,
    distribution, framework_version, py_version, entry_point, role, subnets, security_group_ids,
    inputs, output_path, region, per_device_batch_size, learning_rate). `session` is a
    boto3.Session; by default one is made from boto3's usual chain. Raises SpecError for a spec
    that cannot be read and ImportError (with the install hint) without boto3; AWS errors become
    findings."""
    require_boto3()
    job = spec if isinstance(spec, JobSpec) else JobSpec.from_dict(spec)
    return run_checks(JobContext(job, session), select=list(select or []), skip=list(skip or []))
