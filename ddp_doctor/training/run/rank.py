"""One rank of `ddp-doctor run`: preflight, clean teardown, then the user's script in this same
process, watched; what happened is left in the run directory for the report.

Under a ddp-doctor parent the parent merges the records and writes the report. Under an outside
launcher (torchrun, mpirun, SageMaker) each failing rank writes torchelastic's error file and the
SageMaker failure file itself, and rank 0 writes the report from the records it can see.
"""
from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from ddp_doctor.exit_codes import EXIT_HANG, EXIT_INTERNAL
from ddp_doctor.report import build as reportlib
from ddp_doctor.report.publish import Output
from ddp_doctor.training import records
from ddp_doctor.training.run.target import Target, run_target

RUN_DIR_ENV = "DDP_DOCTOR_RUN_DIR"
PARENT_ENV = "DDP_DOCTOR_RUN_PARENT"  # set by a ddp-doctor parent that watches and reports


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


def run_dir_for(env: Any) -> str:
    """Where this rank's records go: the parent's directory, DDP_DOCTOR_RUN_DIR, or a directory
    per job in the temp dir (shared by the ranks of one node)."""
    if env.get(RUN_DIR_ENV):
        return env[RUN_DIR_ENV]
    job = (env.get("TORCHELASTIC_RUN_ID") or env.get("OMPI_MCA_ess_base_jobid") or env.get("SLURM_JOB_ID")
           or f"{env.get('MASTER_ADDR', 'local')}-{env.get('MASTER_PORT', '0')}")
    return os.path.join(tempfile.gettempdir(), f"ddp-doctor-run-{job}".replace("/", "_"))


def preflight(opts: RunOptions, run_dir: str) -> tuple[dict[str, Any], int]:
    from ddp_doctor.context import current_context
    from ddp_doctor.preflight_run.rank import PreflightOptions, RankPreflight
    under_parent = bool(os.environ.get(PARENT_ENV))
    out = Output(report_path=opts.report_path, only_if_not_pass=True, stderr=True)
    pf_opts = PreflightOptions(timeout=opts.timeout, select=opts.select, skip=opts.skip, backend=opts.backend,
                      output=out, check_options=opts.check_options,
                      launch_dir=os.path.join(run_dir, "preflight") if under_parent else None,
                      entry_script=opts.target.path)
    if pf_opts.launch_dir:
        records.make_private_dir(pf_opts.launch_dir)
    pf = RankPreflight(current_context(backend=opts.backend, entry_script=opts.target.path,
                                       options=opts.check_options), pf_opts)
    rep = pf.run()
    failed = pf.failed
    del pf  # release the store and process group before the script creates its own
    gc.collect()
    return rep, EXIT_INTERNAL if failed else reportlib.exit_code(rep)


