"""ddp-doctor: diagnose PyTorch DistributedDataParallel jobs before, during and after they run.

Importing this package is cheap: torch is imported only by the parts that need it.
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.version import __version__

__all__ = ["__version__", "check_sampler", "preflight", "report_schema", "validate_report"]


def __getattr__(name: str) -> Any:
    # Lazy: `import ddp_doctor` stays cheap and torch-free until the API is used.
    if name == "preflight":
        from ddp_doctor.api import preflight
        return preflight
    if name == "check_sampler":
        from ddp_doctor.training.sampler_check import check_sampler
        return check_sampler
    if name in ("report_schema", "validate_report"):  # the report's JSON Schema (docs/report-schema.md)
        from ddp_doctor.report import schema
        return getattr(schema, name)
    raise AttributeError(f"module 'ddp_doctor' has no attribute {name!r}")
