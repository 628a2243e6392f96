"""The one reader of a run directory (training/records.py says what each file is): everything the
job's verdict needs, read at once into a typed record."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from ddp_doctor.training import records
from ddp_doctor.training.run.nccl_dumps import merged


@dataclass
class RunRecords:
    """What a run directory holds about the job: each rank's outcome, heartbeat and ledger of
    collectives (NCCL's own dumps merged in, the newer per rank; other nodes' copied in), the
    crash dumps, the init_process_group calls and the probe records."""

    run_dir: str
    outcomes: dict[int, dict[str, Any]] = field(default_factory=dict)
    heartbeats: dict[int, dict[str, Any]] = field(default_factory=dict)
    ledgers: dict[int, dict[str, Any]] = field(default_factory=dict)
    crashes: dict[int, tuple[str, float]] = field(default_factory=dict)
    init_calls: list[dict[str, Any]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)

    def stacks(self, ranks: Iterable[int]) -> dict[int, str]:
        """The stacks each rank dumped when asked (at a hang or stop), "" where none."""
        return {r: records.read_stack(self.run_dir, r) or "" for r in ranks}


def read_run(run_dir: str, since: float = 0.0) -> RunRecords:
    """The records written at `since` or later (older ones are another job's)."""
    return RunRecords(run_dir=run_dir, outcomes=records.read_outcomes(run_dir, since),
                      heartbeats=records.read_heartbeats(run_dir, since),
                      ledgers=merged(run_dir, records.read_ledgers(run_dir, since), since=since),
                      crashes=records.read_crashes(run_dir), init_calls=records.read_init_calls(run_dir),
                      probes=records.read_probes(run_dir, since))