def run_training_rank(opts: RunOptions) -> int:
    """The whole life of one rank; returns the exit status the process should end with."""
    from ddp_doctor.facts.launchers import detect
    info = detect(os.environ)
    rank = info.rank if info.rank is not None else 0
    started = time.time()
    own_dir = info.name == "none"  # one process, no launcher: this run's directory is ours to remove
    run_dir = tempfile.mkdtemp(prefix="ddp-doctor-run-") if own_dir else run_dir_for(os.environ)
    records.make_private_dir(run_dir)  # 0700; an earlier version's 0755 directory is tightened
    under_parent = bool(os.environ.get(PARENT_ENV))
    if not own_dir:  # before the first process group (the preflight's): under an outside launcher
        from ddp_doctor.training.run.ledger import recorder_env  # no parent set the recorder's env
        recorder_env(os.environ, run_dir)

    from ddp_doctor.training.run.watchdog import ProgressWatch
    watch = ProgressWatch(run_dir, rank, opts.hang_timeout,
                         on_hang=None if under_parent else _end_hung_rank).start()
    if not under_parent and not own_dir:  # a stopped job (torchrun forwards SIGTERM) still reports
        watch.watch_stop_signals(lambda w, sig: _end_stopped_rank(w, sig, started, opts))
    outside = not under_parent and not own_dir  # torchrun, SageMaker's toolkit, mpirun, SLURM
    if outside:  # a chdir in the script must not move the report
        opts.report_path = os.path.abspath(Output(report_path=opts.report_path).path())
    pf_report, code = preflight(opts, run_dir)
    if code == 0 and outside and rank == 0:
        _say_running(pf_report, opts)  # never the preflight's "pass" for a job still to run
    if code != 0:
        # The script never ran: end without interpreter teardown (torch 2.13's gloo may abort
        # there after a correct teardown, docs/facts.md, "The gloo teardown abort"), keeping exit status 3 exact.
        watch.stop()
        if own_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    watch.training_starts()
    # mpirun / MPICH / srun set only their own variables: export torch's (RANK, WORLD_SIZE,
    # LOCAL_RANK, and MASTER_ADDR/PORT on one node) so the script's init_process_group() works (DDP110)
    from ddp_doctor.checks.launcher_env import script_env_exports
    os.environ.update(script_env_exports(info, os.environ))
    probe = _install_probes(run_dir)
    from ddp_doctor.training.probes.init_arguments import remember_launcher
    remember_launcher(info.rank, info.world_size)
    init_watch = None
    if own_dir:  # no launcher: the processes the script starts are judged at init (they may wait there)
        from ddp_doctor.training.run.init_verdict import InitWatch
        init_watch = InitWatch(run_dir, watch, started, lambda: _finish_outside(
            rank, run_dir, started, True, opts, stuck_in_init=True)).start()
    _record_fatal_signals(run_dir, rank)
    watch.script_started_ns = time.time_ns()
    outcome = run_target(opts.target)
    if init_watch is not None:
        init_watch.stop()
    # A stop signal that ended the script (a peer stopped first: "Connection closed") is reported
    # as the stop; the script's own ending is its consequence. Whichever thread reads it reports it.
    signo = None if watch.stopping else watch.stop_signal()
    if signo is not None:
        _end_stopped_rank(watch, signo, started, opts)
    if watch.stopping:  # the watchdog thread is reporting it and ends the process
        _wait_for_stop()
    watch.phase = "teardown"  # from here the watchdog leaves the ledger to this thread
    position = _ledger_position(outcome)
    if probe is not None:
        probe.end(how="script", exit_code=outcome.exit_code, raised=outcome.exception is not None)
    records.write_outcome(run_dir, rank, {"exit_code": outcome.exit_code, "exception": outcome.exception,
                                          "host": os.uname().nodename, "phase": "training",
                                          "local_rank": os.environ.get("LOCAL_RANK")})
    if not own_dir:  # after the records the report needs: a peer's failure may end this rank soon
        _leave_ledger(watch, run_dir, rank, position, outcome)
        if _other_nodes(info):  # other nodes' reports see this ending; a failure sees theirs
            from ddp_doctor.training.run.endings import exchange
            exchange(run_dir, rank, failed=position == "failed")
    if not under_parent:
        _finish_outside(rank, run_dir, started, outcome.exit_code != 0 or outcome.exception is not None, opts)
    watch.stop()
    if own_dir:
        shutil.rmtree(run_dir, ignore_errors=True)
    return outcome.exit_code


PEER_LEDGER_WAIT = 5.0  # seconds a failing rank waits for its live peers' ledgers (watchdogs poll each second)


def _leave_ledger(watch: Any, run_dir: str, rank: int, position: str, outcome: Any) -> None:
    """This rank's ledger; a rank that failed also asks the live ranks of its node for theirs and
    waits a bounded moment: once it exits, the launcher stops them, and where they were then
    (elsewhere, or waiting in a collective) is what tells cause from consequence."""
    from ddp_doctor.training.run import ledger
    if position != "failed":
        watch.write_ledger(position, where="")
        return
    in_collective, where = ledger.from_exception(outcome.exception)
    watch.write_ledger(position, where=where or "", failed_in_collective=in_collective)
    live = ledger.live_ranks(run_dir, but=rank, since=watch.job_since)
    if live:
        asked = time.time()
        ledger.request(run_dir, reason="peer failed")
        ledger.wait_for(run_dir, live, asked, PEER_LEDGER_WAIT)


def _other_nodes(info: Any) -> bool:
    return bool(info.world_size and info.local_world_size and info.world_size > info.local_world_size)


def _ledger_position(outcome: Any) -> str:
    from ddp_doctor.training.run.ledger import default_group_is_up
    if outcome.exception is not None:
        return "failed"
    return "finished" if default_group_is_up() else "destroyed"


_fatal_signal_file: Any = None  # open for the life of the process: faulthandler writes to it


