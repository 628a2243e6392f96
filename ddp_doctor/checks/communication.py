"""Communication checks that need the process group (stage `group`).

The full all_reduce sweep, stragglers and clock skew belong to the communication suite; this module
holds the correctness check every preflight runs: one all_reduce whose exact result is known.
"""
from __future__ import annotations

import time
from typing import Iterator

from ddp_doctor.findings import Problem
from ddp_doctor.group import Group
from ddp_doctor.registry import check

SANITY_BYTES = (4096, 1 << 20)


def busbw_factor(n: int) -> float:
    """nccl-tests: all_reduce bus bandwidth = algbw x 2(n-1)/n."""
    return 2.0 * (n - 1) / n if n > 1 else 1.0


@check("DDP401", category="communication", severity="error", stage="group",
       title="all_reduce gives a wrong result", timeout=120.0)
def all_reduce_correct(ctx: object, group: Group) -> Iterator[Problem]:
    """
    What: Every rank all_reduces (sum) a float32 tensor filled with rank + 1 and checks that each
    element equals n(n+1)/2 exactly, at a small and a 1 MiB size.
    Why: A backend that connects but corrupts or drops data (a broken NCCL transport, a faulty GPU
    or NIC) makes training diverge silently instead of failing.
    Fix: Run `ddp-doctor bench-comm` to see which size fails; try NCCL_PROTO=simple and
    NCCL_ALGO=Ring, and check the GPUs and NICs of the ranks named (ECC errors, link state).
    """
    import torch
    import torch.distributed as dist

    n = group.world_size
    expected = n * (n + 1) / 2.0
    results = group.measurements.setdefault("all_reduce", [])
    for nbytes in SANITY_BYTES:
        t = torch.full((nbytes // 4,), float(group.rank + 1), dtype=torch.float32, device=group.device)
        group.wait(dist.all_reduce(t, async_op=True))  # warm-up
        t.fill_(float(group.rank + 1))
        start = time.perf_counter()
        group.wait(dist.all_reduce(t, async_op=True))
        if t.is_cuda:
            torch.cuda.synchronize(t.device)
        seconds = time.perf_counter() - start
        wrong = int((t != expected).sum().item())
        algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
        results.append({"bytes": nbytes, "time_us": seconds * 1e6, "algbw_gbps": algbw,
                        "busbw_gbps": algbw * busbw_factor(n), "correct": wrong == 0, "wrong": wrong})
        if wrong:
            sample = t[t != expected][:3].tolist()
            yield Problem(
                message=f"all_reduce(sum) of {nbytes} bytes over {n} ranks ({group.backend}): {wrong} of "
                        f"{t.numel()} elements wrong on rank {group.rank}; expected {expected:g}, saw "
                        f"e.g. {sample}",
                evidence={"bytes": nbytes, "wrong": wrong, "expected": expected, "sample": sample})
