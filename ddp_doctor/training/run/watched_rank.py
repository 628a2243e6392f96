"""One rank of `ddp-doctor run`: preflight, clean teardown, then the user's script in this same
process, watched; what happened is left in the run directory for the report.

Under a ddp-doctor parent the parent merges the records and writes the report. Under an outside
launcher (torchrun, mpirun, SageMaker) each failing rank writes torchelastic's error file and the
SageMaker failure file itself, and rank 0 writes the report from the records it can see.
"""
from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from ddp_doctor.exit_codes import EXIT_HANG, EXIT_INTERNAL, FailOn
from ddp_doctor.report import build as reportlib
from ddp_doctor.report.publish import Output
from ddp_doctor.training import records
from ddp_doctor.training.run.target import Target, run_target

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


def run_dir_for(env: Any) -> str:
    """Where this rank's records go: the parent's directory, DDP_DOCTOR_RUN_DIR, or a directory
    per job in the temp dir, shared by the ranks of one job on this node and by no other job
    (training/run/run_dir.py, job_id, gives the rule: under torchrun its agent, never the run id
    alone, which is "none" for every job started without one)."""
    if env.get(RUN_DIR_ENV):
        return env[RUN_DIR_ENV]
    from ddp_doctor.training.run.run_dir import job_id
    return os.path.join(tempfile.gettempdir(), f"ddp-doctor-run-{job_id(env)}")


