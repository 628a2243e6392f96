"""The one reader of a run directory (training/records.py says what each file is): everything the
job's verdict needs, read at once into a typed record; and which directory is this job's.

One job, one run directory. Under a ddp-doctor parent the parent makes it (private, per run).
Under an outside launcher the ranks of one node find it by name in the node's temp directory, so
the name is made of what every rank of one job on this node shares and no other job does (job_id):

- torchrun: its elastic agent, the parent of the node's ranks. The agent makes a log directory of
  its own per run (tempfile.mkdtemp) and gives each rank an error file under it,
  `<run log dir>/attempt_<restart>/<local rank>/error.json` (TORCHELASTIC_ERROR_FILE): that
  attempt directory names the agent and the attempt, even through a wrapper script between the
  agent and the rank. Without it (`--log-dir /dev/null`, a layout torch changed), the parent
  process (pid and start time, so a reused pid is another job) and the restart count. Never the
  run id alone: it is "none" for every job started without --rdzv-id / --standalone.
- Open MPI: its job id (OMPI_MCA_ess_base_jobid; Open MPI 5 and other PMIx launchers:
  PMIX_NAMESPACE). MPICH / Intel MPI: the parent, hydra's proxy of this job on this node.
- SLURM (srun): the job id and step id.
- Ranks started by hand (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): MASTER_ADDR and MASTER_PORT.
  Two jobs can only share these by meeting at one store, and two jobs at one store fail their
  preflight (DDP846), so no job trains with another's directory. Jobs one after another on one
  port do share it: the records' job token (records.join_job) keeps them apart.

Whatever the name, every record names its job (the token the ranks agreed at the preflight's
store), and read_run keeps only this job's.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from ddp_doctor.training import records
from ddp_doctor.training.run.nccl_dumps import merged

if TYPE_CHECKING:  # the verdict's rules load only when a verdict is made, not at a rank's start (job_id)
    from ddp_doctor.checks.job import JobEvidence


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
    last_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    init_calls: list[dict[str, Any]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)

    def stacks(self, ranks: Iterable[int]) -> dict[int, str]:
        """The stacks each rank dumped when asked (at a hang or stop), "" where none."""
        return {r: records.read_stack(self.run_dir, r) or "" for r in ranks}


def read_run(run_dir: str, since: float = 0.0) -> RunRecords:
    """This job's records (records.join_job: one that names another job is never read) written at
    `since` or later (older ones are another job's)."""
    return RunRecords(run_dir=run_dir, outcomes=records.read_outcomes(run_dir, since),
                      heartbeats=records.read_heartbeats(run_dir, since),
                      ledgers=merged(run_dir, records.read_ledgers(run_dir, since), since=since),
                      crashes=records.read_crashes(run_dir), last_calls=records.read_call_notes(run_dir),
                      init_calls=records.read_init_calls(run_dir),
                      probes=records.read_probes(run_dir, since))


def job_evidence(run: RunRecords, *, stopped_at: dict[int, dict[str, Any]], private: bool,
                 exits: dict[int, int] | None = None, vanished: dict[int, dict[str, Any]] | None = None,
                 interrupted: Any = None, hung: bool = False, hang_timeout: float = 0.0,
                 slow: dict[str, Any] | None = None, stuck_in_init: bool = False, launcher_code: int | None = None,
                 since: float = 0.0, clock_offsets: dict[int, tuple[float, float]] | None = None) -> JobEvidence:
    """The judge's evidence (checks/job.py) from this job's records and what its gatherer saw at
    the end: where each rank was at a stop or hang (`stopped_at`), the exit statuses its launcher
    saw (`exits`, only for a job that ended on its own), the ranks gone without an ending.
    `private`: the run directory is this job's alone (ddp-doctor's parent made it and launched every
    rank), so every rank that beat is one of the job's, the crash dumps are its own, and a rank that
    never formed a process group is known to have trained alone; under an outside launcher the
    directory is found by name (job_id), and only records that name this job are judged."""
    from ddp_doctor.checks.job import JobEvidence
    stopped = hung or interrupted is not None
    exits = {} if stopped else dict(exits or {})
    vanished = dict(vanished or {})
    ranks = sorted(set(run.heartbeats if private else ()) | set(run.outcomes) | set(exits) | set(stopped_at)
                   | set(vanished))
    return JobEvidence(
        ranks=ranks, outcomes=run.outcomes, exits=exits, crashes=run.crashes if private else {},
        last_calls=run.last_calls if private else {}, ledgers=run.ledgers,
        init_calls=[c for c in run.init_calls if float(c.get("time") or 0) >= since], probes=run.probes,
        stopped_at=stopped_at, stacks=run.stacks(stopped_at), interrupted=interrupted,
        hung=hung and interrupted is None, hang_timeout=hang_timeout, slow=slow, stuck_in_init=stuck_in_init,
        launcher_code=launcher_code, world_size=(len(ranks) or None) if private else None,
        started=bool(run.heartbeats) if private else True, launched_alone=private, vanished=vanished,
        heartbeats=run.heartbeats, clock_offsets=dict(clock_offsets or {}))


def read_exits(run_dir: str) -> dict[int, int]:
    """rank -> the exit status the launcher saw (agent.json, written by ddp-doctor's launcher when
    a rank failed); {} when it wrote none."""
    import json
    try:
        with open(records.agent_result_path(run_dir), encoding="utf-8") as f:
            return {int(k): int(v) for k, v in json.load(f).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def job_id(env: Mapping[str, str]) -> str:
    """The name of this job's run directory on this node (the module docstring gives the rule):
    a readable label, then a digest of what identifies the job, e.g. `none-3fa2b1c4d5e6`."""
    from ddp_doctor.facts.launchers import launcher_name
    launcher = launcher_name(env)
    if launcher == "torchrun":
        agent = (_elastic_attempt_dir(env.get("TORCHELASTIC_ERROR_FILE") or "")
                 or f"{process_identity(os.getppid())}/{env.get('TORCHELASTIC_RESTART_COUNT') or '0'}")
        return _name(env.get("TORCHELASTIC_RUN_ID") or "torchrun", f"torchrun:{agent}")
    mpi_job = env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE")
    if launcher == "mpirun" and mpi_job:
        return _name("mpi", f"mpi:{mpi_job}")
    if launcher in ("mpirun", "mpich"):
        return _name("mpi", f"mpi:{process_identity(os.getppid())}")
    if launcher == "slurm":  # ranks started by hand inside an allocation: by their MASTER_PORT, below
        step = f"{env.get('SLURM_JOB_ID') or ''}.{env.get('SLURM_STEP_ID') or ''}"
        return _name(f"slurm-{step}", f"slurm:{step}")
    where = f"{env.get('MASTER_ADDR') or 'local'}-{env.get('MASTER_PORT') or '0'}"
    return _name(where, f"env:{where}")


def _name(label: str, identity: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", label)[:48]  # a run id is the user's text: keep it a name
    return f"{safe}-{hashlib.sha256(identity.encode('utf-8', 'replace')).hexdigest()[:12]}"


def _elastic_attempt_dir(error_file: str) -> str | None:
    """`<run log dir>/attempt_N` from torchelastic's `<run log dir>/attempt_N/<local rank>/error.json`,
    or None when the path has another shape."""
    attempt = os.path.dirname(os.path.dirname(error_file))
    if os.path.basename(error_file) != "error.json" or not re.fullmatch(r"attempt_\d+", os.path.basename(attempt)):
        return None
    return attempt


def process_identity(pid: int) -> str:
    """pid, start time and boot: one process, never a later one that reuses its pid. Read from
    /proc/PID/stat (field 22, the start in clock ticks after boot); elsewhere psutil's create_time."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()  # the name, in parentheses, may hold spaces
        started = fields[19]
        with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as f:
            boot = f.read().strip()
        return f"{pid}@{started}@{boot}"
    except (OSError, IndexError):
        pass
    try:
        import psutil
        return f"{pid}@{psutil.Process(pid).create_time():.3f}"
    except Exception:  # noqa: BLE001 - no such process, no access: the pid alone
        return str(pid)
