"""A rank under an outside launcher (torchrun, mpirun, SLURM, SageMaker's toolkit) stopped by SIGTERM or
SIGHUP: a stopped SageMaker job, a cancelled torchrun job, or the launcher ending the other ranks
after one failed. The watchdog thread reports the stop (where each rank was, or the peer's failure
it followed) and ends the rank with 128 + the signal, as the default action would. A hung rank
ends its script's processes as a stopped one does (end_children).
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any

from ddp_doctor.facts.launchers import multi_node, world_sizes
from ddp_doctor.processes.stop_signals import Interrupt
from ddp_doctor.report import build as reportlib
from ddp_doctor.report import sinks
from ddp_doctor.report.publish import Output
from ddp_doctor.training import records
from ddp_doctor.training.run import ledger
from ddp_doctor.training.run.endings import exchange, remote_gone
from ddp_doctor.training.run.options import RunOptions
from ddp_doctor.training.run.outside_report import preflight_findings, write_outside_report

STOPPED_PEERS_WAIT = 5.0  # seconds a stopped rank waits for its node's ledgers (rank 0) or rank 0's


def end_stopped_rank(watch: Any, signo: int, started: float, opts: RunOptions) -> None:
    """Outside launcher, SIGTERM/SIGHUP (a stopped SageMaker job, a cancelled torchrun job): this
    rank's stacks, ledger and outcome, the report (rank 0's, or this rank's own file), then exit
    128 + the signal as the default action would. Runs on the watchdog thread."""
    if stopped_for_fail_on(watch):
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
            write_outside_report(watch.rank, watch.run_dir, started, True, opts)
        finally:
            end_children(watch)  # the main thread puts a failed ending on file before it ends them
            sys.stderr.flush()
            os._exit(int(own.get("exit_code") or 1))
    try:
        if watch.phase == "training":
            # first: in a collective at its last sample, that one did not complete, even if a peer
            # that exits first makes it fail (torch then retires it) before this dump
            watch.write_ledger("running", failed_in_collective=watch.in_collective)
        sys.stderr.write(f"ddp-doctor: rank {watch.rank} stopped by {stop.name}; where it was follows\n")
        watch.dump_stacks(sys.stderr)
        watch.save_stacks()
        records.write_outcome(watch.run_dir, watch.rank, {
            "exit_code": stop.exit_code, "exception": None, "interrupted": stop.to_dict(),
            "host": os.uname().nodename, "phase": watch.phase})
        if watch.rank == 0 and not _a_peer_failed(watch.run_dir, watch.rank, started):
            # at once: the launcher's grace (torchrun: SIGKILL 30 s after its SIGTERM) may end before
            # the full report is made. Not over a peer's verdict (its hang, its failure).
            _early_stop_report(watch, stop, started, opts)
        if watch.phase == "training":
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
            write_outside_report(watch.rank, watch.run_dir, started, True, opts)
        else:
            write_outside_report(watch.rank, watch.run_dir, started, True, opts, interrupted=stop)
    except BaseException as e:  # noqa: BLE001 - the rank still exits 128 + N; say why its report is missing
        say(f"ddp-doctor: rank {watch.rank}: the stop could not be reported whole ({type(e).__name__}: {e})\n"
            + "".join(traceback.format_exception(e)))
    finally:
        end_children(watch)
        sys.stderr.flush()
        os._exit(stop.exit_code)


def warm_stop_report() -> None:
    """Outside launcher, before the script runs: import what a stopped rank's report needs and
    write_outside_report defers (the rest this module imports), so a stop never imports on the
    watchdog thread while the script's main thread imports (torch's module locks can then hand one
    thread a half-made module), and a loaded host spends the launcher's grace on the report, not on
    imports."""
    try:
        import ddp_doctor.checks.job  # noqa: F401
        import ddp_doctor.checks.stalls  # noqa: F401
        import ddp_doctor.training.job_report  # noqa: F401
        import ddp_doctor.training.run.run_dir  # noqa: F401
    except Exception:  # noqa: BLE001 - a stop then imports what it needs, as before
        pass


def _early_stop_report(watch: Any, stop: Any, started: float, opts: RunOptions) -> None:
    """Rank 0 of a stopped job, before it waits for its peers' ledgers: the job's report as
    "interrupted" with where each rank of its node was (their heartbeats: DDP808) and the
    preflight's findings. The full report (the ledgers' cause) replaces it when there is time; a
    launcher that kills the rank first leaves this one, never the preflight's "running"."""
    try:
        from ddp_doctor.checks.stalls import interrupted_finding  # deferred as write_outside_report's
        since = started - records.SAME_JOB
        beats = records.read_heartbeats(watch.run_dir, since)
        beats[watch.rank] = {**beats.get(watch.rank, {}), "where": watch.where, "in_collective": watch.in_collective}
        earlier, pf = preflight_findings(watch.run_dir, since)
        rep = reportlib.build_report(world=(pf or {}).get("world") or {"launcher": "torchrun"},
                                     ranks=(pf or {}).get("ranks") or [],
                                     findings=[*earlier, interrupted_finding(stop, beats, {})],
                                     measurements=(pf or {}).get("measurements") or {}, phase="training")
        if pf is not None and pf.get("status"):
            rep["preflight_status"] = pf["status"]
        sinks.write_report_file(reportlib.mark_interrupted(rep, stop.to_dict()),
                                Output(report_path=opts.report_path).path())
    except Exception as e:  # noqa: BLE001 - the full report is still attempted
        say(f"ddp-doctor: rank {watch.rank}: the early report of the stop failed ({type(e).__name__}: {e})\n")


