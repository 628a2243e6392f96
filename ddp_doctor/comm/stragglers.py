"""Stragglers and clock skew: fixed compute per rank (fixed_work), a timed send/recv ring
(ring_times), the ranks and nodes markedly slower than the median (outliers, slow_nodes), the
ranks slower beyond doubt over rounds of a measurement (slow_ranks: a sign test and the run's own
noise), and node clock offsets from barrier timestamps (clock_offsets, skewed).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from math import comb
from typing import Any, Mapping, Sequence

from ddp_doctor.comm.arithmetic import KIB, count_wrong, pattern
from ddp_doctor.comm.sweep import Comm

DEFAULT_STRAGGLER_FACTOR = 1.5
DEFAULT_STRAGGLER_MIN_S = 0.010
DEFAULT_MAX_CLOCK_SKEW_S = 1.0
ROUNDS = 12  # rounds of a straggler measurement: 11 slower of 12 is a sign test's p of 0.003
MIN_ROUNDS = 8  # fewer rounds than this decide nothing (a sign test's p cannot go below 0.004)
ALPHA = 0.01  # the sign test's level, shared by the ranks judged (Bonferroni)
NOISE_TIMES = 3.0  # the excess must be this many times the run's own spread (1.4826 x MAD)


def fixed_work(device: str, reps: int = 3) -> list[float]:
    """Seconds for each of `reps` runs of the same fixed amount of compute (float32 matmuls):
    identical on every rank, so a rank that takes markedly longer is slower hardware, a busier
    host, or a throttled GPU."""
    import torch
    gpu = device.startswith("cuda")
    # about 25 ms a run on one CPU thread: a rank 2x slower is then 25 ms behind, past the 10 ms floor
    dim, loops = (4096, 8) if gpu else (256, 60)
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


def rounds_for(world: int, alpha: float = ALPHA) -> int:
    """Rounds enough for slow_ranks to name a rank slower in all but one of them among `world`
    ranks (12 for 2 ranks, 14 for 8, 22 for a thousand)."""
    n = ROUNDS
    while sign_test_p(n - 1, n) > alpha / max(world, 1) and n < 64:
        n += 1
    return n


def fixed_work_rounds(comm: Comm, rounds: int = ROUNDS, alpha: float = ALPHA) -> list[float]:
    """Seconds of one run of the fixed work in each of up to `rounds` rounds, every round started
    together: the ranks are compared round by round, under the same moment's load. Every rank's
    time of a round is gathered after it (the gather is also the start of the next round), and the
    rounds stop as soon as slow_ranks could name no rank whatever the rounds left measured
    (nobody_can_be_named): a healthy job stops after about a third of them, a straggler's job
    measures them all."""
    out: list[float] = []
    seen: dict[int, list[float]] = {r: [] for r in range(comm.size)}
    comm.wait(barrier(comm))
    for _ in range(rounds):
        out += fixed_work(comm.device, reps=1)
        for r, got in enumerate(comm.gather_floats(out[-1:])):  # the same on every rank: one decision
            seen[r].append(got[0])
        if nobody_can_be_named(seen, rounds, alpha):
            break
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
        comm.wait(barrier(comm))
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


def barrier(comm: Comm) -> Any:
    """An async barrier on `comm`'s group (on GPU a one-element all_reduce, which NCCL orders with
    the timed work on the stream); wait on it with comm.wait."""
    import torch.distributed as dist
    if comm.device.startswith("cuda"):
        import torch
        t = torch.zeros(1, device=comm.device)
        return dist.all_reduce(t, group=comm.pg, async_op=True)
    return dist.barrier(group=comm.pg, async_op=True)


def median(vals: Sequence[float]) -> float:
    """The median of `vals` (mean of the middle two for an even count)."""
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
        mid = median([t for j, t in times.items() if j != k])
        if v > factor * mid and v - mid > min_excess_s:
            out[k] = v / mid if mid > 0 else float("inf")
    return out


@dataclass(frozen=True)
class Slow:
    """A rank slower beyond doubt: its median round over the others' median (`ratio`), by
    `excess_s`; slower than the others in `slower` of `rounds` rounds (a one-sided sign test's `p`);
    the others' own spread from round to round, `noise_s`."""
    ratio: float
    excess_s: float
    slower: int
    rounds: int
    p: float
    noise_s: float

    def to_dict(self) -> dict[str, float]:
        return {"ratio": round(self.ratio, 3), "excess_s": round(self.excess_s, 6), "slower_rounds": self.slower,
                "rounds": self.rounds, "p": round(self.p, 6), "noise_s": round(self.noise_s, 6)}


def sign_test_p(wins: int, n: int) -> float:
    """P(X >= wins) for X ~ Binomial(n, 1/2): how often `wins` of `n` rounds or more happen by chance."""
    return sum(comb(n, k) for k in range(max(0, wins), n + 1)) / 2 ** n if n > 0 else 1.0


def spread(vals: Sequence[float]) -> float:
    """1.4826 x the median absolute deviation: a standard deviation that one burst does not move."""
    if not vals:
        return 0.0
    mid = median(vals)
    return 1.4826 * median([abs(v - mid) for v in vals])


def wins_needed(n: int, entries: int, alpha: float = ALPHA) -> int:
    """The fewest of `n` rounds a rank must be slower in for slow_ranks's sign test among `entries`
    ranks (n + 1: none is enough)."""
    return next((w for w in range(n + 1) if sign_test_p(w, n) <= alpha / max(entries, 1)), n + 1)


def nobody_can_be_named(rounds: Mapping[Any, Sequence[float]], n: int, alpha: float = ALPHA) -> bool:
    """Whether slow_ranks over `n` rounds can name no rank, whatever the rounds not yet measured
    hold, given the first `rounds` (the same count for every rank): every rank was no slower than
    the others' median in more of them than the sign test allows (its other conditions come on top
    of that one, so its verdict is then known)."""
    keys = [k for k, v in rounds.items() if v]
    if len(keys) < 2:
        return False
    m = min(len(rounds[k]) for k in keys)
    need = wins_needed(n, len(keys), alpha)
    for k in keys:
        others = [j for j in keys if j != k]
        not_slower = sum(1 for i in range(m) if rounds[k][i] <= median([rounds[j][i] for j in others]))
        if n - not_slower >= need:
            return False
    return True


def slow_ranks(rounds: Mapping[Any, Sequence[float]], factor: float = DEFAULT_STRAGGLER_FACTOR,
               min_excess_s: float = DEFAULT_STRAGGLER_MIN_S, alpha: float = ALPHA) -> dict[Any, Slow]:
    """The entries (ranks) slower than the others beyond doubt, from the same rounds measured on
    each: a rank is named when all of these hold
    - its median round is above `factor` x the others' median, and `min_excess_s` more;
    - that excess is above NOISE_TIMES x the others' own spread from round to round;
    - it is slower than the others' median in so many rounds that chance would do so with a
      probability below `alpha` / the number of entries (a one-sided sign test, Bonferroni);
    - at least MIN_ROUNDS rounds were measured.
    A burst of load in a few rounds moves neither the medians nor the count of rounds."""
    keys = [k for k, v in rounds.items() if v]
    n = min((len(rounds[k]) for k in keys), default=0)
    if len(keys) < 2 or n < MIN_ROUNDS:
        return {}
    out = {}
    for k in keys:
        others = [j for j in keys if j != k]
        mine = list(rounds[k])[:n]
        mid = median([median(list(rounds[j])[:n]) for j in others])
        own = median(mine)
        noise = median([spread(list(rounds[j])[:n]) for j in others])
        slower = sum(1 for i in range(n) if mine[i] > median([rounds[j][i] for j in others]))
        p = sign_test_p(slower, n)
        excess = own - mid
        if (own > factor * mid and excess > min_excess_s and excess > NOISE_TIMES * noise
                and p <= alpha / len(keys)):
            out[k] = Slow(own / mid if mid > 0 else float("inf"), excess, slower, n, p, noise)
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
