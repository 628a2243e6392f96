"""A rank under an outside launcher that made no progress for its hang bound (its watchdog thread's
on_hang): no ddp-doctor parent watches it, so it gathers where every rank was, writes the hang
verdict itself and exits 124, and the launcher ends the job instead of waiting for torch's
30-minute timeout.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from ddp_doctor.exit_codes import EXIT_HANG
from ddp_doctor.facts.launchers import multi_node, world_sizes
from ddp_doctor.training import records
from ddp_doctor.training.run.options import RunOptions
from ddp_doctor.training.run.outside_report import write_outside_report
from ddp_doctor.training.run.stopped_rank import end_children
from ddp_doctor.training.run.watchdog import collect_stacks


def end_hung_rank(watch: Any, started: float | None = None, opts: RunOptions | None = None) -> None:
    """Outside launcher: a rank without progress dumps its stacks, asks the other ranks of its node
    for theirs and their ledgers (and, on several nodes, the other nodes' through the store), writes
    the hang verdict (DDP801, where each rank was) and ends itself (exit 124), so the launcher ends
    the job instead of waiting for torch's 30-minute timeout. Ranks that reach the bound together
    each write the same verdict. Runs on the watchdog thread: the main thread is blocked."""
    sys.stderr.write(f"ddp-doctor: rank {watch.rank} made no progress for {watch.hang_timeout:g} s; "
                     f"its stacks follow, then it exits {EXIT_HANG}\n")
    try:
        watch.dump_stacks(sys.stderr)
        watch.save_stacks()
        records.write_outcome(watch.run_dir, watch.rank, {"exit_code": EXIT_HANG, "exception": None,
                                                          "hung": True, "phase": "training"})
        watch.write_ledger("hung")
        if opts is not None and started is not None and watch.claim_stop():
            _report_hang(watch, started, opts)
    except Exception as e:  # noqa: BLE001 - the rank must still end: the launcher then ends the job
        sys.stderr.write(f"ddp-doctor: the hang report of rank {watch.rank} failed: {type(e).__name__}: {e}\n")
    finally:
        end_children(watch)
        sys.stderr.flush()
        os._exit(EXIT_HANG)


def _report_hang(watch: Any, started: float, opts: RunOptions) -> None:
    """The hang verdict, once the other ranks' stacks and ledgers (and other nodes') are in."""
    since = started - records.SAME_JOB
    peers = {r: hb for r, hb in records.read_heartbeats(watch.run_dir, since).items() if r != watch.rank}
    collect_stacks(watch.run_dir, peers, reason="hang", across=multi_node(*world_sizes(os.environ)))
    beats = {r: {**hb, "bound": watch.hang_timeout} for r, hb in records.read_heartbeats(watch.run_dir, since).items()}
    write_outside_report(watch.rank, watch.run_dir, started, True, opts, hung=beats)