def preflight(opts: RunOptions, run_dir: str, records_note: str | None = None) -> tuple[dict[str, Any], int]:
    """The preflight of this rank; `records_note`: why the records are not where asked (DDP813)."""
    from ddp_doctor.context import current_context
    from ddp_doctor.preflight_ranks.one_rank import PreflightOptions, RankPreflight
    under_parent = bool(os.environ.get(PARENT_ENV))
    out = Output(report_path=opts.report_path, only_if_not_pass=True, stderr=True, running_if_pass=True)
    pf_opts = PreflightOptions(timeout=opts.timeout, select=opts.select, skip=opts.skip, backend=opts.backend,
                      output=out, check_options=opts.check_options,
                      launch_dir=records.preflight_dir(run_dir) if under_parent else None,
                      entry_script=opts.target.path)
    if pf_opts.launch_dir:
        try:
            records.make_private_dir(pf_opts.launch_dir)
        except OSError:
            pass  # the rank's preflight report then goes unwritten; its exit status still tells
    pf = RankPreflight(current_context(backend=opts.backend, entry_script=opts.target.path,
                                       options=opts.check_options), pf_opts)
    if records_note:  # a warning in the report, never the verdict
        from ddp_doctor.checks.internal import event_finding
        from ddp_doctor.checks.training_failures import RECORDS_DEGRADED
        pf.findings.append(event_finding(RECORDS_DEGRADED, records_note, rank=pf.rank,
                                         evidence={"run_dir": run_dir}))
    rep = pf.run()
    failed = pf.failed
    records.join_job(pf.job_token)  # the job every rank agreed on: this rank's records name it
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
    under_parent = bool(os.environ.get(PARENT_ENV))
    _die_with_launcher()  # ddp-doctor's own launcher killed (SIGKILL): this rank does not train on
    # 0700 (an earlier version's 0755 directory is tightened), with room for the records: a full or
    # read-only place moves them elsewhere with a warning (DDP813), never changing the verdict.
    if under_parent:  # the parent chose the place and said why it moved
        run_dir, records_note = run_dir_for(os.environ), os.environ.get(RECORDS_NOTE_ENV)
        try:
            records.make_private_dir(run_dir)
        except OSError:
            pass
    else:
        from ddp_doctor.report.private_files import make_records_dir
        run_dir, records_note = make_records_dir(None if own_dir else run_dir_for(os.environ))
        if records_note and os.environ.get("LOCAL_RANK", "0") == "0":  # one line per node
            from ddp_doctor.report.publish import warn
            warn(records_note)
    if not own_dir:  # before the first process group (the preflight's): under an outside launcher
        from ddp_doctor.training.run.ledger import recorder_env  # no parent set the recorder's env
        recorder_env(os.environ, run_dir)

    from ddp_doctor.training.run.watchdog import ProgressWatch
    watch = ProgressWatch(run_dir, rank, opts.hang_timeout,
                         on_hang=None if under_parent else lambda w: _end_hung_rank(w, started, opts)).start()
    if not under_parent:  # no parent to say it: this rank's watchdog says the stall (one line per node)
        from ddp_doctor.processes.progress import enabled
        from ddp_doctor.training.run.hang_lines import HangLines
        watch.progress = HangLines(watch.hang_bound) if enabled(opts.progress) else None
    if not under_parent and not own_dir:  # a stopped job (torchrun forwards SIGTERM) still reports
        watch.watch_stop_signals(lambda w, sig: _end_stopped_rank(w, sig, started, opts))
    alone = _StopsAlone(watch, started, opts) if own_dir else None  # one process: stops reported too
    from ddp_doctor.processes.stop_signals import release_early
    release_early()  # held since the command began (cli): a stop that came meanwhile reaches the handlers now
    outside = not under_parent and not own_dir  # torchrun, SageMaker's toolkit, mpirun, SLURM
    if outside:  # a chdir in the script must not move the report
        opts.report_path = os.path.abspath(Output(report_path=opts.report_path).path())
    pf_report, code = preflight(opts, run_dir, records_note)
    if code == 0 and (pf_report.get("findings") or pf_report.get("measurements")):
        # the final report keeps the preflight's findings and figures (its clock offsets: DDP878)
        records.write_json(records.preflight_record_path(run_dir, rank), pf_report)
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
    from ddp_doctor.training.probes.init_calls import remember_launcher
    remember_launcher(info.rank, info.world_size)
    init_watch = None
    if own_dir or outside:  # no launcher: the processes the script starts are judged at init (they may
        # wait there); an outside launcher: this rank's own claim, when another process holds its rank
        from ddp_doctor.training.run.init_verdict import InitWatch
        init_watch = InitWatch(run_dir, watch, started, lambda: _finish_outside(
            rank, run_dir, started, True, opts, stuck_in_init=True), own_dir=own_dir,
            claims_of=None if own_dir else os.getpid()).start()
    _record_fatal_signals(run_dir, rank)
    if outside:
        _warm_stop_report()
    watch.script_started_ns = time.time_ns()
    from ddp_doctor.training.run.leftovers import watch_children
    children = watch_children()  # the mark its processes inherit: what outlives the script is ended
    watch.children = children  # a stop or a hang (the watchdog thread) ends them too
    outcome = run_target(opts.target)
    if init_watch is not None:
        init_watch.stop()
    # A stop signal that ended the script (a peer stopped first: "Connection closed") is reported
    # as the stop; the script's own ending is its consequence. Whichever thread reads it reports it.
    signo = None if watch.stopping else watch.stop_signal()
    if alone is not None:
        alone.after_script(signo, outcome)  # a stop that ended the script: reported, then the process ends
    elif signo is not None:
        _end_stopped_rank(watch, signo, started, opts)
    if watch.stopping:  # the watchdog thread is reporting it and ends the process
        _wait_for_stop()
    if alone is not None:
        alone.claim()  # the script ended on its own: a stop from now on is noted, never a second report
    watch.phase = "teardown"  # from here the watchdog leaves the ledger to this thread
    position = _ledger_position(outcome)
    if probe is not None:
        probe.end(how="script", exit_code=outcome.exit_code, raised=outcome.exception is not None)
    ending = {"exit_code": outcome.exit_code, "exception": outcome.exception,
              "exited": outcome.exited,  # sys.exit(N != 0): where
              "host": os.uname().nodename, "phase": "training",
              "local_rank": os.environ.get("LOCAL_RANK"), "leftovers": children.end()}  # checks/leftovers.py
    records.write_outcome(run_dir, rank, ending)
    if under_parent and probe is not None:  # what keeps the process alive past the teardown bound (DDP806)
        from ddp_doctor.training.probes.exit_holders import watch_exit
        watch_exit(records.outcome_path(run_dir, rank))
    job = None  # several nodes: what the job's store says of every rank's ending
    if not own_dir:  # after the records the report needs: a peer's failure may end this rank soon
        _leave_ledger(watch, run_dir, rank, position, outcome)
        if _other_nodes(info):  # other nodes' reports see this ending; a failure sees theirs
            from ddp_doctor.training.run.endings import exchange
            from ddp_doctor.training.run.ledger import VANISH_SETTLE, vanished_ranks
            failed = position == "failed"  # and the ranks of this node it saw vanish, for the other nodes
            gone = (vanished_ranks(run_dir, but=rank, since=started - records.SAME_JOB, settle=VANISH_SETTLE)
                    if failed else {})
            job = exchange(run_dir, rank, failed=failed, gone=gone)
    written = None  # the job's report, when this rank wrote it
    if not under_parent:
        written = _finish_outside(rank, run_dir, started, outcome.exit_code != 0 or outcome.exception is not None,
                                  opts, job=job)
    watch.stop()
    if own_dir:
        shutil.rmtree(run_dir, ignore_errors=True)
    code = alone.exit_code(outcome.exit_code) if alone is not None else outcome.exit_code
    if written is not None:  # --fail-on: the rank that wrote the job's report exits 3 on its verdict
        from ddp_doctor.report.publish import apply_fail_on
        failing = apply_fail_on(code, written, opts.fail_on)
        if failing != code and opts.fail_on is not None and not own_dir:  # the launcher stops the other
            # ranks on this exit: they let the verdict stand (_stopped_for_fail_on)
            records.write_outcome(run_dir, rank, {**ending, "fail_on": opts.fail_on.level})
        code = failing
    return code


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
    if outcome.exception is not None or outcome.exit_code:  # raised, or sys.exit(N != 0): a failure
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
    try:  # the call a crash inside a collective was in, with its tensors (checks/crash_ledgers.py)
        from ddp_doctor.training.probes.collective_sites import keep_calls_in
        keep_calls_in(records.call_note_path(run_dir, rank))
    except (OSError, ValueError):
        pass


