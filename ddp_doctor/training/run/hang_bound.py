"""When "no progress" becomes a hang: the bound `ddp-doctor run` applies, from the ranks' heartbeats.

With `--hang-timeout S` the bound is S for every rank, whatever it does. Without it the bound
adapts to the job:

- before the first WARM_STEPS optimizer steps (init, data loading, compilation, the first
  forward): BEFORE_STEPS;
- after them: STEP_MULTIPLE times the slowest step seen on that rank (the time between two steps,
  so an evaluation or checkpoint between epochs counts as a slow step), never less than FLOOR;
- ranks that wait inside a collective while another rank still makes progress (one rank saving a
  checkpoint or evaluating while the others wait at a barrier) are a slow rank, not a hang, until
  the wait outlasts SLOW_RANK_LIMIT, torch's own default collective timeout.

Progress is what the watchdog sees: a new optimizer step or a change in the main thread's stack.
Pure functions over heartbeat dicts; the parent (and a rank under an outside launcher) calls `judge`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WARM_STEPS = 3
BEFORE_STEPS = 900.0
FLOOR = 300.0
STEP_MULTIPLE = 20.0
SLOW_RANK_LIMIT = 1800.0
MOVING = 30.0  # a rank that progressed this recently is still working


@dataclass(frozen=True)
class HangBound:
    fixed: float | None = None  # --hang-timeout

    def for_rank(self, hb: dict[str, Any]) -> float:
        if self.fixed:
            return self.fixed
        steps = int(hb.get("steps") or 0)
        slowest = float(hb.get("slowest_step") or 0.0)
        if steps < WARM_STEPS or slowest <= 0:
            return BEFORE_STEPS
        return max(FLOOR, STEP_MULTIPLE * slowest)

    def describe(self) -> str:
        if self.fixed:
            return f"{self.fixed:g} s (--hang-timeout)"
        return (f"adaptive: {BEFORE_STEPS:g} s before {WARM_STEPS} steps, then {STEP_MULTIPLE:g}x the slowest "
                f"step (at least {FLOOR:g} s)")


@dataclass(frozen=True)
class Verdict:
    hung: bool
    stalled: list[int]  # ranks past their bound
    moving: list[int]  # ranks still progressing (a slow rank the stalled ones wait for)
    bound: float  # the largest bound among the stalled ranks: "no progress for ..."


def judge(heartbeats: dict[int, dict[str, Any]], now: float, bound: HangBound) -> Verdict | None:
    """None while every rank is within its bound; else whether the job is hung."""
    stalled = sorted(r for r, hb in heartbeats.items()
                     if now - float(hb.get("last_progress", now)) > bound.for_rank(hb))
    if not stalled:
        return None
    applied = max(bound.for_rank(heartbeats[r]) for r in stalled)
    moving = sorted(r for r, hb in heartbeats.items()
                    if r not in stalled and now - float(hb.get("last_progress", now)) <= MOVING)
    if bound.fixed is None and moving and all(heartbeats[r].get("in_collective") for r in stalled):
        waited = max(now - float(heartbeats[r].get("last_progress", now)) for r in stalled)
        return Verdict(hung=waited > SLOW_RANK_LIMIT, stalled=stalled, moving=moving, bound=SLOW_RANK_LIMIT)
    return Verdict(hung=True, stalled=stalled, moving=moving, bound=applied)
