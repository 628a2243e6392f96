"""Progress lines while a job makes no progress: before the hang bound ends it, say so.

A rank that has made no progress (hang_bound.py: no optimizer step, no change in the main
thread's stack) for a fifth of its bound gets a line on stderr, and another at each further fifth
(at 1/5, 2/5, 3/5 and 4/5; at 5/5 the hang verdict itself follows):

    ddp-doctor: rank 1 has made no progress for 60 s, at train.py:12 in main; the job is ended at 300 s unless it moves

One line per step of the job's stall, whichever ranks stall: the step is the most stalled rank's,
and the line names every rank past a fifth of its bound. Once the ranks move, it starts over. Ranks
that wait inside a collective for a rank that still works (a slow rank, not a hang, while the
bound adapts) are ended only at hang_bound.SLOW_RANK_LIMIT: the line says that bound.

Printed by the parent of local ranks (training/run/stall_watch.py), and under an outside launcher by
one rank per node (watchdog.py): the lowest live rank of the node, the stuck one included.
Pure rule (`HangLines.due`) over heartbeat dicts and a clock the caller gives.
"""
from __future__ import annotations

import math
import os
from typing import Any

from ddp_doctor.processes.progress import MAX_NAMED, PREFIX, rank_list, seconds
from ddp_doctor.training.run.hang_bound import MOVING, SLOW_RANK_LIMIT, HangBound

STEPS = 5  # a line at each fifth of the bound, the last fifth being the verdict's


def place(hb: dict[str, Any]) -> str:
    """Where a rank is, short: `file.py:LINE in func` (the innermost frame of user code, from its
    heartbeat), and whether it waits in a collective."""
    where = hb.get("where") or hb.get("innermost")
    if not where:
        return "place not known yet"
    path, sep, rest = str(where).rpartition(":")
    text = f"{os.path.basename(path)}:{rest}" if sep else str(where)
    return f"{text}, in a collective" if hb.get("in_collective") else text


class HangLines:
    """The step of the job's stall last announced (0: none since the ranks last moved)."""

    def __init__(self, bound: HangBound) -> None:
        self.bound = bound
        self.said = 0

    def _limits(self, heartbeats: dict[int, dict[str, Any]], now: float) -> dict[int, float]:
        """The bound that will end each rank, as hang_bound.judge applies it."""
        limits = {r: self.bound.for_rank(hb) for r, hb in heartbeats.items()}
        idle = {r: now - float(hb.get("last_progress", now)) for r, hb in heartbeats.items()}
        waiting = [r for r in heartbeats if idle[r] >= limits[r] / STEPS]
        moving = [r for r in heartbeats if r not in waiting and idle[r] <= MOVING]
        if self.bound.fixed is None and moving and waiting and all(heartbeats[r].get("in_collective") for r in waiting):
            limits.update({r: SLOW_RANK_LIMIT for r in waiting})
        return limits

    def due(self, heartbeats: dict[int, dict[str, Any]], now: float) -> str | None:
        """The line for `now`, or None. `heartbeats`: the training ranks still running (hb-*.json:
        last_progress, steps, slowest_step, in_collective, where). The job's step is its most
        stalled rank's (the share of its own bound it has waited); a line comes when that step
        rises, so ranks that stall at different moments never add lines of their own."""
        limits = self._limits(heartbeats, now)
        idle = {r: now - float(hb.get("last_progress", now)) for r, hb in heartbeats.items()}
        steps = {r: min(STEPS - 1, math.floor(idle[r] * STEPS / limits[r])) if limits[r] > 0 else 0
                 for r in heartbeats}
        ranks = sorted(r for r, step in steps.items() if step >= 1)
        top = max((steps[r] for r in ranks), default=0)
        if top <= self.said:
            self.said = top  # a rank moved: a later rise is said again
            return None
        self.said = top
        lead = max(ranks, key=lambda r: (idle[r] / limits[r], -r))  # the rank nearest its bound
        places = [f"rank {r} at {place(heartbeats[r])}" for r in ranks[:MAX_NAMED]] if len(ranks) > 1 else \
            [f"at {place(heartbeats[lead])}"]
        verb, them = ("has", "it moves") if len(ranks) == 1 else ("have", "they move")
        end = limits[lead]
        slow = " (waiting for a rank that still works)" if end == SLOW_RANK_LIMIT and self.bound.fixed is None else ""
        return (f"{PREFIX}{rank_list(ranks)} {verb} made no progress for {seconds(idle[lead])}, {'; '.join(places)}; "
                f"the job is ended at {end:g} s{slow} unless {them}")


def training_beats(run_dir: str, since: float = 0.0) -> dict[int, dict[str, Any]]:
    """The heartbeats of ranks that train and have not ended (what detect_hang judges)."""
    from ddp_doctor.training import records
    done = records.read_outcomes(run_dir, since)
    return {r: hb for r, hb in records.read_heartbeats(run_dir, since).items()
            if hb.get("phase") == "training" and r not in done}