def _install_probes(run_dir: str) -> Any:
    """The in-training probes, here and in the Python processes the script starts; if they cannot
    be installed (a torch whose internals moved), the script runs without them and says so."""
    from ddp_doctor.training.probes.children import child_env
    from ddp_doctor.training.probes.install import install
    try:
        probe = install(run_dir)
    except Exception as e:  # noqa: BLE001 - a torch whose internals moved: the script runs unwatched, and says so
        sys.stderr.write(f"ddp-doctor: in-training probes not installed ({e!r}); training runs unwatched by them\n")
        return None
    child_env(os.environ, run_dir)  # type: ignore[arg-type]
    return probe


def _wait_for_stop(bound: float = 30.0) -> None:
    """The main thread, while the watchdog thread reports the stop and ends the process (os._exit);
    past the bound the main thread goes on to its own ending."""
    time.sleep(bound)


def _die_with_launcher() -> None:
    """Under ddp-doctor's own launcher (agent.py names itself in AGENT_PID_ENV), this rank dies with
    it: a launcher killed outright (SIGKILL: nothing passes a stop on then) leaves no rank training,
    reparented to init. The launcher may be gone already when this runs: then the rank ends at once.
    The variable is removed, so the processes the script starts are not tied to the launcher."""
    import signal

    from ddp_doctor.processes.tree import die_with_parent
    from ddp_doctor.training.run.agent import AGENT_PID_ENV
    agent = os.environ.pop(AGENT_PID_ENV, "")
    if not agent.isdigit() or not die_with_parent(signal.SIGKILL):
        return
    if os.getppid() != int(agent):
        os.kill(os.getpid(), signal.SIGKILL)


