"""Collective benchmarks with the nccl-tests methodology (DOMAIN.md section 3), shared by the
`communication` checks of every preflight and by `ddp-doctor bench-comm`.

    sizes doubling from --comm-min-bytes to --comm-max-bytes
      per size: fill known per-rank values -> one all_reduce whose result is checked element by
                element (it is also the first warm-up) -> further warm-ups -> the timed loop ->
                the last result checked again where float32 holds it exactly
      time   = the slowest rank's loop (CPU: each rank times its loop between two small
               all_gathers and the maximum is taken; GPU: CUDA events around the loop)
      algbw  = bytes / time;  busbw = algbw x factor  (all_reduce 2(n-1)/n, all_gather (n-1)/n,
               broadcast 1)
      #wrong = elements that differ from the exact expected sum, over every rank

Values are chosen so that float32 sums are exact at any rank count: rank r holds
`((i + r) mod n) + 1` at element i, so every element of the sum is the integer n(n+1)/2 (exact
far below 2**24). A dropped or doubled contribution changes it.

The preflight runs a time-budgeted sweep (few timed iterations at the large sizes, sized from the
warm-up so that all timed loops together take about `--comm-budget` seconds); bench-comm runs the
full sweep. Every collective is bounded by the preflight timeout.

Nothing here imports torch at module level: the command line reads the defaults and parsers.
"""
from __future__ import annotations

import argparse
import math
import re
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Mapping, Sequence

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
DEFAULT_MIN_BYTES = 4 * KIB
DEFAULT_MAX_BYTES_CPU = 64 * MIB
DEFAULT_MAX_BYTES_GPU = 256 * MIB
# bench-comm: the full sweep
BENCH_ITERS, BENCH_WARMUP = 20, 5
# preflight: at most this many timed iterations per size, within a time budget for the timed
# loops of one sweep (the checked first result of each size is always taken)
PREFLIGHT_ITERS, PREFLIGHT_WARMUP = 5, 1
PREFLIGHT_BUDGET_S_CPU, PREFLIGHT_BUDGET_S_GPU = 0.25, 2.0
# Below this largest size a busbw figure says more about latency than about the links.
MIN_JUDGED_BYTES = 32 * MIB
DEFAULT_MIN_FRACTION = 0.5
DEFAULT_STRAGGLER_FACTOR = 1.5
DEFAULT_STRAGGLER_MIN_S = 0.010
DEFAULT_MAX_CLOCK_SKEW_S = 1.0
PATTERN_PERIOD = 16
_EXACT_LIMIT = float(1 << 24)    # float32 integers are exact below this
_FLOAT32_MAX_EXP = 127

BUSBW_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


# ---------------------------------------------------------------- sizes and arithmetic
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """`4096`, `4K`, `4KiB`, `64M`, `1G` -> bytes (K, M, G are powers of 1024)."""
    m = _SIZE.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 4096, 64K, 256M, 1G)")
    value = float(m.group(1)) * {"": 1, "k": KIB, "m": MIB, "g": GIB, "t": 1 << 40}[m.group(2).lower()]
    if value < 4:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 4 bytes (one float32)")
    return int(value)


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Sizes doubling from min_bytes (rounded down to whole float32s) up to max_bytes, which is
    always included."""
    lo, hi = max(4, min_bytes // 4 * 4), max(4, max_bytes // 4 * 4)
    if lo > hi:
        lo = hi
    out, s = [], lo
    while s < hi:
        out.append(s)
        s *= 2
    out.append(hi)
    return out


def busbw_factor(n: int, op: str = "all_reduce") -> float:
    """nccl-tests' bus bandwidth factor: all_reduce 2(n-1)/n, all_gather (n-1)/n, broadcast 1."""
    if n <= 1:
        return 1.0
    return BUSBW_FACTORS[op](n)


def bandwidth(nbytes: int, seconds: float, n: int, op: str = "all_reduce") -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s, as nccl-tests prints)."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * busbw_factor(n, op)


