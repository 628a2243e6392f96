"""The all_reduce sweep with the nccl-tests methodology (docs/facts.md, "Bandwidth"), shared by the
`communication` checks of every preflight and by `ddp-doctor bench-comm`: SweepConfig and its
defaults, Comm (a process group whose every collective is bounded), the sweep, and the checked
broadcast / all_gather.

    sizes doubling from --comm-min-bytes to --comm-max-bytes
      per size: fill known per-rank values -> one all_reduce whose result is checked element by
                element (it is also the first warm-up) -> further warm-ups -> the timed loop ->
                the last result checked again where float32 holds it exactly
      time   = the slowest rank's loop (CPU: each rank times its loop between two small
               all_gathers and the maximum is taken; GPU: CUDA events around the loop)
      algbw  = bytes / time;  busbw = algbw x factor  (all_reduce 2(n-1)/n, all_gather (n-1)/n,
               broadcast 1)
      #wrong = elements that differ from the exact expected sum, over every rank

The preflight runs a time-budgeted sweep (few timed iterations at the large sizes, sized from the
warm-up so that all timed loops together take about `--comm-budget` seconds); bench-comm runs the
full sweep. Every collective is bounded by the preflight timeout.

Nothing here imports torch at module level: the command line reads the defaults.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Mapping, Sequence

from ddp_doctor.comm.arithmetic import (
    KIB,
    MIB,
    bandwidth,
    count_wrong,
    exact_sum,
    fill_rank_values,
    final_exact,
    pattern,
    sizes,
)

DEFAULT_MIN_BYTES = 4 * KIB
DEFAULT_MAX_BYTES_CPU = 64 * MIB
DEFAULT_MAX_BYTES_GPU = 256 * MIB
# a CPU preflight stops at 16 MiB: gloo's figures are reported, never judged (docs/communication.md),
# and 32 and 64 MiB would double the sweep's time (about 0.25 s more on 2 ranks) for no verdict
PREFLIGHT_MAX_BYTES_CPU = 16 * MIB
# bench-comm: the full sweep
BENCH_ITERS, BENCH_WARMUP = 20, 5
# preflight: at most this many timed iterations per size, within a time budget for the timed
# loops of one sweep (the checked first result of each size is always taken)
PREFLIGHT_ITERS, PREFLIGHT_WARMUP = 5, 1
PREFLIGHT_BUDGET_S_CPU, PREFLIGHT_BUDGET_S_GPU = 0.25, 2.0


@dataclass(frozen=True)
class SweepConfig:
    min_bytes: int = DEFAULT_MIN_BYTES
    max_bytes: int = DEFAULT_MAX_BYTES_CPU
    iters: int = BENCH_ITERS
    warmup: int = BENCH_WARMUP
    budget_s: float | None = None      # timed loops of the whole sweep; None: no budget

    @property
    def sizes(self) -> list[int]:
        return sizes(self.min_bytes, self.max_bytes)


def sweep_config(options: Mapping[str, Any], device: str) -> SweepConfig:
    """The sweep a run asks for: ctx.options (from the command line) over the defaults of its
    mode. Keys: comm_mode ("preflight" | "bench"), comm_min_bytes, comm_max_bytes, comm_iters,
    comm_warmup, comm_budget_s."""
    gpu = device.startswith("cuda")
    bench = options.get("comm_mode") == "bench"
    def opt(key: str, default: Any) -> Any:
        v = options.get(key)
        return default if v is None else v
    budget = None if bench else opt("comm_budget_s", PREFLIGHT_BUDGET_S_GPU if gpu else PREFLIGHT_BUDGET_S_CPU)
    return SweepConfig(
        min_bytes=int(opt("comm_min_bytes", DEFAULT_MIN_BYTES)),
        max_bytes=int(opt("comm_max_bytes", DEFAULT_MAX_BYTES_GPU if gpu
                          else DEFAULT_MAX_BYTES_CPU if bench else PREFLIGHT_MAX_BYTES_CPU)),
        iters=int(opt("comm_iters", BENCH_ITERS if bench else PREFLIGHT_ITERS)),
        warmup=max(1, int(opt("comm_warmup", BENCH_WARMUP if bench else PREFLIGHT_WARMUP))),
        budget_s=None if budget is None or budget <= 0 else float(budget))


@dataclass
class Comm:
    """A process group as the sweep sees it: `pg` None is the world group."""
    rank: int              # rank within the group
    size: int
    device: str
    timeout: float         # seconds; bounds every collective
    pg: Any = None
    label: str = "world"   # "world" | "intra-node" | "inter-node"
    ranks: list[int] = field(default_factory=list)  # global ranks of the group

    def wait(self, work: Any) -> None:
        work.wait(timedelta(seconds=self.timeout))

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            import torch
            torch.cuda.synchronize(self.device)

    def all_reduce(self, t: Any) -> None:
        import torch.distributed as dist
        self.wait(dist.all_reduce(t, group=self.pg, async_op=True))

    def gather_floats(self, values: Sequence[float]) -> list[list[float]]:
        """Every rank's `values` (a short list of floats), in group-rank order."""
        import torch
        import torch.distributed as dist
        mine = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        out = [torch.empty_like(mine) for _ in range(self.size)]
        self.wait(dist.all_gather(out, mine, group=self.pg, async_op=True))
        return [x.tolist() for x in out]


