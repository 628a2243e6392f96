"""The job's verdict written by a rank itself: under an outside launcher (torchrun, mpirun, SLURM,
SageMaker's toolkit) or run as one process, no ddp-doctor parent merges the records, so a rank that
knows how the job ended writes the report from the records it can see (write_outside_report): at
once when it failed, when the last rank ended well, or for a stop, a hang or a bad init. The
preflight's findings and figures its reporting rank left are kept (preflight_findings).
"""
from __future__ import annotations

import glob
import json
import os
import sys
import time
from typing import Any

from ddp_doctor.context import current_context
from ddp_doctor.facts.launchers import multi_node, world_sizes
from ddp_doctor.report import build as reportlib
from ddp_doctor.report import sinks
from ddp_doctor.report.publish import Output, platform_sinks, publish, show
from ddp_doctor.training import records
from ddp_doctor.training.run.endings import (
    JOB_END_WAIT_ENV,
    job_end_wait,
    remote_gone,
    remote_hung,
    wait_for_job,
)
from ddp_doctor.training.run.ledger import vanished_ranks
from ddp_doctor.training.run.options import RunOptions


def write_outside_report(rank: int, run_dir: str, started: float, failed: bool, opts: RunOptions,
                         interrupted: Any = None, stuck_in_init: bool = False, job: Any = None,
                         hung: dict[int, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """No ddp-doctor parent: the job's report is written by a rank that knows how the job ended.
    A rank that failed writes it at once (a peer whose process is gone without an ending is named:
    killed, the OOM killer?); a rank that ended well writes it when every rank of the job has
    ended, so the last one to end writes the verdict and a job with a rank still running stays
    "running", never "pass". One node: the run directory shows every rank's ending (rank 0 waits a
    bounded moment for them). Several nodes (`job`: the store's word, training/run/endings.py):
    the last rank of the job writes on its node, and rank 0 waits up to JOB_END_WAIT for the
    others and writes on its node when they all ended. A failing rank also leaves its
    diagnosis in torchelastic's error file and SageMaker's failure file (first writer wins) and
    says it on stderr. `stuck_in_init`: the job was ended because its processes waited inside
    init_process_group with arguments that cannot work (InitWatch). Returns the job's report when
    this rank wrote it as the job's verdict (None when another rank writes it, or for a stop)."""
    # deferred: ranks under ddp-doctor's parent never write the report (the parent does) and skip
    # these imports at their start; under an outside launcher warm_stop_report loads them early
    from ddp_doctor.checks.arrivals import clock_offsets_of
    from ddp_doctor.training.job_report import judge
    from ddp_doctor.training.run.run_dir import job_evidence, read_run
    since = started - records.SAME_JOB
    if rank == 0 and not failed and interrupted is None:
        _wait_for_local_ranks(run_dir, started)
    ended_well = not failed and interrupted is None and not stuck_in_init
    several_nodes = multi_node(*world_sizes(os.environ))
    if ended_well and several_nodes and not _job_ended(rank, run_dir, job):
        return None  # a rank still runs on another node: the last rank of the job writes the verdict
    run = read_run(run_dir, since=since)
    gone = {**remote_gone(run_dir), **vanished_ranks(run_dir, but=rank, since=since)} if interrupted is None else {}
    local = set(records.read_heartbeats(run_dir, since)) | {rank}
    if ended_well and not several_nodes and not local <= set(run.outcomes) | set(gone):
        return None  # ranks of this node still run: the last one to end writes the verdict
    beats: dict[int, dict[str, Any]] = {}
    if interrupted is not None:  # where it was; rank 0's report, where each rank of its node was
        beats = {r: hb for r, hb in records.read_heartbeats(run_dir, since).items() if r == rank or rank == 0}
    if hung is not None:  # where every rank was at the hang (other nodes' copied here at it)
        beats, gone = {**remote_hung(run_dir), **hung}, {}
    hang_timeout = max((float(hb.get("bound") or 0) for hb in beats.values()), default=0.0)
    ev = job_evidence(run, stopped_at=beats, private=False, vanished=gone, interrupted=interrupted,
                      hung=hung is not None,
                      hang_timeout=hang_timeout, stuck_in_init=stuck_in_init, since=since)
    ctx = current_context()
    earlier, pf = preflight_findings(run_dir, since)
    ev.clock_offsets = clock_offsets_of((pf or {}).get("measurements"))
    judged = judge(ev, world=reportlib.world_of(ctx), ranks=(pf or {}).get("ranks") or None, earlier=earlier,
                   measurements=(pf or {}).get("measurements") or None, history_env=ctx.env)
    rep = judged.report
    verbose = getattr(opts, "verbose", False)
    out = Output(report_path=opts.report_path, only_if_not_pass=True, stderr=True, verbose=verbose)
    path = out.path()
    if interrupted is not None:  # every rank was stopped: each keeps its file, rank 0 shows its report
        own = path if rank == 0 else f"{path}.rank{rank}.json"
        if sinks.write_report_file(rep, own) is None:
            sinks.write_evidence_file(judged.evidence, own)
        if rank == 0:
            show(rep, out, own)
        return None
    shown = not failed or rank in (rep.get("root_cause") or {}).get("ranks", []) or (ctx.world_size or 1) == 1
    publish(rep, Output(report_path=path, only_if_not_pass=True, stderr=True, quiet=not shown,
                        verdict_if_pass=True, verbose=verbose), path=path, evidence=judged.evidence)
    if failed or rep.get("status") == "fail":  # a rank that ended well may report another node's failure
        platform_sinks(rep, ctx.env, ctx.sagemaker)
    return rep


def _job_ended(rank: int, run_dir: str, job: Any) -> bool:
    """Several nodes, this rank ended well: whether every rank of the job has ended (then their
    endings are copied here). Rank 0 waits a bounded moment for them and says so when it stops
    waiting; the report then stays "running" until the last rank writes it on its node."""
    if job is None or job.complete:
        return job is not None
    if rank != 0:
        return False
    bound = job_end_wait()
    job = wait_for_job(run_dir, job, bound)
    if not job.complete and not job.world:
        sys.stderr.write("ddp-doctor: rank 0 ended well; the other nodes' endings could not be read from the "
                         "job's store: the report says 'running' until a rank that knows the verdict writes it\n")
    elif not job.complete:
        running = job.running()
        shown = ", ".join(map(str, running[:16])) + (f" and {len(running) - 16} more" if len(running) > 16 else "")
        sys.stderr.write(f"ddp-doctor: rank 0 ended well; rank(s) {shown} had not ended after {bound:g} s "
                         f"({JOB_END_WAIT_ENV}): the report says 'running' until the last rank of the job "
                         f"writes the verdict on its node\n")
    return job.complete


def preflight_findings(run_dir: str, since: float) -> tuple[list[Any], dict[str, Any] | None]:
    """The findings of the preflight of this job, and its report, from the record its reporting
    rank left on this node (the others' hold the verdict only): the final report keeps them."""
    best: dict[str, Any] | None = None
    for p in glob.glob(records.glob_pattern(run_dir, records.PREFLIGHT_RECORD_FILE)):
        try:
            if os.path.getmtime(p) < since:
                continue
            with open(p, encoding="utf-8") as f:
                d = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and (best is None or _fullness(d) > _fullness(best)):
            best = d
    if best is None:
        return [], None
    try:
        return reportlib.findings_of(best), best
    except (TypeError, ValueError, KeyError):
        return [], None


def _fullness(pf: dict[str, Any]) -> tuple[int, bool]:
    """The reporting rank's record holds the findings and the figures; the others' the verdict."""
    return len(pf.get("findings") or []), bool(pf.get("measurements"))


LOCAL_WAIT = 10.0  # seconds rank 0 waits for the other ranks of its node to finish their records


def _wait_for_local_ranks(run_dir: str, started: float) -> None:
    """Rank 0 finished: give the other ranks of this node a bounded moment to end their scripts,
    so their probe records are complete when the report is made."""
    want = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    deadline = time.time() + LOCAL_WAIT
    while time.time() < deadline:
        done = [p for p in records.read_probes(run_dir, since=started - records.SAME_JOB) if p.get("ended")]
        if len(done) >= want:
            return
        time.sleep(0.1)
