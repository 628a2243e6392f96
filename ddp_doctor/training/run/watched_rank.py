"""One rank of `ddp-doctor run`: preflight, clean teardown, then the user's script in this same
process, watched; what happened is left in the run directory for the report.

Under a ddp-doctor parent the parent merges the records and writes the report. Under an outside
launcher (torchrun, mpirun, SageMaker) each failing rank writes torchelastic's error file and the
SageMaker failure file itself, and rank 0 writes the report from the records it can see
(outside_report.py); a stop signal there is stopped_rank.py's, a hang hung_rank.py's. Run as one
process, without a launcher, its stops are stops_alone.py's.
"""
from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from ddp_doctor.checks.internal import records_moved_finding
from ddp_doctor.checks.launcher_env import script_env_exports
from ddp_doctor.context import current_context
from ddp_doctor.exit_codes import EXIT_INTERNAL
from ddp_doctor.facts.launchers import detect, multi_node
from ddp_doctor.preflight_ranks.one_rank import PreflightOptions, RankPreflight
from ddp_doctor.processes.collector import garbage_of_block_collected, imports_uncollected
from ddp_doctor.processes.progress import enabled
from ddp_doctor.processes.stop_signals import release_early
from ddp_doctor.processes.tree import die_with_parent
from ddp_doctor.report import build as reportlib
from ddp_doctor.report.private_files import make_records_dir
from ddp_doctor.report.publish import Output, apply_fail_on, warn
from ddp_doctor.training import records
from ddp_doctor.training.probes.children import child_env
from ddp_doctor.training.probes.collective_sites import keep_calls_in
from ddp_doctor.training.probes.exit_holders import watch_exit
from ddp_doctor.training.probes.init_calls import remember_launcher
from ddp_doctor.training.probes.install import install
from ddp_doctor.training.probes.ray_hook import hook_env
from ddp_doctor.training.run import ledger
from ddp_doctor.training.run.agent import AGENT_PID_ENV
from ddp_doctor.training.run.child_watch import watch_children
from ddp_doctor.training.run.endings import exchange
from ddp_doctor.training.run.hang_lines import HangLines
from ddp_doctor.training.run.hung_rank import end_hung_rank
from ddp_doctor.training.run.init_verdict import InitWatch
from ddp_doctor.training.run.options import PARENT_ENV, RECORDS_NOTE_ENV, RUN_DIR_ENV, RunOptions
from ddp_doctor.training.run.outside_report import write_outside_report
from ddp_doctor.training.run.stopped_rank import end_stopped_rank, wait_for_stop, warm_stop_report
from ddp_doctor.training.run.stops_alone import StopsAlone
from ddp_doctor.training.run.target import Outcome, run_target
from ddp_doctor.training.run.watchdog import ProgressWatch


def run_dir_for(env: Any) -> str:
    """Where this rank's records go: the parent's directory, DDP_DOCTOR_RUN_DIR, or a directory
    per job in the temp dir, shared by the ranks of one job on this node and by no other job
    (training/run/run_dir.py, job_id, gives the rule: under torchrun its agent, never the run id
    alone, which is "none" for every job started without one)."""
    if env.get(RUN_DIR_ENV):
        return env[RUN_DIR_ENV]
    # deferred: run_dir.py's readers are the report's; a rank under ddp-doctor's parent skips them
    from ddp_doctor.training.run.run_dir import job_id
    return os.path.join(tempfile.gettempdir(), f"ddp-doctor-run-{job_id(env)}")


def preflight(opts: RunOptions, run_dir: str, records_note: str | None = None) -> tuple[dict[str, Any], int]:
    """The preflight of this rank; `records_note`: why the records are not where asked (DDP813)."""
    under_parent = bool(os.environ.get(PARENT_ENV))
    out = Output(report_path=opts.report_path, only_if_not_pass=True, stderr=True, running_if_pass=True,
                 verbose=opts.verbose)
    pf_opts = PreflightOptions(timeout=opts.timeout, select=opts.select, skip=opts.skip, backend=opts.backend,
                      output=out, check_options=opts.check_options,
                      launch_dir=records.preflight_dir(run_dir) if under_parent else None,
                      entry_script=opts.target.path)
    if pf_opts.launch_dir:
        try:
            records.make_private_dir(pf_opts.launch_dir)
        except OSError:
            pass  # the rank's preflight report then goes unwritten; its exit status still tells
    with garbage_of_block_collected():  # the store and process group go, before the script creates its own
        pf = RankPreflight(current_context(backend=opts.backend, entry_script=opts.target.path,
                                           options=opts.check_options), pf_opts)
        if records_note:  # a warning in the report, never the verdict
            pf.findings.append(records_moved_finding(records_note, pf.rank, run_dir))
        rep = pf.run()
        failed = pf.failed
        records.join_job(pf.job_token)  # the job every rank agreed on: this rank's records name it
        del pf
    return rep, EXIT_INTERNAL if failed else reportlib.exit_code(rep)


