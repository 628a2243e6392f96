"""The parent of local ranks (`ddp-doctor run --nproc-per-node N ...`, start.py): it starts the
ranks through torch's elastic launcher (agent.py), polls the run directory for what stall_watch.py
looks for, ends the launch on a hang, a bad init or a stop, and writes the report (parent_report.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from ddp_doctor.training.run.target import Target

if TYPE_CHECKING:
    from ddp_doctor.processes.stop_signals import SignalCatcher
    from ddp_doctor.training.run.stall_watch import LauncherExit


POLL_S = 0.5  # the run directory's poll (hangs, a bad init, progress lines)
EXIT_LOOK_S = 0.05  # the launcher's exit, looked at this often within a poll: a waitpid each


def launch(torchrun: list[str], doctor: list[str], target: Target, opts: Any) -> int:
    """Start the ranks through torch's elastic launcher (agent.py), watch them, and write the report.
    Stop signals stay blocked until the report is written and published: each stop is reported
    once, whatever its timing, and the exit status is then 128 + the first one's number. A stop
    sent to the launcher comes here (agent.py passes it on); a launcher killed outright takes its
    ranks with it (watched_rank.py), and this parent, their adopter, ends any it left (DDP810)."""
    from ddp_doctor.processes.stop_signals import SignalCatcher, note_later
    from ddp_doctor.processes.tree import adopting, launcher_preexec
    from ddp_doctor.training.run import stall_watch
    from ddp_doctor.training.run.agent import agent_command
    from ddp_doctor.training.run.parent_report import finish, sent_to_launcher

    keep_in = opts.run_dir  # --run-dir: the run directory is made inside it and kept
    run_dir, note = _make_run_dir(keep_in)
    env = _launcher_env(run_dir, note)
    slow: dict[str, Any] = {}  # the longest wait for a slow rank, not (yet) a hang
    lines = stall_watch.progress_lines(opts)  # --progress: a line as the ranks' stall nears the bound
    from ddp_doctor.preflight_ranks.stage_lines import StageLines
    stages = StageLines(time.time(), None, None, per_wait=float(opts.timeout))  # the preflight's, until training
    with SignalCatcher(hold=True) as stop:  # SIGTERM/SIGINT/SIGHUP: where the ranks were, then a report
        with adopting() as since:
            proc = subprocess.Popen(agent_command(torchrun, doctor, target), env=env, preexec_fn=launcher_preexec)
            launched = time.monotonic()
            exit_watch = stall_watch.LauncherExit(run_dir, stall_watch.launcher_exit_bound(torchrun))
            try:
                hang, stuck_in_init, overdue = _watch_launch(proc, run_dir, torchrun, opts, stop, launched,
                                                             exit_watch, slow, lines, stages)
                hang, ended_here = _end_launch(proc, run_dir, torchrun, since, stop, hang, overdue, exit_watch)
            except BaseException:  # Ctrl-C or a bug in the loop: the launcher is still ended, then it goes on up
                end_launcher(run_dir, proc, since)
                raise
        try:
            code = finish(run_dir, proc.returncode, hang, opts, torchrun, stuck_in_init=stuck_in_init,
                          slow=slow, signals=stop, launcher_pid=proc.pid, ended_here=ended_here)
        finally:
            _tidy_run_dir(run_dir, keep_in)
        note_later([sent_to_launcher(s, proc.pid) for s in stop.drain()],
                   "while the report was written; it was written first")
    first = stop.first()  # the exit status a stop signal asks for, whenever it came
    return first.exit_code if first is not None else code


def _make_run_dir(keep_in: str | None) -> tuple[str, str | None]:
    """(the run directory, a note when it had to move elsewhere): the place the ranks write their
    records, ledgers and stacks, made before the launch so every rank is told where it is."""
    from ddp_doctor.report.private_files import keep_dir, make_records_dir
    from ddp_doctor.report.publish import warn

    # 0700, with room for the records; a full or read-only place (TMPDIR, --run-dir) moves them, with
    # a warning here and in the report (DDP813), never the job's exit status
    run_dir, note = make_records_dir(parent=keep_in)
    keep_dir(run_dir)  # removed while the job runs: made again
    if note:
        warn(note)
    if keep_in:
        sys.stderr.write(f"ddp-doctor: run directory (records, ledgers, stacks): {run_dir}\n")
    return run_dir, note


def _launcher_env(run_dir: str, note: str | None) -> dict[str, str]:
    """The environment of the launcher and so of every rank: this process's, plus where the records
    go and the recorders' settings, so each rank finds the run directory and its parent."""
    from ddp_doctor.facts.own_env import quiet_missing_numpy
    from ddp_doctor.training import records
    from ddp_doctor.training.run.agent import RESULT_ENV
    from ddp_doctor.training.run.ledger import recorder_env
    from ddp_doctor.training.run.options import PARENT_ENV, RECORDS_NOTE_ENV, RUN_DIR_ENV

    env = dict(os.environ)
    quiet_missing_numpy(env)  # the launcher and every rank: no "Failed to initialize NumPy" x3
    env.update({RUN_DIR_ENV: run_dir, PARENT_ENV: "1", RESULT_ENV: records.agent_result_path(run_dir)})
    if note:
        env[RECORDS_NOTE_ENV] = note
    env.setdefault("OMP_NUM_THREADS", "1")
    recorder_env(env, run_dir)  # ledgers of collectives, NCCL's dumps on timeout; never the user's values
    return env