class _StopsAlone:
    """One process, no launcher (`ddp-doctor run script.py`): SIGTERM, SIGHUP or SIGINT end in an
    "interrupted" report with where it was (its stack), once, then the exit status 128 + the signal.
    The watchdog thread takes SIGTERM and SIGHUP (also while the main thread is blocked). SIGINT is
    the script's KeyboardInterrupt while the script runs, as under `python SCRIPT` (its own except
    and finally blocks run), and the report follows it; outside the script (the preflight, the end)
    it is reported at once. The processes the script started (spawned ranks) are ended with it. A
    stop that comes after the script ended on its own is noted on stderr, and the exit status is then
    128 + its number; the report is the run's own. A script's own handler stays in charge."""

    def __init__(self, watch: Any, started: float, opts: RunOptions) -> None:
        import signal
        self.watch, self.started, self.opts = watch, started, opts
        self.sigint_at: float | None = None  # a SIGINT raised KeyboardInterrupt in the script
        self.sigint_where: dict[str, Any] | None = None  # where the script was then (watchdog.describe)
        self.late: list[int] = []
        watch.watch_stop_signals(lambda w, signo: self.end(signo))
        try:
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not ignored (nohup, `&`)
                signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread
            pass

    def _on_sigint(self, signum: int, frame: Any) -> None:
        """Python-level, on the main thread: inside the script, its KeyboardInterrupt; elsewhere
        (ddp-doctor's own code around it) the stop is reported from here."""
        if _in_script(frame):
            from ddp_doctor.training.run.watchdog import describe
            self.sigint_at = time.time()
            chain = []
            while frame is not None:
                chain.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
                frame = frame.f_back
            self.sigint_where = describe(chain[::-1])
            raise KeyboardInterrupt
        self.end(signum, on_main=True)

    def after_script(self, signo: int | None, outcome: Any) -> None:
        """Main thread: a stop signal read as the script ended, or the KeyboardInterrupt of a SIGINT
        that ended it, is reported now (the process then ends)."""
        import signal
        stopped_by_sigint = (self.sigint_at is not None
                             and (outcome.exception or {}).get("type") == "KeyboardInterrupt")
        if signo is None and stopped_by_sigint:
            signo = int(signal.SIGINT)
        if signo is not None:
            self.end(signo, traceback=(outcome.exception or {}).get("traceback") if stopped_by_sigint else None,
                     on_main=True)

    def claim(self) -> None:
        """Main thread, the script ended on its own: its ending is the report. A stop the watchdog
        thread is reporting already ends the process."""
        if not self.watch.claim_stop():
            _wait_for_stop()

    def end(self, signo: int, traceback: str | None = None, on_main: bool = False) -> None:
        """Report the stop and end the process (os._exit), once; a stop while another ending is
        being reported is noted. `traceback`: the script's KeyboardInterrupt (where it was);
        `on_main`: called by the main thread once the script ended (its last sample says where)."""
        import threading

        from ddp_doctor.processes.stop_signals import Interrupt
        from ddp_doctor.processes.tree import end_descendants
        from ddp_doctor.training.run.watchdog import describe, stack_of
        w = self.watch
        if not w.claim_stop():
            self.late.append(signo)
            return
        stop = Interrupt(signo)
        try:
            _say(f"ddp-doctor: stopped by {stop.name}; where it was follows\n")
            if not on_main:  # the watchdog thread: where the main thread is now
                w._beat(time.time(), describe(stack_of(threading.main_thread().ident or 0)))
            elif traceback is not None and self.sigint_where:  # where the KeyboardInterrupt hit the script
                w.stop()  # no later sample (this thread, in ddp-doctor's code now) replaces it
                w._beat(time.time(), self.sigint_where)
            if traceback is None:
                w.dump_stacks(sys.stderr)
            if w._stack_file is not None:
                if traceback is None:
                    w.dump_stacks(w._stack_file)
                else:
                    w._stack_file.write(traceback)
                    w._stack_file.flush()
            ended = end_descendants()
            if ended:
                _say(f"ddp-doctor: ended {ended} process(es) the script had started\n")
            records.write_outcome(w.run_dir, w.rank, {
                "exit_code": stop.exit_code, "exception": None, "interrupted": stop.to_dict(),
                "host": os.uname().nodename, "phase": w.phase})
            _finish_outside(w.rank, w.run_dir, self.started, True, self.opts, interrupted=stop)
            self.late += [s for s in [w.stop_signal()] if s is not None]
            self._note_late("while the stop was reported; the report is the first stop's")
        except Exception as e:  # noqa: BLE001 - the process still ends as the signal asks
            _say(f"ddp-doctor: the stop could not be reported whole ({type(e).__name__}: {e})\n")
        finally:
            shutil.rmtree(w.run_dir, ignore_errors=True)
            _flush()
            os._exit(stop.exit_code)

    def _note_late(self, what: str) -> None:
        from ddp_doctor.processes.stop_signals import Interrupt
        for signo in self.late:
            _say(f"ddp-doctor: {Interrupt(signo).name} arrived {what}\n")

    def exit_code(self, code: int) -> int:
        """The script's exit status, or 128 + the first stop signal that came after its end."""
        self.late += [s for s in [self.watch.stop_signal()] if s is not None]
        if not self.late:
            return code
        self._note_late("after the script ended; the report above is the run's own")
        return 128 + self.late[0]