@dataclass
class _Rank:
    """What one rank knows of its run from its start on."""
    opts: RunOptions
    info: Any  # facts/launchers.py, detect: the launcher, this rank's number, the sizes
    rank: int
    started: float
    own_dir: bool  # one process, no launcher: this run's directory is ours to remove
    under_parent: bool
    run_dir: str = ""
    records_note: str | None = None  # why the records are not where asked (DDP813)

    @property
    def outside(self) -> bool:
        """Under an outside launcher: torchrun, SageMaker's toolkit, mpirun, SLURM."""
        return not self.under_parent and not self.own_dir


def run_training_rank(opts: RunOptions) -> int:
    """The whole life of one rank; returns the exit status the process should end with."""
    with imports_uncollected():  # torch's import, in _watch
        me = _begin(opts)
        watch, alone = _watch(me)
    _preflight_first(me, watch)  # a preflight that did not pass ends the process here
    outcome, probe, children = _run_script(me, watch)
    # A stop signal that ended the script (a peer stopped first: "Connection closed") is reported
    # as the stop; the script's own ending is its consequence. Whichever thread reads it reports it.
    signo = None if watch.stopping else watch.stop_signal()
    if signo is None and not watch.stopping and (outcome.exit_code or outcome.exception is not None):
        signo = watch.stop_to_script  # a stop the script's own handler took, then failed on (exit 1)
    if alone is not None:
        alone.after_script(signo, outcome)  # a stop that ended the script: reported, then the process ends
    elif signo is not None:
        end_stopped_rank(watch, signo, me.started, opts)
    if watch.stopping:  # the watchdog thread is reporting it and ends the process
        wait_for_stop()
    if alone is not None:
        alone.claim()  # the script ended on its own: a stop from now on is noted, never a second report
    ending, job = _record_ending(me, watch, outcome, probe, children)
    written = None  # the job's report, when this rank wrote it
    if not me.under_parent:
        written = write_outside_report(me.rank, me.run_dir, me.started,
                                       outcome.exit_code != 0 or outcome.exception is not None, opts, job=job)
    watch.stop()
    if me.own_dir:
        shutil.rmtree(me.run_dir, ignore_errors=True)
    code = alone.exit_code(outcome.exit_code) if alone is not None else outcome.exit_code
    if written is not None:  # --fail-on: the rank that wrote the job's report exits 3 on its verdict
        code = _fail_on(me, code, written, ending)
    return code


def _begin(opts: RunOptions) -> _Rank:
    """Who this rank is and where its records go, before anything else runs."""
    info = detect(os.environ)
    me = _Rank(opts, info, rank=info.rank if info.rank is not None else 0, started=time.time(),
               own_dir=info.name == "none", under_parent=bool(os.environ.get(PARENT_ENV)))
    _die_with_launcher()  # ddp-doctor's own launcher killed (SIGKILL): this rank does not train on
    # 0700 (an earlier version's 0755 directory is tightened), with room for the records: a full or
    # read-only place moves them elsewhere with a warning (DDP813), never changing the verdict.
    if me.under_parent:  # the parent chose the place and said why it moved
        me.run_dir, me.records_note = run_dir_for(os.environ), os.environ.get(RECORDS_NOTE_ENV)
        try:
            records.make_private_dir(me.run_dir)
        except OSError:
            pass
    else:
        me.run_dir, me.records_note = make_records_dir(None if me.own_dir else run_dir_for(os.environ))
        if me.records_note and os.environ.get("LOCAL_RANK", "0") == "0":  # one line per node
            warn(me.records_note)
    if not me.own_dir:  # before the first process group (the preflight's): under an outside launcher
        ledger.recorder_env(os.environ, me.run_dir)  # no parent set the recorder's env
    return me