def _share_stopped_ending(watch: Any, started: float, failed: bool) -> None:
    """Several nodes: a rank its launcher stopped because a peer of its node failed or vanished
    (`failed`: or after its own script failed, before the main thread had shared that) puts its
    ending, and the peers of its node it saw gone (SIGKILL, the OOM killer), in the job's store,
    as a rank that ended does: the other nodes' reports then name the vanished rank (whether the
    stop or its own collective's error came first is a race). A failed rank also copies the other
    nodes' endings here for its report, as the main thread would. Bounded, never raises."""
    try:
        if multi_node(*world_sizes(os.environ)):
            gone = ledger.vanished_ranks(watch.run_dir, but=watch.rank, since=started - records.SAME_JOB)
            exchange(watch.run_dir, watch.rank, failed=failed, gone=gone)
    except Exception:  # noqa: BLE001 - the rank's own report is written next whatever this did
        pass


def stopped_for_fail_on(watch: Any) -> bool:
    """Whether this rank's script had ended well and a peer of its node exited 3 by --fail-on after
    writing the job's verdict (its ending says "fail_on"): the launcher's stop is its answer to that
    exit, never a stop of the job, so the report is not rewritten as "interrupted"."""
    ended = records.read_outcomes(watch.run_dir, watch.job_since)
    own = ended.get(watch.rank)
    if own is None or own.get("exception") or own.get("exit_code") or own.get("interrupted") or own.get("hung"):
        return False
    return any(o.get("fail_on") for r, o in ended.items() if r != watch.rank)


def end_children(watch: Any) -> None:
    """Before a stopped or hung rank's os._exit: the processes its script started (DataLoader
    workers, servers, daemons: training/run/child_watch.py finds them) end with it, never train on.
    Not leftovers of a script that ended on its own, so said on stderr, not in the report."""
    children = getattr(watch, "children", None)
    if children is None:
        return
    try:
        ended = (children.end(interpreter_exits=False) or {}).get("processes") or []
        if ended:
            say(f"ddp-doctor: rank {watch.rank} ended {len(ended)} process(es) its script had started\n")
    except Exception:  # noqa: BLE001 - the rank still ends as the signal or the hang asks
        pass


def _a_peer_failed(run_dir: str, rank: int, started: float) -> str | None:
    """How another rank of the job ended before this one was stopped: "hung" (it reached the hang
    bound), "failed" (it raised or exited non-zero on its own, or its process is gone without an
    ending, on this node or seen on another), or None."""
    since = started - records.SAME_JOB
    peers = {r: o for r, o in records.read_outcomes(run_dir, since).items() if r != rank and not o.get("interrupted")}
    if any(o.get("hung") for o in peers.values()):
        return "hung"
    if any(o.get("exception") or o.get("exit_code") for o in peers.values()):
        return "failed"
    return "failed" if ledger.vanished_ranks(run_dir, but=rank, since=since) or remote_gone(run_dir) else None


def say(text: str) -> None:
    """ddp-doctor's own line on stderr, from a rank that is ending: a closed stderr loses it."""
    try:
        sys.stderr.write(text)
    except (OSError, ValueError):  # a closed stderr takes nothing
        pass


def wait_for_stop(bound: float = 30.0) -> None:
    """The main thread, while the watchdog thread reports the stop and ends the process (os._exit);
    past the bound the main thread goes on to its own ending."""
    time.sleep(bound)