def _watch_launch(proc: subprocess.Popen[Any], run_dir: str, torchrun: list[str], opts: Any, stop: SignalCatcher,
                  launched: float, exit_watch: LauncherExit, slow: dict[str, Any], lines: Any,
                  stages: Any) -> tuple[dict[int, dict[str, Any]] | None, bool, bool]:
    """(the hung ranks' heartbeats or None, stuck in init, launcher overdue): what the poll of the run
    directory saw when it stopped, on the launcher's exit, a stop signal, a hang, a bad init, a node
    that never came, or a launcher that outlived its ranks."""
    from ddp_doctor.training.run import stall_watch

    hang = None
    stuck_in_init = False
    overdue = False  # the ranks ended, the launcher did not exit within its bound
    while _still_runs_after(proc, stop, POLL_S) and stop.caught is None:
        stall_watch.end_stuck_at_exit(run_dir, stall_watch.TEARDOWN_BOUND)
        hang = stall_watch.detect_hang(run_dir, opts.hang_timeout, slow)
        if lines is not None and hang is None:
            stall_watch.say_progress(lines, run_dir, stages)
        stuck_in_init = stall_watch.detect_bad_init(run_dir)
        if hang is not None or stuck_in_init:
            break
        if stall_watch.nodes_never_met(run_dir, torchrun, opts, launched):
            break  # the agent is ended below; finish reports the missing node
        if exit_watch.overdue():  # stopped (SIGSTOP) or stuck after its ranks ended
            overdue = proc.poll() is None
            break
    if proc.poll() is not None and hang is None and not stuck_in_init and stop.caught is None:
        stuck_in_init = stall_watch.ended_by_bad_init(run_dir)  # another node ended it first
    return hang, stuck_in_init, overdue


def _still_runs_after(proc: subprocess.Popen[Any], stop: SignalCatcher, seconds: float) -> bool:
    """Whether the launcher still runs after a wait of up to `seconds` for a stop signal; it is
    looked at every EXIT_LOOK_S meanwhile, so that its exit ends the wait at once (the report then
    comes without waiting out the poll)."""
    end = time.monotonic() + seconds
    while proc.poll() is None:
        left = end - time.monotonic()
        if left <= 0 or stop.wait(min(EXIT_LOOK_S, left)) is not None:
            return True
    return False


def _end_launch(proc: subprocess.Popen[Any], run_dir: str, torchrun: list[str], since: float, stop: SignalCatcher,
                hang: dict[int, dict[str, Any]] | None, overdue: bool,
                exit_watch: LauncherExit) -> tuple[dict[int, dict[str, Any]] | None, bool]:
    """(the ranks' heartbeats with their stacks, or the hang as it was; whether this parent ended the
    launcher): the launch ended the way the watch's outcome asks, stacks and ledgers taken first
    when a stop or a hang ends it, so the report can say where each rank was."""
    from ddp_doctor.training import records
    from ddp_doctor.training.run.agent import torchrun_value
    from ddp_doctor.training.run.parent_report import sent_to_launcher
    from ddp_doctor.training.run.watchdog import collect_stacks

    stop.caught = sent_to_launcher(stop.caught, proc.pid)
    ended_here = proc.poll() is None  # this parent ends the launcher (else it ended on its own)
    if stop.caught is not None and proc.poll() is None:
        sys.stderr.write(f"ddp-doctor: {stop.caught.describe()}: taking the ranks' stacks and ledgers, "
                         f"then stopping them\n")
        hang = collect_stacks(run_dir, records.read_heartbeats(run_dir), reason="interrupted")
        end_launcher(run_dir, proc, since)
    elif hang is not None:
        nnodes = torchrun_value(torchrun, "--nnodes") or "1"
        hang = collect_stacks(run_dir, hang, across=nnodes not in ("1", "1:1"))
        end_launcher(run_dir, proc, since)
    elif overdue:
        sys.stderr.write(f"ddp-doctor: the launcher (torch's elastic agent, pid {proc.pid}) had not "
                         f"exited {exit_watch.bound:g} s after its ranks ended; ending it\n")
        end_launcher(run_dir, proc, since, resume=True)
    else:
        end_launcher(run_dir, proc, since, grace=0.5)  # nothing may outlive the launcher
    return hang, ended_here


def _tidy_run_dir(run_dir: str, keep_in: str | None) -> None:
    """Keep the run directory (files tightened to 0600) when the user asked for it or NCCL's dumps
    are in it, the evidence the report points to; else remove it, so a run leaves nothing behind."""
    from ddp_doctor.report.private_files import tighten_tree
    from ddp_doctor.training.run.nccl_dumps import dump_files
    if keep_in:  # the user's --run-dir: everything stays
        tighten_tree(run_dir)  # NCCL's dumps and log, written with the umask: 0600 as ours are
    elif dump_files(run_dir):  # NCCL's dumps are the evidence the report points to: keep them
        tighten_tree(run_dir)
        sys.stderr.write(f"ddp-doctor: NCCL flight recorder dumps kept in {run_dir}\n")
    else:
        import shutil
        shutil.rmtree(run_dir, ignore_errors=True)


def end_launcher(run_dir: str, proc: subprocess.Popen[Any], since: float, grace: float = 5.0,
                 resume: bool = False) -> None:
    """End the launcher and every process of the launch; the launcher is told first that this
    parent ends it, so it ends its ranks instead of passing the signal back here (agent.py).
    `resume`: the launcher may be stopped (SIGSTOP): SIGCONT to its process group first, so the
    SIGTERM acts (SIGKILL follows after `grace` whatever it does)."""
    import signal

    from ddp_doctor.processes.tree import terminate_tree
    from ddp_doctor.training.run.agent import parent_ends
    if proc.poll() is None:
        parent_ends(run_dir)
        if resume:
            try:
                os.killpg(proc.pid, signal.SIGCONT)
            except OSError:
                pass
    terminate_tree(proc, grace=grace, since=since)