def _watch(me: _Rank) -> tuple[ProgressWatch, StopsAlone | None]:
    """The watchdog thread, from the preflight on, and who reports a hang or a stop: the parent,
    else this rank (StopsAlone when it runs as one process)."""
    opts, started = me.opts, me.started
    watch = ProgressWatch(me.run_dir, me.rank, opts.hang_timeout,
                          on_hang=None if me.under_parent else lambda w: end_hung_rank(w, started, opts)).start()
    if not me.under_parent:  # no parent to say it: this rank's watchdog says the stall (one line per node)
        watch.progress = HangLines(watch.hang_bound) if enabled(opts.progress) else None
    if me.outside:  # a stopped job (torchrun forwards SIGTERM) still reports
        watch.watch_stop_signals(lambda w, sig: end_stopped_rank(w, sig, started, opts))
    alone = StopsAlone(watch, started, opts) if me.own_dir else None  # one process: stops reported too
    if me.own_dir:  # the ranks its script starts (mp.spawn, Ray Train) are watched through their beats
        from ddp_doctor.training.run.hung_children import end_hung_children
        watch.on_children_hang = lambda w, found: end_hung_children(w, found, started, opts)
    release_early()  # held since the command began (cli): a stop that came meanwhile reaches the handlers now
    return watch, alone