def _in_script(frame: Any) -> bool:
    """Whether `frame` runs inside the user's script: run_target (target.py) has called runpy's
    _run_code (the script's module code) and that call is still on the stack."""
    import runpy

    from ddp_doctor.training.run import target as target_module
    ran = False
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_run_code" and code.co_filename in (runpy.__file__, "<frozen runpy>"):
            ran = True
        elif code.co_name == "run_target" and code.co_filename == target_module.__file__:
            return ran
        frame = frame.f_back
    return False


def _say(text: str) -> None:
    try:
        sys.stderr.write(text)
    except (OSError, ValueError):  # a closed stderr takes nothing
        pass


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


STOPPED_PEERS_WAIT = 5.0  # seconds a stopped rank waits for its node's ledgers (rank 0) or rank 0's


def _end_stopped_rank(watch: Any, signo: int, started: float, opts: RunOptions) -> None:
    """Outside launcher, SIGTERM/SIGHUP (a stopped SageMaker job, a cancelled torchrun job): this
    rank's stacks, ledger and outcome, the report (rank 0's, or this rank's own file), then exit
    128 + the signal as the default action would. Runs on the watchdog thread."""
    from ddp_doctor.processes.stop_signals import Interrupt
    if _stopped_for_fail_on(watch):
        return  # the main thread ends as it would have; the job's verdict stands
    if not watch.claim_stop():
        return  # the other thread reports this stop and ends the process
    stop = Interrupt(signo)
    own = records.read_outcomes(watch.run_dir, watch.job_since).get(watch.rank)
    if own is not None and (own.get("exception") or own.get("exit_code")) and not own.get("interrupted"):
        # this rank had failed already; the launcher stops it because of that (or of a peer's
        # failure): the job's verdict is the failure, and the rank exits with its own status. The
        # main thread may not have put its ending (and its node's vanished peers) in the job's
        # store yet: this exit would cut that short, so this thread puts them first
        try:
            _share_stopped_ending(watch, started, failed=True)
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
        if watch.rank == 0 and not _a_peer_failed(watch.run_dir, watch.rank, started):
            # at once: the launcher's grace (torchrun: SIGKILL 30 s after its SIGTERM) may end before
            # the full report is made. Not over a peer's verdict (its hang, its failure).
            _early_stop_report(watch, stop, started, opts)
        if watch.phase == "training":
            from ddp_doctor.training.run import ledger
            local = list(records.read_heartbeats(watch.run_dir, watch.job_since))
            # Rank 0 reports from its node's ledgers: it waits for them; the others stay until
            # rank 0's is written (their exit would make its pending collective fail first).
            wanted = [r for r in local if r != watch.rank] if watch.rank == 0 else [r for r in local if r == 0]
            if wanted:
                ledger.wait_for(watch.run_dir, wanted, started, STOPPED_PEERS_WAIT)
        peer = _a_peer_failed(watch.run_dir, watch.rank, started)
        if peer == "hung":
            pass  # a peer ended the job at its hang bound and wrote the hang verdict before it exited
        elif peer:
            # the launcher stops the ranks because another one failed: the job's verdict is that
            # failure (this rank's stop its consequence), never "interrupted" over a peer's "fail"
            _share_stopped_ending(watch, started, failed=False)
            _finish_outside(watch.rank, watch.run_dir, started, True, opts)
        else:
            _finish_outside(watch.rank, watch.run_dir, started, True, opts, interrupted=stop)
    except BaseException as e:  # noqa: BLE001 - the rank still exits 128 + N; say why its report is missing
        import traceback
        _say(f"ddp-doctor: rank {watch.rank}: the stop could not be reported whole ({type(e).__name__}: {e})\n"
             + "".join(traceback.format_exception(e)))
    finally:
        _end_children(watch)
        sys.stderr.flush()
        os._exit(stop.exit_code)


