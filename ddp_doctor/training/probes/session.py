"""The in-training probes driven by a framework callback (Hugging Face Trainer, Lightning) instead
of `ddp-doctor run`.

`start()` installs the probes in this process. `finish()` hands this rank's record to rank 0
through the process group's key-value store (a set and bounded waits: no collective, so a rank that
never arrives cannot hang the others), and rank 0 applies the same rules as `ddp-doctor run`,
writes the report (`report_path`, DDP_DOCTOR_REPORT or ./ddp-doctor-report.json) and prints it on
stderr when it is not a pass.

Under `ddp-doctor run` the probes are already installed and the wrapper reports: the session only
adds what the callback knows (Trainer arguments) to the record.
"""
from __future__ import annotations

import sys
from typing import Any

from ddp_doctor.training.probes.install import install
from ddp_doctor.training.probes.record_exchange import gather, put_record
from ddp_doctor.training.probes.recorder import Recorder, current_recorder

GATHER_TIMEOUT = 30.0
KEY_PREFIX = "ddp_doctor/probe"


def _under_wrapper() -> bool:
    """`ddp-doctor run` (or its sitecustomize in a child) installed the probes, with a run
    directory their records go to."""
    rec = current_recorder()
    return rec is not None and bool(rec.out_dir)


class ProbeSession:
    def __init__(self, report_path: str | None = None, gather_timeout: float = GATHER_TIMEOUT) -> None:
        self.report_path = report_path
        self.gather_timeout = gather_timeout
        self.wrapped = False
        self.rec: Recorder | None = None
        self.finished = 0

    def start(self) -> None:
        if self.rec is not None:
            return
        self.wrapped = _under_wrapper()
        try:
            self.rec = install(None)
            self.rec.adopt_group()
        except Exception as e:  # noqa: BLE001 - the job trains on without the checks
            sys.stderr.write(f"ddp-doctor: in-training checks not started: {e!r}\n")

    def note(self, key: str, value: Any) -> None:
        if self.rec is not None:
            self.rec.extra[key] = value

    def alert(self, findings: list[Any]) -> None:
        """Errors known at once (a Trainer given a DDP model) are said now, on stderr: training
        may fail before the end-of-training report."""
        if self.wrapped or (self.rec is not None and self.rec.rank not in (None, 0)):
            return  # the wrapper's report says it; without one, rank 0 speaks for all
        for f in findings:
            if f.severity == "error":
                sys.stderr.write(f"ddp-doctor: {f.id} {f.title}: {f.message}\n")

    def finish(self) -> dict[str, Any] | None:
        """End of training: this rank's record to rank 0; rank 0 returns the report it wrote."""
        rec = self.rec
        if rec is None:
            return None
        if rec.steps:
            rec.checksum("end")
        if self.wrapped:
            rec.flush()
            return None
        self.finished += 1
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            return self._report([rec.to_dict()], missing=[])
        rec.adopt_group()
        rank, world = dist.get_rank(), dist.get_world_size()
        store = dist.distributed_c10d._get_default_store()
        prefix = f"{KEY_PREFIX}/{self.finished}"
        try:
            put_record(store, f"{prefix}/{rank}", rec)
        except Exception as e:  # noqa: BLE001 - the store went away: nothing to share
            sys.stderr.write(f"ddp-doctor: could not share rank {rank}'s probe record: {e}\n")
            return None
        if rank != 0:
            return None
        got, missing = gather(store, prefix, world, self.gather_timeout)
        return self._report(got, missing)

    def _report(self, records: list[dict[str, Any]], missing: list[int]) -> dict[str, Any]:
        from ddp_doctor.checks.internal import probe_records_missing
        from ddp_doctor.checks.job import JobEvidence
        from ddp_doctor.context import current_context
        from ddp_doctor.report import build as reportlib
        from ddp_doctor.report.publish import Output, publish
        from ddp_doctor.training.job_report import judge
        more = [probe_records_missing(missing, self.gather_timeout)] if missing else []
        judged = judge(JobEvidence(probes=records), world=reportlib.world_of(current_context()), more=more)
        # rank 0 only: a pass gets one line too, so the report file it leaves is never a surprise
        publish(judged.report, Output(report_path=self.report_path, only_if_not_pass=True, stderr=True,
                                      verdict_if_pass=True), evidence=judged.evidence)
        return judged.report