def world_comm(group: Any) -> Comm:
    """The Comm of a preflight's Group (ddp_doctor.context.Group)."""
    return Comm(rank=group.rank, size=group.world_size, device=group.device, timeout=group.timeout,
                ranks=list(range(group.world_size)))


def sweep_all_reduce(comm: Comm, cfg: SweepConfig,
                     progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run the sweep on `comm`; one entry per size (identical on every rank of the group):
    bytes, count, type, redop, time_us, algbw_gbps, busbw_gbps, correct, wrong (summed over
    ranks), wrong_ranks, iters, group, nranks."""
    import torch
    n, sizes_ = comm.size, cfg.sizes
    # One buffer for every size (views of it), so no size pays for fresh pages.
    buf = torch.empty(max(sizes_) // 4, dtype=torch.float32, device=comm.device)
    size_budget = None if cfg.budget_s is None else cfg.budget_s / len(sizes_)
    gpu = comm.device.startswith("cuda")
    results = []
    for nbytes in sizes_:
        count = nbytes // 4
        t = buf[:count]
        fill_rank_values(t, comm.rank, n)
        expected = exact_sum(n)
        comm.sync()
        start = time.perf_counter()
        comm.all_reduce(t)                      # the checked result, and the first warm-up
        comm.sync()
        first_s = time.perf_counter() - start
        wrong_first = count_wrong(t, expected)
        warm = [first_s]
        for _ in range(cfg.warmup - 1):
            start = time.perf_counter()
            comm.all_reduce(t)
            comm.sync()
            warm.append(time.perf_counter() - start)
        # Agree on the warm-up time (the slowest rank's, best iteration): it sizes the timed loop
        # the same way on every rank. The gather is also the barrier before the loop.
        agreed = comm.gather_floats([min(warm), wrong_first])
        per_iter = max(r[0] for r in agreed)
        iters = cfg.iters
        if size_budget is not None and per_iter > 0:
            iters = max(1, min(cfg.iters, int(size_budget / per_iter)))
        if gpu:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            import torch.distributed as dist
            begin.record()
            works = [dist.all_reduce(t, group=comm.pg, async_op=True) for _ in range(iters)]
            for w in works:  # makes this stream wait for NCCL's: `end` then follows the last all_reduce
                comm.wait(w)
            end.record()  # recorded before the waits, it would time the enqueueing, not the transfers
            end.synchronize()
            elapsed = begin.elapsed_time(end) / 1e3
        else:
            start = time.perf_counter()
            for _ in range(iters):
                comm.all_reduce(t)
            elapsed = time.perf_counter() - start
        wrong_last = 0
        extra = cfg.warmup - 1 + iters
        if final_exact(n, extra):
            wrong_last = count_wrong(t, expected * float(n) ** extra)
        agreed2 = comm.gather_floats([elapsed, wrong_last])
        seconds = max(r[0] for r in agreed2) / iters
        per_rank_wrong = [int(a[1] + b[1]) for a, b in zip(agreed, agreed2)]
        wrong = sum(per_rank_wrong)
        algbw, busbw = bandwidth(nbytes, seconds, n)
        entry = {"bytes": nbytes, "count": count, "type": "float", "redop": "sum",
                 "time_us": seconds * 1e6, "algbw_gbps": algbw, "busbw_gbps": busbw,
                 "correct": wrong == 0, "wrong": wrong,
                 "wrong_ranks": [comm.ranks[i] if comm.ranks else i for i, w in enumerate(per_rank_wrong) if w],
                 "iters": iters, "group": comm.label, "nranks": n}
        results.append(entry)
        if progress is not None:
            progress(entry)
    return results


def check_broadcast(comm: Comm, nbytes: int, root: int, iters: int = 3) -> dict[str, Any]:
    """Broadcast known values from group rank `root`; count wrong elements on every rank."""
    import torch
    import torch.distributed as dist
    count = nbytes // 4
    base = pattern(count, comm.device)
    src = base + float(root + 1)
    t = src.clone() if comm.rank == root else torch.full_like(src, -1.0)
    root_global = comm.ranks[root] if comm.ranks else root
    agreed, agreed2 = _checked_then_timed(
        comm, lambda: dist.broadcast(t, root_global, group=comm.pg, async_op=True),
        lambda: count_wrong(t, src), iters)
    return _entry("broadcast", nbytes, count, comm, agreed, agreed2, iters, root=root_global)


def check_all_gather(comm: Comm, nbytes: int, iters: int = 3) -> dict[str, Any]:
    """All-gather known per-rank values; `nbytes` is the size of the gathered output (as
    nccl-tests counts it). Counts wrong elements of every rank's chunk on every rank."""
    import torch
    import torch.distributed as dist
    n = comm.size
    count = max(1, nbytes // 4 // n)
    base = pattern(count, comm.device)
    mine = base + float(comm.rank + 1)
    out = [torch.full_like(mine, -1.0) for _ in range(n)]
    agreed, agreed2 = _checked_then_timed(
        comm, lambda: dist.all_gather(out, mine, group=comm.pg, async_op=True),
        lambda: sum(count_wrong(out[r], base + float(r + 1)) for r in range(n)), iters)
    return _entry("all_gather", count * 4 * n, count * n, comm, agreed, agreed2, iters)


def _checked_then_timed(comm: Comm, launch: Any, wrong: Any, iters: int
                        ) -> tuple[list[list[float]], list[list[float]]]:
    """Run the collective once and count its wrong elements, then time `iters` more; every rank's
    [0, wrong] and [elapsed, 0], gathered (each gather is also the barrier around the timed loop)."""
    comm.wait(launch())
    comm.sync()
    agreed = comm.gather_floats([0.0, wrong()])
    start = time.perf_counter()
    for _ in range(iters):
        comm.wait(launch())
    comm.sync()
    return agreed, comm.gather_floats([time.perf_counter() - start, 0.0])


def _entry(op: str, nbytes: int, count: int, comm: Comm, agreed: list[list[float]],
           agreed2: list[list[float]], iters: int, **extra: Any) -> dict[str, Any]:
    per_rank_wrong = [int(a[1]) for a in agreed]
    wrong = sum(per_rank_wrong)
    seconds = max(r[0] for r in agreed2) / iters
    algbw, busbw = bandwidth(nbytes, seconds, comm.size, op)
    return {"bytes": nbytes, "count": count, "type": "float", "time_us": seconds * 1e6,
            "algbw_gbps": algbw, "busbw_gbps": busbw, "correct": wrong == 0, "wrong": wrong,
            "wrong_ranks": [comm.ranks[i] if comm.ranks else i for i, w in enumerate(per_rank_wrong) if w],
            "iters": iters, "group": comm.label, "nranks": comm.size, **extra}
