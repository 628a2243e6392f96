"""The job's verdict: every rule about how a training job went, run in one place over what its
ranks left, whoever gathered it (`ddp-doctor run`'s parent, a rank under an outside launcher, a
Trainer or Lightning callback).

:class:`JobEvidence` is plain data; :func:`job_findings` is a pure function of it that returns the
findings and the job's exit code. The order is the reasoning: each rank's ending (its exception,
crash or kill), the stop or hang, then the ledgers of collectives, which may show that a rank that
raised or hung only waited for another (checks/causes.py), init_process_group's arguments, the
slow rank, the ranks that never formed a process group, and the in-training probes. The training
machinery runs it through the runner, so a bug in a rule becomes a finding (DDP001), never a lost
report.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddp_doctor.checks import host_busy
from ddp_doctor.checks.arrivals import arrival_findings, node_arrival_findings
from ddp_doctor.checks.barrier_waits import monitored_barrier_verdict
from ddp_doctor.checks.causes import with_ledgers
from ddp_doctor.checks.crash_ledgers import crash_ledgers
from ddp_doctor.checks.ddp_parameters import with_parameter_names
from ddp_doctor.checks.init_arguments import init_verdict, no_process_group_finding
from ddp_doctor.checks.init_late import LATE_TO_INIT, late_init_verdict
from ddp_doctor.checks.init_waits import init_wait_verdict
from ddp_doctor.checks.leftover_rules import leftover_findings
from ddp_doctor.checks.probe_records import by_rank
from ddp_doctor.checks.rank_endings import (
    early_os_exits,
    launcher_failed_finding,
    stopped_after_failure_findings,
    training_findings,
    vanished_finding,
)
from ddp_doctor.checks.sampler import TRAINED_ALONE
from ddp_doctor.checks.stalls import hang_finding, interrupted_finding, p2p_cycle, slow_rank_finding
from ddp_doctor.checks.stops import LAUNCHER_ENDED, launcher_exit_status
from ddp_doctor.checks.training_probes import probe_findings
from ddp_doctor.exit_codes import EXIT_HANG
from ddp_doctor.findings import Finding


@dataclass
class JobEvidence:
    """What a job's ranks left, as plain data.

    `ranks`: the ranks known to have run; `outcomes`: rank -> the record written when its script
    ended; `exits`: rank -> the exit status the launcher saw (negative: a signal), empty when no
    launcher of ddp-doctor's watched; `crashes`: rank -> (faulthandler's dump, its time);
    `ledgers`: rank -> its ledger of collectives (other nodes' included); `init_calls`: what the
    processes passed to init_process_group; `probes`: the in-training probe records.
    `stopped_at`: rank -> heartbeat, where each rank was when the job hung or was stopped (with
    the bound that fired under "bound"); `stacks`: rank -> its stacks then. `interrupted`: the stop
    signal (an object with describe(), to_dict(), exit_code), None when none came. `hung`: the job
    made no progress and was ended. `slow`: the longest wait for a rank still at work;
    `stuck_in_init`: the processes waited in init_process_group with arguments that cannot work;
    `launcher_code`: the launcher's own exit status; `world_size`: bounds the ranks whose ledgers
    are judged; `launched_alone`: ddp-doctor launched every rank itself, so a rank that never
    formed a process group is known to have trained alone."""

    ranks: list[int] = field(default_factory=list)
    outcomes: dict[int, dict[str, Any]] = field(default_factory=dict)
    exits: dict[int, int] = field(default_factory=dict)
    crashes: dict[int, tuple[str, float]] = field(default_factory=dict)
    # rank -> the newest Python-level collective call it kept through a crash ({"op", "pg",
    # "input_sizes", "input_dtypes", "time_ns"}): the tensors of the call a crashed rank was inside
    last_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    ledgers: dict[int, dict[str, Any]] = field(default_factory=dict)
    init_calls: list[dict[str, Any]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    stopped_at: dict[int, dict[str, Any]] = field(default_factory=dict)
    stacks: dict[int, str] = field(default_factory=dict)
    interrupted: Any = None
    hung: bool = False
    hang_timeout: float = 0.0
    slow: dict[str, Any] | None = None
    stuck_in_init: bool = False
    launcher_code: int | None = None
    world_size: int | None = None
    started: bool = True  # a rank started its script (a heartbeat was seen)
    launched_alone: bool = False  # ddp-doctor launched the ranks: it knows each one (DDP876 may judge)
    # rank -> its last heartbeat, for ranks whose process is gone without an ending (no outcome, no
    # exit status seen: killed by SIGKILL under an outside launcher)
    vanished: dict[int, dict[str, Any]] = field(default_factory=dict)
    # ranks whose output the evidence lacks (a post-mortem without their log): an exit status
    # without a recorded error then says the error is unknown, never that there was none
    unlogged: set[int] = field(default_factory=set)
    # how a post-mortem knows the ranks the launcher started (init_waits.py): "stated" (by the
    # launcher or the platform), "one node" (every rank's output, of one node), "" (it does not)
    launched_known: str = ""
    # rank -> (its wall clock minus rank 0's, the error) in seconds, as the preflight measured
    # them (arrivals.clock_offsets_of): lets nodes' arrivals be compared (DDP878); {} when unknown
    clock_offsets: dict[int, tuple[float, float]] = field(default_factory=dict)
    # "file:line" of a call site -> the branches of the user's source around it that read the rank
    # ({"line", "condition", "taken_when", "reads"}, innermost first: facts/rank_branches.py), read
    # by whoever gathered the evidence (training/job_report.py), so the verdict never reads files
    rank_branches: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # rank -> its last heartbeat (where it was, "where": its innermost line of the user's code, and
    # when), whatever the ending: where a rank late to init was when a peer's wait for it expired
    heartbeats: dict[int, dict[str, Any]] = field(default_factory=dict)
    # a post-mortem whose logs name no rank (plain torchrun prints the ranks' lines unprefixed): how
    # many lines the script printed before the stop and the last one ({"lines", "last"}), else None
    unplaced_output: dict[str, Any] | None = None


def job_findings(ev: JobEvidence, earlier: list[Finding] | None = None) -> tuple[list[Finding], int]:
    """The findings about the job (besides `earlier` ones, the preflight's) and its exit code."""
    earlier = list(earlier or [])
    findings: list[Finding] = []
    if ev.interrupted is not None:
        findings.append(interrupted_finding(ev.interrupted, ev.stopped_at, ev.stacks, ev.unplaced_output))
        code = int(ev.interrupted.exit_code)
        findings += training_findings(ev.outcomes, {}, ev.ranks)[0]
    elif ev.hung:
        bound = max((float(hb.get("bound") or 0) for hb in ev.stopped_at.values()), default=0.0)
        hang = hang_finding(ev.stopped_at, ev.stacks, bound or ev.hang_timeout)
        cycle = p2p_cycle(hang, ev.stacks)  # every rank blocked on the same side of a send/recv
        findings += [hang] + ([cycle] if cycle else [])
        code = EXIT_HANG
        findings += training_findings(ev.outcomes, {}, ev.ranks)[0]
    else:
        more, code = training_findings(ev.outcomes, ev.exits, ev.ranks, ev.crashes, unlogged=ev.unlogged)
        findings += more + [vanished_finding(r, hb) for r, hb in sorted(ev.vanished.items())]
        findings += early_os_exits(by_rank(ev.probes), ev.outcomes, findings)  # a rank that left first
        findings += stopped_after_failure_findings(ev.outcomes, findings)
        if code == 0 and ev.launcher_code and not ev.outcomes:
            code = ev.launcher_code  # the launcher itself failed
            if not ev.started and not any(f.severity == "error" for f in earlier + findings):
                findings.append(launcher_failed_finding(ev.launcher_code))
    # DDP's errors give parameters by index: named from the probes' record (checks/ddp_parameters.py)
    findings = with_parameter_names(findings, ev.outcomes, ev.probes)
    # a rank that crashed inside a collective left no ledger: what it issued is inferred from its
    # crash dump and its peers' ledgers, and judged with theirs
    ledgers = {**crash_ledgers(ev.crashes, ev.ledgers, ev.last_calls), **ev.ledgers}
    findings = with_ledgers(findings, ledgers, world_size=ev.world_size, branches=ev.rank_branches)
    # init's arguments date from the first call; an error they explain becomes their consequence
    findings = init_verdict(findings, ev.init_calls, settled=ev.stuck_in_init)
    # a rank's init (or store wait) timed out: the ranks that had not called init by then are the cause
    findings = late_init_verdict(findings, ranks=ev.ranks, outcomes=ev.outcomes, init_calls=ev.init_calls,
                                 ledgers=ev.ledgers, heartbeats=ev.heartbeats)
    # a monitored barrier's timeout names the ranks that did not come: they are the cause
    findings = monitored_barrier_verdict(findings, outcomes=ev.outcomes, ledgers=ev.ledgers, heartbeats=ev.heartbeats)
    if not ev.init_calls:  # no record of the calls (a post-mortem): what the ranks' init waited for
        findings = init_wait_verdict(findings, ev.outcomes, ev.ranks, launched_known=ev.launched_known)
    if ev.slow and not ev.hung:
        findings.append(slow_rank_finding(ev.slow))
    if ev.interrupted is not None:
        pass  # a stop's status (128 + its signal) stands
    elif ev.stuck_in_init:
        code = EXIT_HANG  # the ranks would have waited in init until torch's timeout
    elif any(f.id == LAUNCHER_ENDED.id for f in earlier):
        code = launcher_exit_status(ev.launcher_code)  # the launcher died first: its ending is the job's
    failed = ev.hung or ev.interrupted is not None or any(f.severity == "error" for f in earlier + findings) or any(
        o.get("exception") or o.get("exit_code") for o in ev.outcomes.values())
    findings += probe_findings(ev.probes, failed=failed, load=host_busy.of_ledgers(ev.ledgers))
    if not failed:  # a job that failed is judged by its failure; one that ran, also by its pace
        findings += arrival_findings(ev.ledgers, by_rank(ev.probes))
        findings += node_arrival_findings(ev.ledgers, ev.clock_offsets, by_rank(ev.probes))
    findings += leftover_findings(ev.outcomes)  # warnings: the job's verdict and exit code stay its own
    if ev.launched_alone:
        alone = no_process_group_finding(ev.ranks, ev.outcomes, ev.init_calls, ev.probes, ev.ledgers)
        # the sampler rules' "each rank trained alone on all the data" already says it, and more
        # (or DDP879: it ended without init while a peer's init waited for it)
        said = any(f.id in (TRAINED_ALONE.id, LATE_TO_INIT.id) and set(alone.ranks) <= set(f.ranks)
                   for f in findings) if alone else True
        findings += [alone] if alone is not None and not said else []
    return findings, code


def exit_code_without_rules(ev: JobEvidence) -> int:
    """The job's exit code from its raw evidence alone, for when a rule failed: a stop's, a hang's,
    else the first non-zero status a rank ended with."""
    if ev.interrupted is not None:
        return int(ev.interrupted.exit_code)
    if ev.hung or ev.stuck_in_init:
        return EXIT_HANG
    for r in sorted(ev.outcomes):
        if ev.outcomes[r].get("exit_code"):
            return int(ev.outcomes[r]["exit_code"])
    for r in sorted(ev.exits):
        if ev.exits[r]:
            return 128 - ev.exits[r] if ev.exits[r] < 0 else ev.exits[r]
    return int(ev.launcher_code or 0)