def _record_fatal_signals(run_dir: str, rank: int) -> None:
    """faulthandler writes the Python stack of every thread to crash-RANK.txt when a fatal signal
    (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) hits the rank, then the signal ends it as before: a
    crash in native code leaves no Python traceback otherwise."""
    global _fatal_signal_file
    import faulthandler
    try:
        _fatal_signal_file = records.open_private(records.crash_path(run_dir, rank))  # 0600
        faulthandler.enable(file=_fatal_signal_file, all_threads=True)
    except (OSError, ValueError, RuntimeError):
        pass


def _install_probes(run_dir: str) -> Any:
    """The in-training probes, here and in the Python processes the script starts; if they cannot
    be installed (a torch whose internals moved), the script runs without them and says so."""
    from ddp_doctor.training.probes.children import child_env
    from ddp_doctor.training.probes.install import install
    try:
        probe = install(run_dir)
    except Exception as e:  # noqa: BLE001
        sys.stderr.write(f"ddp-doctor: in-training probes not installed ({e!r}); training runs unwatched by them\n")
        return None
    child_env(os.environ, run_dir)  # type: ignore[arg-type]
    return probe


def _wait_for_stop(bound: float = 30.0) -> None:
    """The main thread, while the watchdog thread reports the stop and ends the process (os._exit);
    past the bound the main thread goes on to its own ending."""
    time.sleep(bound)


STOPPED_PEERS_WAIT = 5.0  # seconds a stopped rank waits for its node's ledgers (rank 0) or rank 0's


def _end_stopped_rank(watch: Any, signo: int, started: float, opts: RunOptions) -> None:
    """Outside launcher, SIGTERM/SIGHUP (a stopped SageMaker job, a cancelled torchrun job): this
    rank's stacks, ledger and outcome, the report (rank 0's, or this rank's own file), then exit
    128 + the signal as the default action would. Runs on the watchdog thread."""
    from ddp_doctor.preflight_run.stop_signals import Interrupt
    if not watch.claim_stop():
        return  # the other thread reports this stop and ends the process
    stop = Interrupt(signo)
    own = records.read_outcomes(watch.run_dir, watch.job_since).get(watch.rank)
    if own is not None and (own.get("exception") or own.get("exit_code")) and not own.get("interrupted"):
        # this rank had failed already; the launcher stops it because of that (or of a peer's
        # failure): the job's verdict is the failure, and the rank exits with its own status
        try:
            _finish_outside(watch.rank, watch.run_dir, started, True, opts)
        finally:
            sys.stderr.flush()
            os._exit(int(own.get("exit_code") or 1))
    try:
        if watch.phase == "training":
            # first: in a collective at its last sample, that one did not complete, even if a peer
            # that exits first makes it fail (torch then retires it) before this dump
            watch.write_ledger("running", failed_in_collective=watch.in_collective)
        sys.stderr.write(f"ddp-doctor: rank {watch.rank} stopped by {stop.name}; where it was follows\n")
        watch.dump_stacks(sys.stderr)
        if watch._stack_file is not None:
            watch.dump_stacks(watch._stack_file)
        records.write_outcome(watch.run_dir, watch.rank, {
            "exit_code": stop.exit_code, "exception": None, "interrupted": stop.to_dict(),
            "host": os.uname().nodename, "phase": watch.phase})
        if watch.phase == "training":
            from ddp_doctor.training.run import ledger
            local = list(records.read_heartbeats(watch.run_dir, watch.job_since))
            # Rank 0 reports from its node's ledgers: it waits for them; the others stay until
            # rank 0's is written (their exit would make its pending collective fail first).
            wanted = [r for r in local if r != watch.rank] if watch.rank == 0 else [r for r in local if r == 0]
            if wanted:
                ledger.wait_for(watch.run_dir, wanted, started, STOPPED_PEERS_WAIT)
        _finish_outside(watch.rank, watch.run_dir, started, True, opts, interrupted=stop)
    finally:
        sys.stderr.flush()
        os._exit(stop.exit_code)


