"""The preflight's progress line: which stage each of its ranks is in, and for how long.

It comes at fixed steps after the launch (5, 10, 20, 40 s, ..., doubling, so at most a handful
before the launch's bound), from the small stage file each rank writes when a stage begins
(processes/launch_dir.py, note_stage): printed by the parent of a self-launched preflight and, until
the script starts, by the parent of `ddp-doctor run`. Whether it prints, and on which stream, is
processes/progress.py's rule, shared with `ddp-doctor run`'s lines.
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.processes.progress import MAX_NAMED, PREFIX, rank_list, seconds

FIRST_STAGE_LINE = 5.0  # seconds after the launch; then each line at twice the time of the one before


class StageLines:
    """When a preflight line is due and what it says. `launched`: time.time() of the launch;
    `bound`: seconds after which the launch is stopped, or None when each wait has its own
    (`ddp-doctor run`: `per_wait`, its --timeout); `nproc`: the ranks started, or None when only the
    ranks seen are known (a rank not seen yet is then not named); `first_rank`: the first of them
    (a node of several: its own ranks)."""

    def __init__(self, launched: float, bound: float | None, nproc: int | None, first: float = FIRST_STAGE_LINE,
                 per_wait: float | None = None, first_rank: int = 0) -> None:
        self.launched, self.bound, self.nproc, self.per_wait = launched, bound, nproc, per_wait
        self.first_rank = first_rank
        self.next_at = first

    def due(self, stages: dict[int, dict[str, Any]], now: float) -> str | None:
        """The line for `now`, once per step (a late poll gives one line, not one per missed step);
        None between steps and once the bound is near (its own verdict follows)."""
        waited = now - self.launched
        if waited < self.next_at:
            return None
        while self.next_at <= waited:
            self.next_at *= 2
        if self.bound is not None and waited >= self.bound:
            return None
        by_stage: dict[str, list[int]] = {}
        mine = range(self.first_rank, self.first_rank + self.nproc) if self.nproc is not None else None
        for r in (mine if mine is not None else sorted(stages)):
            st = stages.get(r)
            by_stage.setdefault(str(st.get("stage")) if st else "not started yet", []).append(r)
        parts = []
        for stage, ranks in sorted(by_stage.items(), key=lambda kv: kv[1][0])[:MAX_NAMED]:
            if stage == "not started yet":
                parts.append(f"{rank_list(ranks)} not started yet")
                continue
            longest = max(now - float(stages[r].get("since") or now) for r in ranks)
            parts.append(f"{rank_list(ranks)} in {stage} ({seconds(max(0.0, longest))})")
        more = len(by_stage) - MAX_NAMED
        ending = (f"the launch is stopped at {self.bound:g} s" if self.bound is not None
                  else f"each wait is bounded by {self.per_wait:g} s (--timeout)" if self.per_wait else "")
        return (f"{PREFIX}preflight running for {seconds(waited)}: {'; '.join(parts) or 'no rank started yet'}"
                f"{f'; {more} more stages' if more > 0 else ''}{f'; {ending}' if ending else ''}")
