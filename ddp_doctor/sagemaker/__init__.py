"""SageMaker as a platform: the instance types, and the client-side check of a planned training job.

Modules: instances (the one instance-type table), spec (JobSpec: the job as described), aws
(JobContext: boto3 calls, cached, failures recorded), run (the job checks into a report).
The checks themselves are ddp_doctor.checks.sagemaker_job and .sagemaker_account (loaded through
the registry's catalogue, never imported from here); the command is ddp_doctor.cli.sagemaker_check.
"""
from __future__ import annotations

from typing import Any

__all__ = ["check_job"]


def __getattr__(name: str) -> Any:
    # Lazy: the checks and the instance table import parts of this package without the runner.
    if name == "check_job":
        from ddp_doctor.sagemaker.run import check_job
        return check_job
    raise AttributeError(f"module 'ddp_doctor.sagemaker' has no attribute {name!r}")
