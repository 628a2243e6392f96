"""What every rank of `ddp-doctor run` and its parent act on: the run's options (RunOptions, built by
cli/run_argv.py) and the variables a ddp-doctor parent sets for its ranks. Light on imports: the CLI
and the parent read it before any rank runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddp_doctor.exit_codes import FailOn
from ddp_doctor.training.run.target import Target

RUN_DIR_ENV = "DDP_DOCTOR_RUN_DIR"
PARENT_ENV = "DDP_DOCTOR_RUN_PARENT"  # set by a ddp-doctor parent that watches and reports
RECORDS_NOTE_ENV = "DDP_DOCTOR_RECORDS_NOTE"  # set by that parent: why the records are not where asked


@dataclass
class RunOptions:
    target: Target
    timeout: float = 60.0
    hang_timeout: float | None = None  # --hang-timeout; None: adaptive (training/run/hang_bound.py)
    select: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)
    backend: str | None = None
    report_path: str | None = None
    check_options: dict[str, Any] = field(default_factory=dict)
    run_dir: str | None = None  # --run-dir: where the parent keeps the run directory
    trace_path: str | None = None  # --trace: the parent writes the ranks' Chrome trace there
    # --fail-on / DDP_DOCTOR_FAIL_ON: whoever writes the job's report (the parent, else a rank that
    # ended well and wrote it) exits 3 instead of 0 on a finding that severe
    fail_on: FailOn | None = None
    progress: bool | None = None  # --progress / --no-progress (None: DDP_DOCTOR_PROGRESS, else a terminal)
    verbose: bool = False  # --verbose: the verdict shows its info findings too