def _preflight_first(me: _Rank, watch: ProgressWatch) -> None:
    """This rank's preflight, its findings and figures kept for the final report; one that did not
    pass ends the process: the script never runs."""
    if me.outside:  # a chdir in the script must not move the report
        me.opts.report_path = os.path.abspath(Output(report_path=me.opts.report_path).path())
    pf_report, code = preflight(me.opts, me.run_dir, me.records_note)
    if code == 0 and (pf_report.get("findings") or pf_report.get("measurements")):
        # the final report keeps the preflight's findings and figures (its clock offsets: DDP878)
        records.write_json(records.preflight_record_path(me.run_dir, me.rank), pf_report)
    if code != 0:
        # The script never ran: end without interpreter teardown (torch 2.13's gloo may abort
        # there after a correct teardown, docs/facts.md, "The gloo teardown abort"), keeping exit status 3 exact.
        watch.stop()
        if me.own_dir:
            shutil.rmtree(me.run_dir, ignore_errors=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run_script(me: _Rank, watch: ProgressWatch) -> tuple[Outcome, Any, Any]:
    """The user's script, watched; returns how it ended, its probe (None when not installed) and
    the watch on the processes it started."""
    watch.training_starts()
    # mpirun / MPICH / srun set only their own variables: export torch's (RANK, WORLD_SIZE,
    # LOCAL_RANK, and MASTER_ADDR/PORT on one node) so the script's init_process_group() works (DDP110)
    os.environ.update(script_env_exports(me.info, os.environ))
    probe = _install_probes(me.run_dir)
    remember_launcher(me.info.rank, me.info.world_size)
    init_watch = None
    if me.own_dir or me.outside:  # no launcher: the processes the script starts are judged at init (they may
        # wait there); an outside launcher: this rank's own claim, when another process holds its rank
        init_watch = InitWatch(me.run_dir, watch, me.started, lambda: write_outside_report(
            me.rank, me.run_dir, me.started, True, me.opts, stuck_in_init=True), own_dir=me.own_dir,
            claims_of=None if me.own_dir else os.getpid()).start()
    _record_fatal_signals(me.run_dir, me.rank)
    if me.outside:
        warm_stop_report()
    watch.script_started_ns = time.time_ns()
    children = watch_children()  # the mark its processes inherit: what outlives the script is ended
    watch.children = children  # a stop or a hang (the watchdog thread) ends them too
    outcome = run_target(me.opts.target)
    if init_watch is not None:
        init_watch.stop()
    return outcome, probe, children


def _record_ending(me: _Rank, watch: ProgressWatch, outcome: Outcome, probe: Any,
                   children: Any) -> tuple[dict[str, Any], Any]:
    """The script's ending in the records (outcome, probe, ledger) and, on several nodes, in the
    job's store; returns the ending and what the store says of every rank's (None on one node)."""
    watch.phase = "teardown"  # from here the watchdog leaves the ledger to this thread
    ending = {"exit_code": outcome.exit_code, "exception": outcome.exception,
              "exited": outcome.exited,  # sys.exit(N != 0): where
              "host": os.uname().nodename, "phase": "training", "local_rank": os.environ.get("LOCAL_RANK")}
    if outcome.exit_code or outcome.exception is not None:
        # on file first: after a peer's failure the launcher's SIGTERM may end this process at any
        # moment, and a rank that failed on its own is judged by its error, not by that signal
        records.write_outcome(me.run_dir, me.rank, ending)
    position = _ledger_position(outcome)
    if probe is not None:
        probe.end(how="script", exit_code=outcome.exit_code, raised=outcome.exception is not None)
    ending["leftovers"] = children.end()  # checks/leftover_rules.py
    records.write_outcome(me.run_dir, me.rank, ending)
    if me.under_parent and probe is not None:  # what keeps the process alive past the teardown bound (DDP806)
        watch_exit(records.outcome_path(me.run_dir, me.rank))
    job = None  # several nodes: what the job's store says of every rank's ending
    if not me.own_dir:  # after the records the report needs: a peer's failure may end this rank soon
        _leave_ledger(watch, me.run_dir, me.rank, position, outcome)
        # several nodes: other nodes' reports see this ending; a failure sees theirs
        if multi_node(me.info.world_size, me.info.local_world_size):
            failed = position == "failed"  # and the ranks of this node it saw vanish, for the other nodes
            gone = (ledger.vanished_ranks(me.run_dir, but=me.rank, since=me.started - records.SAME_JOB,
                                          settle=ledger.VANISH_SETTLE) if failed else {})
            job = exchange(me.run_dir, me.rank, failed=failed, gone=gone)
    return ending, job


def _fail_on(me: _Rank, code: int, written: dict[str, Any], ending: dict[str, Any]) -> int:
    """--fail-on, for the rank that wrote the job's report: 3 on a verdict that severe."""
    failing = apply_fail_on(code, written, me.opts.fail_on)
    if failing != code and me.opts.fail_on is not None and not me.own_dir:  # the launcher stops the other
        # ranks on this exit: they let the verdict stand (stopped_rank.stopped_for_fail_on)
        records.write_outcome(me.run_dir, me.rank, {**ending, "fail_on": me.opts.fail_on.level})
    return failing


PEER_LEDGER_WAIT = 5.0  # seconds a failing rank waits for its live peers' ledgers (watchdogs poll each second)


def _leave_ledger(watch: Any, run_dir: str, rank: int, position: str, outcome: Any) -> None:
    """This rank's ledger; a rank that failed also asks the live ranks of its node for theirs and
    waits a bounded moment: once it exits, the launcher stops them, and where they were then
    (elsewhere, or waiting in a collective) is what tells cause from consequence."""
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


def _ledger_position(outcome: Any) -> str:
    if outcome.exception is not None or outcome.exit_code:  # raised, or sys.exit(N != 0): a failure
        return "failed"
    return "finished" if ledger.default_group_is_up() else "destroyed"


_fatal_signal_file: Any = None  # open for the life of the process: faulthandler writes to it


def _record_fatal_signals(run_dir: str, rank: int) -> None:
    """faulthandler writes the Python stack of every thread to crash-RANK.txt when a fatal signal
    (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) hits the rank, then the signal ends it as before: a
    crash in native code leaves no Python traceback otherwise."""
    global _fatal_signal_file
    try:
        _fatal_signal_file = records.open_private(records.crash_path(run_dir, rank))  # 0600
        faulthandler.enable(file=_fatal_signal_file, all_threads=True)
    except (OSError, ValueError, RuntimeError):
        pass
    try:  # the call a crash inside a collective was in, with its tensors (checks/crash_ledgers.py)
        keep_calls_in(records.call_note_path(run_dir, rank))
    except (OSError, ValueError):
        pass


def _install_probes(run_dir: str) -> Any:
    """The in-training probes, here and in the Python processes the script starts; if they cannot
    be installed (a torch whose internals moved), the script runs without them and says so."""
    try:
        probe = install(run_dir)
    except Exception as e:  # noqa: BLE001 - a torch whose internals moved: the script runs unwatched, and says so
        sys.stderr.write(f"ddp-doctor: in-training probes not installed ({e!r}); training runs unwatched by them\n")
        return None
    child_env(os.environ, run_dir)  # type: ignore[arg-type]
    hook_env(os.environ)  # type: ignore[arg-type] # and the workers of a Ray cluster the script joins
    return probe


def _die_with_launcher() -> None:
    """Under ddp-doctor's own launcher (agent.py names itself in AGENT_PID_ENV), this rank dies with
    it: a launcher killed outright (SIGKILL: nothing passes a stop on then) leaves no rank training,
    reparented to init. The launcher may be gone already when this runs: then the rank ends at once.
    The variable is removed, so the processes the script starts are not tied to the launcher."""
    agent = os.environ.pop(AGENT_PID_ENV, "")
    if not agent.isdigit() or not die_with_parent(signal.SIGKILL):
        return
    if os.getppid() != int(agent):
        os.kill(os.getpid(), signal.SIGKILL)
