"""Progress lines while ddp-doctor waits: whether to print them, and the preflight's.

`ddp-doctor preflight` and `ddp-doctor run` say on stderr, one line at a time, what they are
waiting for when a wait grows long: which stage the preflight's ranks are in, or (training/run/
progress.py) which rank has made no progress, where, and when the job will be ended. Never on
stdout: the script's stdout is its own.

Whether they print (`enabled`): `--progress` / `--no-progress`, else DDP_DOCTOR_PROGRESS (1 or 0),
else only when stdout is a terminal (a person watching; a log or a pipe stays quiet).

The preflight's line (`StageLines`) comes at fixed steps after the launch (5, 10, 20, 40 s, ...,
doubling, so at most a handful before the launch's bound), naming the stage each rank is in and
for how long, from the small stage file each rank writes when a stage begins (`note_stage`):
printed by the parent of a self-launched preflight and, until the script starts, by the parent of
`ddp-doctor run`.
"""
from __future__ import annotations

import glob
import json
import os
import sys
from typing import Any, Mapping

PROGRESS_ENV = "DDP_DOCTOR_PROGRESS"
PREFIX = "ddp-doctor: "
FIRST_STAGE_LINE = 5.0  # seconds after the launch; then each line at twice the time of the one before
MAX_NAMED = 4  # ranks named with their stage or place in one line; the others are counted
_YES, _NO = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def enabled(flag: bool | None, env: Mapping[str, str] | None = None, stream: Any = None) -> bool:
    """--progress (True) / --no-progress (False) win; else DDP_DOCTOR_PROGRESS; else whether
    `stream` (default: stdout) is a terminal. A value of the variable that is neither yes nor no
    is taken as unset."""
    if flag is not None:
        return flag
    value = (os.environ if env is None else env).get(PROGRESS_ENV)
    if value is not None and value.strip().lower() in _YES:
        return True
    if value is not None and value.strip().lower() in _NO:
        return False
    try:
        return bool((stream or sys.stdout).isatty())
    except (AttributeError, ValueError, OSError):  # closed or replaced stdout
        return False


def say(line: str | None, stream: Any = None) -> None:
    """One progress line on stderr (redacted); a closed stream loses it, never the job."""
    if not line:
        return
    from ddp_doctor.report.redact import redact_text
    try:
        s = stream or sys.stderr
        s.write(redact_text(line) + "\n")
        s.flush()
    except (OSError, ValueError, AttributeError):
        pass


def seconds(x: float) -> str:
    """A duration for a progress line: tenths below 10 s, whole seconds above."""
    return f"{x:.1f} s" if x < 10 else f"{x:.0f} s"


def rank_list(ranks: list[int]) -> str:
    """"rank 1", "ranks 0, 1", "ranks 0, 1, 2, 3 and 60 more"."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(str(r) for r in ranks[:MAX_NAMED])
    return f"ranks {shown}" + (f" and {len(ranks) - MAX_NAMED} more" if len(ranks) > MAX_NAMED else "")


# ------------------------------------------------------------------ the preflight's stages

STAGE_FILE = "stage-{rank}.json"


def note_stage(launch_dir: str | None, rank: int, stage: str, since: float) -> None:
    """A rank entered `stage` at `since` (time.time()): the parent's progress line reads it. A
    stage name is ddp-doctor's own word (no user text); a failed write loses only the line."""
    if not launch_dir:
        return
    from ddp_doctor.report.private_files import write_private
    try:
        write_private(os.path.join(launch_dir, STAGE_FILE.format(rank=rank)),
                      json.dumps({"rank": rank, "stage": stage, "since": since}))
    except (OSError, ValueError):
        pass


def read_stages(launch_dir: str) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for p in glob.glob(os.path.join(launch_dir, STAGE_FILE.format(rank="*"))):
        try:
            with open(p, encoding="utf-8") as f:
                d = json.load(f)
            out[int(d["rank"])] = d
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


class StageLines:
    """When a preflight line is due and what it says. `launched`: time.time() of the launch;
    `bound`: seconds after which the launch is stopped, or None when each wait has its own
    (`ddp-doctor run`: `per_wait`, its --timeout); `nproc`: the ranks started, or None when only the
    ranks seen are known (a rank not seen yet is then not named)."""

    def __init__(self, launched: float, bound: float | None, nproc: int | None, first: float = FIRST_STAGE_LINE,
                 per_wait: float | None = None) -> None:
        self.launched, self.bound, self.nproc, self.per_wait = launched, bound, nproc, per_wait
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
        for r in (range(self.nproc) if self.nproc is not None else sorted(stages)):
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