def _warm_stop_report() -> None:
    """Outside launcher, before the script runs: import what a stopped rank's report needs, so a
    stop never imports on the watchdog thread while the script's main thread imports (torch's
    module locks can then hand one thread a half-made module), and a loaded host spends the
    launcher's grace on the report, not on imports."""
    try:
        import ddp_doctor.checks.job  # noqa: F401
        import ddp_doctor.checks.stalls  # noqa: F401
        import ddp_doctor.context  # noqa: F401
        import ddp_doctor.report.publish  # noqa: F401
        import ddp_doctor.report.sinks  # noqa: F401
        import ddp_doctor.training.job_report  # noqa: F401
        import ddp_doctor.training.run.endings  # noqa: F401
        import ddp_doctor.training.run.run_dir  # noqa: F401
    except Exception:  # noqa: BLE001 - a stop then imports what it needs, as before
        pass


def _early_stop_report(watch: Any, stop: Any, started: float, opts: RunOptions) -> None:
    """Rank 0 of a stopped job, before it waits for its peers' ledgers: the job's report as
    "interrupted" with where each rank of its node was (their heartbeats: DDP808) and the
    preflight's findings. The full report (the ledgers' cause) replaces it when there is time; a
    launcher that kills the rank first leaves this one, never the preflight's "running"."""
    try:
        from ddp_doctor.checks.stalls import interrupted_finding
        from ddp_doctor.report import sinks
        since = started - records.SAME_JOB
        beats = records.read_heartbeats(watch.run_dir, since)
        beats[watch.rank] = {**beats.get(watch.rank, {}), "where": watch.where, "in_collective": watch.in_collective}
        earlier, pf = _preflight_findings(watch.run_dir, since)
        rep = reportlib.build_report(world=(pf or {}).get("world") or {"launcher": "torchrun"},
                                     ranks=(pf or {}).get("ranks") or [],
                                     findings=[*earlier, interrupted_finding(stop, beats, {})],
                                     measurements=(pf or {}).get("measurements") or {}, phase="training")
        if pf is not None and pf.get("status"):
            rep["preflight_status"] = pf["status"]
        sinks.write_report_file(reportlib.mark_interrupted(rep, stop.to_dict()),
                                Output(report_path=opts.report_path).path())
    except Exception as e:  # noqa: BLE001 - the full report is still attempted
        _say(f"ddp-doctor: rank {watch.rank}: the early report of the stop failed ({type(e).__name__}: {e})\n")


def _share_stopped_ending(watch: Any, started: float, failed: bool) -> None:
    """Several nodes: a rank its launcher stopped because a peer of its node failed or vanished
    (`failed`: or after its own script failed, before the main thread had shared that) puts its
    ending, and the peers of its node it saw gone (SIGKILL, the OOM killer), in the job's store,
    as a rank that ended does: the other nodes' reports then name the vanished rank (whether the
    stop or its own collective's error came first is a race). A failed rank also copies the other
    nodes' endings here for its report, as the main thread would. Bounded, never raises."""
    from ddp_doctor.training.run.endings import exchange, multi_node
    from ddp_doctor.training.run.ledger import vanished_ranks
    try:
        if multi_node():
            gone = vanished_ranks(watch.run_dir, but=watch.rank, since=started - records.SAME_JOB)
            exchange(watch.run_dir, watch.rank, failed=failed, gone=gone)
    except Exception:  # noqa: BLE001 - the rank's own report is written next whatever this did
        pass


def _stopped_for_fail_on(watch: Any) -> bool:
    """Whether this rank's script had ended well and a peer of its node exited 3 by --fail-on after
    writing the job's verdict (its ending says "fail_on"): the launcher's stop is its answer to that
    exit, never a stop of the job, so the report is not rewritten as "interrupted"."""
    ended = records.read_outcomes(watch.run_dir, watch.job_since)
    own = ended.get(watch.rank)
    if own is None or own.get("exception") or own.get("exit_code") or own.get("interrupted") or own.get("hung"):
        return False
    return any(o.get("fail_on") for r, o in ended.items() if r != watch.rank)