def _finish_outside(rank: int, run_dir: str, started: float, failed: bool, opts: RunOptions,
                    interrupted: Any = None, stuck_in_init: bool = False) -> None:
    """No ddp-doctor parent: the job's report is written by a rank that knows how the job ended.
    A rank that failed writes it at once (a peer whose process is gone without an ending is named:
    killed, the OOM killer?); a rank that ended well writes it when every rank of its node has
    ended (rank 0 waits a bounded moment for them), so the last one to end writes the verdict and
    a job with a rank still running stays "running", never "pass". A failing rank also leaves its
    diagnosis in torchelastic's error file and SageMaker's failure file (first writer wins) and
    says it on stderr. `stuck_in_init`: the job was ended because its processes waited inside
    init_process_group with arguments that cannot work (InitWatch)."""
    from ddp_doctor.checks.job import JobEvidence
    from ddp_doctor.context import current_context
    from ddp_doctor.report import sinks
    from ddp_doctor.report.publish import platform_sinks, publish, show
    from ddp_doctor.training.job_report import job_report
    from ddp_doctor.training.run.run_dir import read_run
    since = started - records.SAME_JOB
    if rank == 0 and not failed and interrupted is None:
        _wait_for_local_ranks(run_dir, started)
    run = read_run(run_dir, since=since)
    from ddp_doctor.training.run.endings import multi_node
    from ddp_doctor.training.run.ledger import vanished_ranks
    gone = vanished_ranks(run_dir, but=rank, since=since) if interrupted is None else {}
    local = set(records.read_heartbeats(run_dir, since)) | {rank}
    ended_well = not failed and interrupted is None and not stuck_in_init
    if ended_well and (multi_node() and rank != 0 or not multi_node() and not local <= set(run.outcomes) | set(gone)):
        # one node: the last rank to end writes the verdict; several: rank 0 does (it gathers the
        # other nodes' probe records), after its bounded wait for the ranks of its node
        return
    beats = {r: hb for r, hb in records.read_heartbeats(run_dir).items() if r == rank} if interrupted else {}
    # what this job's processes passed to init_process_group (spawned children's included)
    calls = [c for c in run.init_calls if float(c.get("time") or 0) >= since]
    ev = JobEvidence(ranks=sorted(set(run.outcomes) | set(gone)), outcomes=run.outcomes, ledgers=run.ledgers,
                     probes=run.probes, interrupted=interrupted, stopped_at=beats, stacks=run.stacks(beats),
                     init_calls=calls, stuck_in_init=stuck_in_init, vanished=gone)
    ctx = current_context()
    rep, _ = job_report(ev, world=reportlib.world_of(ctx))
    out = Output(report_path=opts.report_path, only_if_not_pass=True, stderr=True)
    path = out.path()
    if interrupted is not None:  # every rank was stopped: each keeps its file, rank 0 shows its report
        own = path if rank == 0 else f"{path}.rank{rank}.json"
        sinks.write_report_file(rep, own)
        if rank == 0:
            show(rep, out, own)
        return
    shown = not failed or rank in (rep.get("root_cause") or {}).get("ranks", []) or (ctx.world_size or 1) == 1
    publish(rep, Output(report_path=path, only_if_not_pass=True, stderr=True, quiet=not shown), path=path)
    if failed:
        platform_sinks(rep, ctx)


def _say_running(preflight_report: dict[str, Any], opts: RunOptions) -> None:
    """From the moment training starts, the report (file, S3) says the job is running, with the
    preflight's verdict inside; the job's real ending replaces it (_finish_outside)."""
    from ddp_doctor.report import sinks
    from ddp_doctor.report.publish import upload_report, warn
    rep = reportlib.mark_running(preflight_report)
    out = Output(report_path=opts.report_path)
    err = sinks.write_report_file(rep, out.path())
    if err:
        warn(err)
    upload_report(rep, out)


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


def _end_hung_rank(watch: Any) -> None:
    """Outside launcher: a rank without progress dumps its stacks and ends itself (exit 124), so
    the launcher ends the job instead of waiting for torch's 30-minute timeout."""
    sys.stderr.write(f"ddp-doctor: rank {watch.rank} made no progress for {watch.hang_timeout:g} s; "
                     f"its stacks follow, then it exits {EXIT_HANG}\n")
    watch.dump_stacks(sys.stderr)
    records.write_outcome(watch.run_dir, watch.rank, {"exit_code": EXIT_HANG, "exception": None,
                                                      "hung": True, "phase": "training"})
    watch.write_ledger("hung")  # this is the watchdog thread: the main thread is blocked
    sys.stderr.flush()
    os._exit(EXIT_HANG)
