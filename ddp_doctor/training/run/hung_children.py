"""A hang of the ranks a script started itself (torch.multiprocessing.spawn's children, Ray Train's
workers), seen by the process that waits for them (`ddp-doctor run script.py`, one process, no
launcher): their beats (training/probes/child_beat.py) show no progress for the hang bound, so it
asks each for its stacks (SIGUSR2, faulthandler) and its ledger of collectives (their beat threads
answer the request as a launched rank's watchdog does), writes the hang verdict with where each
rank was (DDP801; the ledgers lined up, checks/collectives.py) before anything is ended, then
ends the script's processes and exits 124, instead of waiting for the process group's timeout
(Ray's default: 30 minutes).
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

from ddp_doctor.exit_codes import EXIT_HANG
from ddp_doctor.processes.tree import end_descendants
from ddp_doctor.report.private_files import write_private
from ddp_doctor.training import records
from ddp_doctor.training.probes import child_beat
from ddp_doctor.training.run import ledger
from ddp_doctor.training.run.outside_report import write_outside_report
from ddp_doctor.training.run.stopped_rank import say

STACKS_WAIT = 3.0  # seconds for the children's stacks (after SIGUSR2, or from their beat threads)
LEDGER_WAIT = 3.0  # seconds for their ledgers after the request (their beat threads look each second)


def children_hung(watch: Any, now: float) -> tuple[dict[int, dict[str, Any]], float] | None:
    """(pid -> beat, the bound) when every live rank the script started is past its hang bound
    without progress; None while one still progresses, or when none beats."""
    beats = child_beat.read_beats(watch.run_dir, watch.job_since)
    if not beats:
        return None
    bound = max(watch.hang_bound.for_rank(b) for b in beats.values())
    newest = max(float(b.get("last_progress") or now) for b in beats.values())
    return (beats, bound) if now - newest > bound else None


def end_hung_children(watch: Any, found: tuple[dict[int, dict[str, Any]], float], started: float,
                      opts: Any) -> None:
    """The watchdog thread: the hang report of the ranks the script started, then exit 124."""
    beats, bound = found
    if not watch.claim_stop():
        return
    ranks = sorted(int(b["rank"]) for b in beats.values())
    pids = ", ".join(str(p) for p in sorted(beats))
    say(f"ddp-doctor: the ranks the script started ({len(ranks)}: pids {pids}) made no progress for {bound:g} s; "
         f"their stacks follow, then the job ends (exit {EXIT_HANG})\n")
    try:
        asked = time.time()
        ledger.request(watch.run_dir)
        texts = _stacks(watch.run_dir, beats)
        ledger.wait_for(watch.run_dir, ranks, asked, LEDGER_WAIT)
        hung: dict[int, dict[str, Any]] = {}
        for pid, beat in sorted(beats.items(), key=lambda kv: int(kv[1]["rank"])):
            rank = int(beat["rank"])
            text = texts.get(pid, "")
            if text:
                say(f"--- rank {rank} (pid {pid}) ---\n{text}")
                write_private(records.stack_path(watch.run_dir, rank), text)
            hung[rank] = {**beat, "bound": bound}
        write_outside_report(watch.rank, watch.run_dir, started, True, opts, hung=hung)
    except Exception as e:  # noqa: BLE001 - the job still ends: the bound is what the user asked for
        say(f"ddp-doctor: the hang report failed: {type(e).__name__}: {e}\n")
    finally:
        ended = len(end_descendants())  # after the report: a library may abort this process when they go
        if ended:
            say(f"ddp-doctor: ended {ended} process(es) the script had started\n")
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os._exit(EXIT_HANG)


def _stacks(run_dir: str, beats: dict[int, dict[str, Any]]) -> dict[int, str]:
    """pid -> its threads' stacks, as faulthandler wrote them on SIGUSR2, or as the process's beat
    thread wrote them on the ledger request where it took no SIGUSR2 (bounded wait)."""
    asked: dict[int, int] = {}
    for pid, beat in beats.items():
        path = child_beat.stacks_path(run_dir, pid)
        try:
            asked[pid] = os.path.getsize(path) if os.path.exists(path) else 0
            if beat.get("stacks"):
                os.kill(pid, child_beat.STACK_SIGNAL)
        except OSError:
            asked.pop(pid, None)
            continue
    out: dict[int, str] = {}
    sizes: dict[int, int] = {}
    deadline = time.monotonic() + STACKS_WAIT
    while asked and time.monotonic() < deadline:
        time.sleep(0.1)
        for pid, before in list(asked.items()):
            try:
                size = os.path.getsize(child_beat.stacks_path(run_dir, pid))
            except OSError:
                continue  # not written yet (the beat thread writes it within its second)
            if size > before and sizes.get(pid) == size:  # written, and no longer growing
                with open(child_beat.stacks_path(run_dir, pid), encoding="utf-8", errors="replace") as f:
                    f.seek(before)
                    out[pid] = f.read()
                del asked[pid]
            sizes[pid] = size
    return out

