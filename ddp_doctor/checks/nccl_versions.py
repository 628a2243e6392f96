"""NCCL versions with a known bug that hangs jobs (DDP408): the version torch loads, against a small
table of fixed bugs, each with its public source and the condition under which it bites."""
from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Callable, Iterator

from ddp_doctor.context import RankContext
from ddp_doctor.facts import gpus
from ddp_doctor.findings import Problem
from ddp_doctor.registry import check


@dataclass(frozen=True)
class KnownBug:
    first: tuple[int, ...]  # first affected version
    fixed: tuple[int, ...]  # first version with the fix
    what: str
    source: str
    applies: Callable[[RankContext], bool] = lambda ctx: True
    when: str = ""  # the condition, as the message says it


def _aarch64(ctx: RankContext) -> bool:
    return platform.machine().lower() in ("aarch64", "arm64")


def _launch_blocking(ctx: RankContext) -> bool:
    return ctx.env.get("CUDA_LAUNCH_BLOCKING") == "1"


KNOWN_BUGS: tuple[KnownBug, ...] = (
    KnownBug((2, 29, 2), (2, 29, 3), "a regression that hangs collectives",
             "pytorch/pytorch#174338 (NCCL 2.29.3 is 'a patch release that fixes the regression (hang) in 2.29.2')"),
    KnownBug((0,), (2, 29, 3), "proxy-op slots leak on ARM until every rank spins with no error and no timeout",
             "NCCL 2.29.3 release notes, 'Fixed CAS usage in case of weak failure which was causing a hang on ARM' "
             "(quoted in marin-community/marin#8038)", _aarch64, "on aarch64"),
    KnownBug((2, 14, 0), (2, 17, 1), "collectives hang when CUDA_LAUNCH_BLOCKING=1",
             "pytorch/pytorch#97843, NVIDIA/nccl#750", _launch_blocking, "with CUDA_LAUNCH_BLOCKING=1"),
)


def _text(v: tuple[int, ...]) -> str:
    return ".".join(str(x) for x in v)


@check("DDP408", category="communication", severity="warning", title="NCCL version with a known hang bug",
       cause_class="configuration")
def nccl_known_bugs(ctx: RankContext) -> Iterator[Problem]:
    """
    What: The NCCL that torch loads on this rank is a version with a known bug that hangs jobs
    (a table of fixed bugs, each with its public source): 2.29.2's hang regression; before 2.29.3
    on aarch64 (GB200/Grace) a proxy-slot leak that wedges every rank; 2.14 to 2.17.0 with
    CUDA_LAUNCH_BLOCKING=1.
    Why: These hangs show no error and no timeout message: every rank sits in a collective at full
    GPU utilisation until the job is killed, which looks like a problem of the script or the network.
    Fix: Use a torch build with a newer NCCL, or install the fixed NCCL wheel (pip install
    nvidia-nccl-cu12>=VERSION, which torch's pip builds load), or remove the condition named
    (CUDA_LAUNCH_BLOCKING=1 is for debugging only).
    """
    if ctx.backend not in ("nccl", None):
        return
    version = gpus.torch_nccl_version()
    if version is None:
        return
    for bug in KNOWN_BUGS:
        if bug.first <= version < bug.fixed and bug.applies(ctx):
            when = f" {bug.when}" if bug.when else ""
            yield Problem(
                message=f"NCCL {_text(version)}{when}: {bug.what} (fixed in {_text(bug.fixed)}; {bug.source})",
                evidence={"nccl": _text(version), "fixed_in": _text(bug.fixed), "source": bug.source})
