"""Progress lines while ddp-doctor waits for its processes: whether to print them, and their words.

`ddp-doctor preflight` and `ddp-doctor run` say on stderr, one line at a time, what they are
waiting for when a wait grows long: which stage the preflight's ranks are in (preflight_ranks/
stage_lines.py), or which rank has made no progress, where, and when the job will be ended
(training/run/hang_lines.py). Never on stdout: the script's stdout is its own.

Whether they print (`enabled`): `--progress` / `--no-progress` (`-q` / `--quiet`), else
DDP_DOCTOR_PROGRESS (1 or 0), else yes, to a terminal or not: a CI log shows a hang coming as a
person at a terminal sees it. The lines come only once a wait grows long, so a job that goes well
prints none.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Mapping

PROGRESS_ENV = "DDP_DOCTOR_PROGRESS"
PREFIX = "ddp-doctor: "
MAX_NAMED = 4  # ranks named with their stage or place in one line; the others are counted
_YES, _NO = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def enabled(flag: bool | None, env: Mapping[str, str] | None = None) -> bool:
    """--progress (True) / --no-progress, --quiet (False) win; else DDP_DOCTOR_PROGRESS; else on.
    A value of the variable that is neither yes nor no is taken as unset."""
    if flag is not None:
        return flag
    value = (os.environ if env is None else env).get(PROGRESS_ENV)
    return not (value is not None and value.strip().lower() in _NO)


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