def _end_children(watch: Any) -> None:
    """Before a stopped or hung rank's os._exit: the processes its script started (DataLoader
    workers, servers, daemons: training/run/leftovers.py finds them) end with it, never train on.
    Not leftovers of a script that ended on its own, so said on stderr, not in the report."""
    children = getattr(watch, "children", None)
    if children is None:
        return
    try:
        ended = (children.end(interpreter_exits=False) or {}).get("processes") or []
        if ended:
            _say(f"ddp-doctor: rank {watch.rank} ended {len(ended)} process(es) its script had started\n")
    except Exception:  # noqa: BLE001 - the rank still ends as the signal or the hang asks
        pass


def _a_peer_failed(run_dir: str, rank: int, started: float) -> str | None:
    """How another rank of the job ended before this one was stopped: "hung" (it reached the hang
    bound), "failed" (it raised or exited non-zero on its own, or its process is gone without an
    ending, on this node or seen on another), or None."""
    from ddp_doctor.training.run.endings import remote_gone
    from ddp_doctor.training.run.ledger import vanished_ranks
    since = started - records.SAME_JOB
    peers = {r: o for r, o in records.read_outcomes(run_dir, since).items() if r != rank and not o.get("interrupted")}
    if any(o.get("hung") for o in peers.values()):
        return "hung"
    if any(o.get("exception") or o.get("exit_code") for o in peers.values()):
        return "failed"
    return "failed" if vanished_ranks(run_dir, but=rank, since=since) or remote_gone(run_dir) else None


