"""SageMaker as a platform: the planned job as described (spec: JobSpec) and the AWS calls made
about it (aws: JobContext, boto3 calls cached, failures recorded).

This package describes; it never runs checks. The job checks are ddp_doctor.checks.sagemaker_job
and .sagemaker_account, run into a report by ddp_doctor.job_check; the instance-type table is
ddp_doctor.facts.instances; the command is ddp_doctor.cli.sagemaker_check.
"""
from __future__ import annotations

from typing import Any

__all__ = ["check_job"]


def __getattr__(name: str) -> Any:
    # `from ddp_doctor.sagemaker import check_job` is the documented notebook API: kept as a lazy
    # alias of the orchestrator above this package (the one arrow back up, named as an exception in
    # tests/test_architecture.py); lazy, so the checks can import the parts of this package.
    if name == "check_job":
        from ddp_doctor.job_check import check_job
        return check_job
    raise AttributeError(f"module 'ddp_doctor.sagemaker' has no attribute {name!r}")