def exact_sum(n: int) -> float:
    """Every element of the exact all_reduce(sum) of the per-rank values: n(n+1)/2."""
    return float(n * (n + 1) // 2)


def final_exact(n: int, extra_ops: int) -> bool:
    """After the first all_reduce every rank holds x = n(n+1)/2 everywhere; each further one
    multiplies it by n (partial sums are m*x, m <= n). Is the result still exact in float32?"""
    if extra_ops <= 0 or n <= 1:
        return True
    bits = math.log2(exact_sum(n)) + extra_ops * math.log2(n)
    if n & (n - 1) == 0:  # a power of two only moves the exponent (x itself is exact)
        return bits < _FLOAT32_MAX_EXP - 1
    return bits < 24


# ---------------------------------------------------------------- tensors (torch imported lazily)
def pattern(count: int, device: str) -> Any:
    """(i % 16) as float32: element-dependent values for broadcast, all_gather and the ring."""
    import torch
    return (torch.arange(count, device=device, dtype=torch.int32) % PATTERN_PERIOD).to(torch.float32)


def fill_rank_values(t: Any, rank: int, n: int) -> Any:
    """Rank r's all_reduce values, written into t: ((i + r) mod n) + 1 at element i.

    Each rank's values vary along the tensor and differ from every other rank's, yet every
    element of the sum is the same exact integer n(n+1)/2: a dropped or doubled contribution
    changes it, and checking a result takes one min/max pass and no second tensor."""
    import torch
    width = n * max(1, -(-64 // n))  # a row of whole periods, >= 64 wide, copied along t
    row = ((torch.arange(width, device=t.device, dtype=torch.int64) + rank) % n + 1).to(t.dtype)
    k = t.numel() // width * width
    if k:
        body = t[:k].view(-1, width)
        body.copy_(row.expand_as(body))
    tail = t[k:]
    tail.copy_(row[: tail.numel()])
    return t


def count_wrong(result: Any, expected: Any) -> int:
    """Elements of `result` that differ from `expected` (a number, or a tensor of result's
    shape), NaN included: nccl-tests' #wrong. For a number, one min/max pass settles the usual
    all-correct case."""
    import torch
    if isinstance(expected, (int, float)):
        if result.numel() == 0:
            return 0
        lo, hi = torch.aminmax(result)
        if float(lo) == expected and float(hi) == expected:
            return 0
    return int(torch.ne(result, expected).sum().item())


# ---------------------------------------------------------------- configuration
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
        max_bytes=int(opt("comm_max_bytes", DEFAULT_MAX_BYTES_GPU if gpu else DEFAULT_MAX_BYTES_CPU)),
        iters=int(opt("comm_iters", BENCH_ITERS if bench else PREFLIGHT_ITERS)),
        warmup=max(1, int(opt("comm_warmup", BENCH_WARMUP if bench else PREFLIGHT_WARMUP))),
        budget_s=None if budget is None or budget <= 0 else float(budget))


# ---------------------------------------------------------------- bounded collectives
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
    """The Comm of a preflight's Group (ddp_doctor.preflight_run.group.Group)."""
    return Comm(rank=group.rank, size=group.world_size, device=group.device, timeout=group.timeout,
                ranks=list(range(group.world_size)))


# ---------------------------------------------------------------- the all_reduce sweep
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
            end.record()
            for w in works:
                comm.wait(w)
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


# ---------------------------------------------------------------- broadcast and all_gather
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


# ---------------------------------------------------------------- node layout and subgroups
def node_key(ctx: Any) -> int:
    """A number naming this rank's node: the launcher's node rank, else a hash of the host name."""
    import zlib
    if ctx.node_rank is not None:
        return int(ctx.node_rank)
    return zlib.crc32((ctx.host.hostname or "").encode()) & 0x7FFFFFFF


def layout(comm: Comm, ctx: Any) -> list[tuple[int, int]]:
    """(node key, local rank) of every rank, gathered (every rank sees the same list)."""
    local = ctx.local_rank if ctx.local_rank is not None else comm.rank
    return [(int(a), int(b)) for a, b in comm.gather_floats([node_key(ctx), local])]


def node_groups(lay: Sequence[tuple[int, int]]) -> tuple[list[list[int]], list[list[int]]]:
    """(intra-node groups: the ranks of each node; inter-node groups: the ranks that share a
    local rank, one per node), each sorted, in a fixed order every rank computes alike."""
    nodes: dict[int, list[int]] = {}
    locals_: dict[int, list[int]] = {}
    for r, (node, local) in enumerate(lay):
        nodes.setdefault(node, []).append(r)
        locals_.setdefault(local, []).append(r)
    intra = [nodes[k] for k in sorted(nodes, key=lambda k: min(nodes[k]))]
    inter = [locals_[k] for k in sorted(locals_)]
    return intra, inter


def split_comms(world: Comm, lay: Sequence[tuple[int, int]]) -> tuple[Comm | None, Comm | None]:
    """Create every intra- and inter-node group (new_group is collective over all ranks, so every
    rank creates every group in the same order) and return this rank's two (None where its
    group has a single rank)."""
    import torch.distributed as dist
    intra, inter = node_groups(lay)
    mine: dict[str, Comm | None] = {"intra-node": None, "inter-node": None}
    for label, groups in (("intra-node", intra), ("inter-node", inter)):
        for members in groups:
            pg = dist.new_group(members, timeout=timedelta(seconds=world.timeout))
            if world.rank in members and len(members) > 1:
                mine[label] = Comm(rank=members.index(world.rank), size=len(members), device=world.device,
                                   timeout=world.timeout, pg=pg, label=label, ranks=list(members))
    return mine["intra-node"], mine["inter-node"]


# ---------------------------------------------------------------- stragglers and clock skew
def fixed_work(device: str, reps: int = 3) -> list[float]:
    """Seconds for each of `reps` runs of the same fixed amount of compute (float32 matmuls):
    identical on every rank, so a rank that takes markedly longer is slower hardware, a busier
    host, or a throttled GPU."""
    import torch
    gpu = device.startswith("cuda")
    dim, loops = (4096, 8) if gpu else (256, 24)
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.rand(dim, dim, generator=g, device=device)
    b = torch.rand(dim, dim, generator=g, device=device)
    out = []
    for _ in range(reps):
        if gpu:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        c = a
        for _ in range(loops):
            c = torch.mm(a, b)
        if gpu:
            torch.cuda.synchronize(device)
        out.append(time.perf_counter() - start)
        del c
    return out


def ring_times(comm: Comm, nbytes: int = 256 * KIB, reps: int = 3) -> list[float]:
    """Seconds for each of `reps` rounds of a send/recv ring (every rank sends to rank + 1 and
    receives from rank - 1 at once): the time a rank waits for its receive measures the link
    from its left neighbour. The payload is checked; a corrupted one raises."""
    import torch
    import torch.distributed as dist
    n, r = comm.size, comm.rank
    count = nbytes // 4
    send = pattern(count, comm.device) + float(r + 1)
    recv = torch.empty_like(send)
    left = (r - 1) % n
    want = send - float(r + 1) + float(left + 1)
    out = []
    for _ in range(reps):
        comm.wait(_barrier(comm))
        start = time.perf_counter()
        ops = [dist.P2POp(dist.isend, send, comm.ranks[(r + 1) % n] if comm.ranks else (r + 1) % n, comm.pg),
               dist.P2POp(dist.irecv, recv, comm.ranks[left] if comm.ranks else left, comm.pg)]
        for w in dist.batch_isend_irecv(ops):
            comm.wait(w)
        comm.sync()
        out.append(time.perf_counter() - start)
    if count_wrong(recv, want):
        raise RuntimeError(f"the send/recv ring delivered wrong data from rank {left} to rank {r}")
    return out


def _barrier(comm: Comm) -> Any:
    import torch.distributed as dist
    if comm.device.startswith("cuda"):
        import torch
        t = torch.zeros(1, device=comm.device)
        return dist.all_reduce(t, group=comm.pg, async_op=True)
    return dist.barrier(group=comm.pg, async_op=True)


def _median(vals: Sequence[float]) -> float:
    v = sorted(vals)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def outliers(times: Mapping[Any, float], factor: float = DEFAULT_STRAGGLER_FACTOR,
             min_excess_s: float = DEFAULT_STRAGGLER_MIN_S) -> dict[Any, float]:
    """Entries markedly slower than the median of the others: above factor x that median AND
    more than min_excess_s above it (so scheduling noise on small machines does not count).
    The median leaves the entry itself out, so that with two ranks a slow one is compared with
    the other, not with an average it pulls up. Returns {key: ratio to that median}."""
    if len(times) < 2:
        return {}
    out = {}
    for k, v in times.items():
        median = _median([t for j, t in times.items() if j != k])
        if v > factor * median and v - median > min_excess_s:
            out[k] = v / median if median > 0 else float("inf")
    return out


def slow_nodes(times: Mapping[int, float], node_of: Mapping[int, Any], factor: float = DEFAULT_STRAGGLER_FACTOR,
               min_excess_s: float = DEFAULT_STRAGGLER_MIN_S) -> dict[Any, float]:
    """Nodes whose median rank time is markedly slower than the median node (needs >= 2 nodes)."""
    by_node: dict[Any, list[float]] = {}
    for r, t in times.items():
        by_node.setdefault(node_of.get(r), []).append(t)
    if len(by_node) < 2:
        return {}
    med = {k: sorted(v)[len(v) // 2] for k, v in by_node.items()}
    return outliers(med, factor, min_excess_s)


def clock_offsets(samples: Mapping[int, Sequence[tuple[float, float]]], ref: int = 0) -> dict[int, tuple[float, float]]:
    """Each rank's wall-clock offset from rank `ref`, with its uncertainty.

    samples[r][i] = (time.time() right after barrier i, that barrier's duration on rank r). All
    ranks leave barrier i after the last one arrived; each leaves within its own wait of that
    instant, so two readings differ from the clock offset by at most the longer of the two
    waits. The round with the smallest uncertainty is used."""
    out = {}
    base = samples[ref]
    for r, rows in samples.items():
        best: tuple[float, float] | None = None
        for (wall, dur), (wall0, dur0) in zip(rows, base):
            cand = (wall - wall0, max(dur, dur0))
            if best is None or cand[1] < best[1]:
                best = cand
        if best is not None:
            out[r] = best
    return out


def skewed(offsets: Mapping[int, tuple[float, float]], max_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S
           ) -> dict[int, tuple[float, float]]:
    """Ranks whose clock is off by more than max_skew_s beyond doubt (|offset| - uncertainty)."""
    return {r: (o, u) for r, (o, u) in offsets.items() if abs(o) - u > max_skew_s}


# ---------------------------------------------------------------- expected bandwidth
# Healthy all_reduce busbw (GB/s) at large sizes with NCCL, per instance type: (intra-node,
# inter-node). Derived from the instance's links (DOMAIN.md section 1) and published nccl-tests
# figures for the same GPUs and fabrics; every row is unverified on AWS hardware by this project
# (no GPU machine was at hand) - they are deliberately conservative, and the warning fires only
# below --comm-min-fraction (default 0.5) of them.
EXPECTED_BUSBW_GBPS: dict[str, tuple[float, float]] = {
    "p3.16xlarge": (120.0, 2.5),     # unverified: V100 NVLink hybrid cube mesh; 25 Gbps TCP
    "p3dn.24xlarge": (120.0, 10.0),  # unverified: V100 NVLink; 100 Gbps, 1 EFA device
    "p4d.24xlarge": (220.0, 40.0),   # unverified: A100 NVSwitch; 400 Gbps EFA, GPUDirect RDMA
    "p4de.24xlarge": (220.0, 40.0),  # unverified: as p4d (NVSwitch per DOMAIN.md is unverified)
    "p5.48xlarge": (450.0, 300.0),   # unverified: H100 NVSwitch; 3200 Gbps EFA (both unverified)
    "g5.48xlarge": (10.0, 10.0),     # unverified: A10G over PCIe (no NVLink); 100 Gbps
}
PCIE_ONLY = {"g5.48xlarge"}


def expected_busbw(instance_type: str | None, scope: str) -> float | None:
    """The busbw a healthy instance reaches for scope "intra-node" or "inter-node", or None."""
    if not instance_type:
        return None
    key = instance_type.strip().lower()
    key = key[3:] if key.startswith("ml.") else key
    row = EXPECTED_BUSBW_GBPS.get(key)
    if row is None:
        return None
    return row[0] if scope == "intra-node" else row[1]


def likely_causes(scope: str, env: Mapping[str, str], instance_type: str | None) -> list[str]:
    """What usually makes a healthy instance's busbw low, quoting the settings seen."""
    def seen(name: str) -> str:
        return f"{name}={env[name]}" if name in env else f"{name} unset"
    key = (instance_type or "").lower().removeprefix("ml.")
    if scope == "intra-node":
        causes = [f"peer-to-peer disabled ({seen('NCCL_P2P_DISABLE')}, {seen('NCCL_P2P_LEVEL')})",
                  "a PCIe-only path between the GPUs (check `nvidia-smi topo -m` for NV# links)"
                  + (" - this instance type has no NVLink" if key in PCIE_ONLY else ""),
                  "GPUs throttled or shared with other processes (`nvidia-smi -q -d PERFORMANCE`)"]
        if env.get("NCCL_SHM_DISABLE"):
            causes.append(seen("NCCL_SHM_DISABLE"))
        return causes
    return [f"EFA not in use: {seen('FI_PROVIDER')} (EFA instances need FI_PROVIDER=efa and the "
            "aws-ofi-nccl plugin; with NCCL_DEBUG=INFO NCCL must log `NET/OFI`, not `NET/Socket`)",
            f"{seen('NCCL_SOCKET_IFNAME')}: the interface must be the instance's network interface",
            f"{seen('NCCL_IB_DISABLE')}, {seen('NCCL_NET')}",
            "a security group or subnet that routes node-to-node traffic the slow way"]


# ---------------------------------------------------------------- the nccl-tests table
TABLE_HEADER = (f"{'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'time(us)':>11} "
                f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'#wrong':>7}")


def table_row(e: Mapping[str, Any]) -> str:
    return (f"{e['bytes']:>12} {e.get('count', e['bytes'] // 4):>12} {e.get('type', 'float'):>6} "
            f"{e.get('redop', 'sum'):>6} {e['time_us']:>11.1f} {e['algbw_gbps']:>12.3f} "
            f"{e['busbw_gbps']:>12.3f} {e.get('wrong', 0 if e.get('correct') else 'N/A'):>7}")


def render_table(measurements: Mapping[str, Any]) -> str:
    """The all_reduce sweeps of a report as nccl-tests prints them, one block per group."""
    lines = []
    for name, title in (("all_reduce", "all_reduce, all ranks"), ("all_reduce_intra", "all_reduce, intra-node"),
                        ("all_reduce_inter", "all_reduce, inter-node")):
        entries = measurements.get(name) or []
        if not entries:
            continue
        n = entries[0].get("nranks", "?")
        lines.append(f"# {title} ({n} ranks per group)")
        lines.append(TABLE_HEADER)
        lines += [table_row(e) for e in entries]
        big = max(entries, key=lambda e: e["bytes"])
        wrong = sum(int(e.get("wrong", 0) or 0) for e in entries)
        lines.append(f"# busbw at {format_bytes(big['bytes'])}: {big['busbw_gbps']:.3f} GB/s; "
                     f"out of bounds values: {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    return "\n".join(lines)


def plot(measurements: Mapping[str, Any], path: str, title: str = "ddp-doctor bench-comm") -> None:
    """A bandwidth-vs-size PNG (log-scale x): busbw and algbw for each all_reduce sweep."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'ddp-doctor[plot]' "
                           "(or pip install matplotlib)") from None
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    drawn = False
    for name, label in (("all_reduce", "all ranks"), ("all_reduce_intra", "intra-node"),
                        ("all_reduce_inter", "inter-node")):
        entries = measurements.get(name) or []
        if not entries:
            continue
        xs = [e["bytes"] for e in entries]
        line, = ax.plot(xs, [e["busbw_gbps"] for e in entries], marker="o", label=f"busbw, {label}")
        ax.plot(xs, [e["algbw_gbps"] for e in entries], marker=".", linestyle="--", color=line.get_color(),
                alpha=0.6, label=f"algbw, {label}")
        bad = [e for e in entries if not e.get("correct", True)]
        if bad:
            ax.scatter([e["bytes"] for e in bad], [e["busbw_gbps"] for e in bad], marker="x", color="red",
                       s=80, zorder=5, label="wrong result")
        drawn = True
    if not drawn:
        plt.close(fig)
        raise RuntimeError("the report has no all_reduce measurements to plot")
    ax.set_xscale("log", base=2)
    ticks = [e["bytes"] for e in (measurements.get("all_reduce") or measurements.get("all_reduce_intra")
                                   or measurements.get("all_reduce_inter") or [])]
    ax.set_xticks(ticks)
    ax.set_xticklabels([format_bytes(b).replace(" ", "") for b in ticks], rotation=45, ha="right")
    ax.minorticks_off()
    ax.set_xlabel("message size")
    ax.set_ylabel("bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---------------------------------------------------------------- command-line options
def add_preflight_options(p: argparse.ArgumentParser) -> None:
    """The communication suite's preflight options (they reach the checks as ctx.options)."""
    from ddp_doctor.cli.app import _positive_int  # the CLI's own validators: one definition
    g = p.add_argument_group("communication checks")
    g.add_argument("--comm-min-bytes", type=parse_bytes, default=None, metavar="SIZE",
                   help=f"smallest all_reduce size of the sweep (default: {format_bytes(DEFAULT_MIN_BYTES)})")
    g.add_argument("--comm-max-bytes", type=parse_bytes, default=None, metavar="SIZE",
                   help=f"largest all_reduce size (default: {format_bytes(DEFAULT_MAX_BYTES_GPU)} on GPU, "
                        f"{format_bytes(DEFAULT_MAX_BYTES_CPU)} on CPU)")
    g.add_argument("--comm-iters", type=_positive_int, default=None, metavar="N",
                   help=f"at most N timed iterations per size (default: {PREFLIGHT_ITERS} in a preflight, "
                        f"{BENCH_ITERS} in bench-comm)")
    g.add_argument("--comm-budget", type=float, default=None, metavar="S",
                   help=f"seconds the timed loops of one preflight sweep may take together; fewer "
                        f"iterations at large sizes keep within it; 0 for none (default: "
                        f"{PREFLIGHT_BUDGET_S_CPU:g} on CPU, {PREFLIGHT_BUDGET_S_GPU:g} on GPU)")
    g.add_argument("--comm-min-fraction", type=float, default=None, metavar="F",
                   help=f"warn when busbw at the largest size is below F x what the instance type "
                        f"reaches (default: {DEFAULT_MIN_FRACTION})")
    g.add_argument("--instance-type", default=None, metavar="TYPE",
                   help="instance type for the expected bandwidth, e.g. ml.p4d.24xlarge "
                        "(default: SageMaker's SM_CURRENT_INSTANCE_TYPE / resourceconfig.json)")
    g.add_argument("--straggler-factor", type=float, default=None, metavar="X",
                   help=f"a rank or link slower than X x the median is named (default: {DEFAULT_STRAGGLER_FACTOR})")
    g.add_argument("--straggler-min-ms", type=float, default=None, metavar="MS",
                   help=f"... and only when it is more than MS ms slower (default: {DEFAULT_STRAGGLER_MIN_S * 1e3:g})")
    g.add_argument("--max-clock-skew", type=float, default=None, metavar="S",
                   help=f"warn when node clocks differ by more than S seconds (default: {DEFAULT_MAX_CLOCK_SKEW_S:g})")


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """ctx.options keys of the communication suite, from parsed preflight or bench-comm options
    (absent or unset options are left out, so each check falls back to its default)."""
    pairs = {
        "comm_min_bytes": getattr(args, "comm_min_bytes", None) or getattr(args, "min_bytes", None),
        "comm_max_bytes": getattr(args, "comm_max_bytes", None) or getattr(args, "max_bytes", None),
        "comm_iters": getattr(args, "comm_iters", None) or getattr(args, "iters", None),
        "comm_warmup": getattr(args, "warmup", None),
        "comm_budget_s": getattr(args, "comm_budget", None),
        "comm_min_fraction": getattr(args, "comm_min_fraction", None),
        "instance_type": getattr(args, "instance_type", None),
        "straggler_factor": getattr(args, "straggler_factor", None),
        "straggler_min_s": (None if getattr(args, "straggler_min_ms", None) is None
                            else args.straggler_min_ms / 1e3),
        "max_clock_skew_s": getattr(args, "max_clock_skew", None),
    }
    return {k: v for k, v in pairs.items() if v is not None}