def _finish_outside(rank: int, run_dir: str, started: float, failed: bool, opts: RunOptions,
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
    from ddp_doctor.checks.job import JobEvidence
    from ddp_doctor.context import current_context
    from ddp_doctor.report import sinks
    from ddp_doctor.report.publish import platform_sinks, publish, show
    from ddp_doctor.training.job_report import job_report
    from ddp_doctor.training.run.run_dir import read_run
    since = started - records.SAME_JOB
    if rank == 0 and not failed and interrupted is None:
        _wait_for_local_ranks(run_dir, started)
    from ddp_doctor.training.run.endings import multi_node
    ended_well = not failed and interrupted is None and not stuck_in_init
    if ended_well and multi_node() and not _job_ended(rank, run_dir, job):
        return None  # a rank still runs on another node: the last rank of the job writes the verdict
    run = read_run(run_dir, since=since)
    from ddp_doctor.training.run.endings import remote_gone
    from ddp_doctor.training.run.ledger import vanished_ranks
    gone = {**remote_gone(run_dir), **vanished_ranks(run_dir, but=rank, since=since)} if interrupted is None else {}
    local = set(records.read_heartbeats(run_dir, since)) | {rank}
    if ended_well and not multi_node() and not local <= set(run.outcomes) | set(gone):
        return None  # ranks of this node still run: the last one to end writes the verdict
    beats: dict[int, dict[str, Any]] = {}
    if interrupted is not None:  # where it was; rank 0's report, where each rank of its node was
        beats = {r: hb for r, hb in records.read_heartbeats(run_dir, since).items() if r == rank or rank == 0}
    if hung is not None:  # where every rank was at the hang (other nodes' copied here at it)
        from ddp_doctor.training.run.endings import remote_hung
        beats, gone = {**remote_hung(run_dir), **hung}, {}
    # what this job's processes passed to init_process_group (spawned children's included)
    calls = [c for c in run.init_calls if float(c.get("time") or 0) >= since]
    ev = JobEvidence(ranks=sorted(set(run.outcomes) | set(gone) | set(beats)), outcomes=run.outcomes,
                     ledgers=run.ledgers, probes=run.probes, interrupted=interrupted, stopped_at=beats,
                     stacks=run.stacks(beats), init_calls=calls, stuck_in_init=stuck_in_init, vanished=gone,
                     heartbeats=run.heartbeats,
                     hung=hung is not None, hang_timeout=max((float(hb.get("bound") or 0) for hb in beats.values()),
                                                             default=0.0))
    ctx = current_context()
    earlier, pf = _preflight_findings(run_dir, since)
    from ddp_doctor.checks.arrivals import clock_offsets_of
    ev.clock_offsets = clock_offsets_of((pf or {}).get("measurements"))
    rep, _ = job_report(ev, world=reportlib.world_of(ctx), ranks=(pf or {}).get("ranks") or None, earlier=earlier,
                        measurements=(pf or {}).get("measurements") or None, history_env=ctx.env)
    out = Output(report_path=opts.report_path, only_if_not_pass=True, stderr=True)
    path = out.path()
    if interrupted is not None:  # every rank was stopped: each keeps its file, rank 0 shows its report
        own = path if rank == 0 else f"{path}.rank{rank}.json"
        sinks.write_report_file(rep, own)
        if rank == 0:
            show(rep, out, own)
        return None
    shown = not failed or rank in (rep.get("root_cause") or {}).get("ranks", []) or (ctx.world_size or 1) == 1
    publish(rep, Output(report_path=path, only_if_not_pass=True, stderr=True, quiet=not shown,
                        verdict_if_pass=True), path=path)
    if failed or rep.get("status") == "fail":  # a rank that ended well may report another node's failure
        platform_sinks(rep, ctx)
    return rep


def _job_ended(rank: int, run_dir: str, job: Any) -> bool:
    """Several nodes, this rank ended well: whether every rank of the job has ended (then their
    endings are copied here). Rank 0 waits a bounded moment for them and says so when it stops
    waiting; the report then stays "running" until the last rank writes it on its node."""
    from ddp_doctor.training.run.endings import JOB_END_WAIT_ENV, job_end_wait, wait_for_job
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


def _preflight_findings(run_dir: str, since: float) -> tuple[list[Any], dict[str, Any] | None]:
    """The findings of the preflight of this job, and its report, from the record its reporting
    rank left on this node (the others' hold the verdict only): the final report keeps them."""
    import glob
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


def _end_hung_rank(watch: Any, started: float | None = None, opts: RunOptions | None = None) -> None:
    """Outside launcher: a rank without progress dumps its stacks, asks the other ranks of its node
    for theirs and their ledgers (and, on several nodes, the other nodes' through the store), writes
    the hang verdict (DDP801, where each rank was) and ends itself (exit 124), so the launcher ends
    the job instead of waiting for torch's 30-minute timeout. Ranks that reach the bound together
    each write the same verdict. Runs on the watchdog thread: the main thread is blocked."""
    sys.stderr.write(f"ddp-doctor: rank {watch.rank} made no progress for {watch.hang_timeout:g} s; "
                     f"its stacks follow, then it exits {EXIT_HANG}\n")
    try:
        watch.dump_stacks(sys.stderr)
        if watch._stack_file is not None:
            watch.dump_stacks(watch._stack_file)
        records.write_outcome(watch.run_dir, watch.rank, {"exit_code": EXIT_HANG, "exception": None,
                                                          "hung": True, "phase": "training"})
        watch.write_ledger("hung")
        if opts is not None and started is not None and watch.claim_stop():
            _report_hang(watch, started, opts)
    except Exception as e:  # noqa: BLE001 - the rank must still end: the launcher then ends the job
        sys.stderr.write(f"ddp-doctor: the hang report of rank {watch.rank} failed: {type(e).__name__}: {e}\n")
    finally:
        _end_children(watch)
        sys.stderr.flush()
        os._exit(EXIT_HANG)


def _report_hang(watch: Any, started: float, opts: RunOptions) -> None:
    from ddp_doctor.training.run.endings import multi_node
    from ddp_doctor.training.run.watchdog import collect_stacks
    since = started - records.SAME_JOB
    peers = {r: hb for r, hb in records.read_heartbeats(watch.run_dir, since).items() if r != watch.rank}
    collect_stacks(watch.run_dir, peers, reason="hang", across=multi_node())
    beats = {r: {**hb, "bound": watch.hang_timeout} for r, hb in records.read_heartbeats(watch.run_dir, since).items()}
    _finish_outside(watch.rank, watch.run_dir, started, True, opts, hung=beats)
