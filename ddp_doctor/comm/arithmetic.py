"""Sizes and exact arithmetic of the collective benchmarks (docs/facts.md, "Bandwidth"): byte sizes
(parse_bytes, format_bytes, sizes), the bandwidth formulas (busbw_factor, bandwidth), the exact
float32 sums (exact_sum, final_exact) and the per-rank fill patterns checked element by element
(pattern, fill_rank_values, count_wrong).

Values are chosen so that float32 sums are exact at any rank count: rank r holds
`((i + r) mod n) + 1` at element i, so every element of the sum is the integer n(n+1)/2 (exact
far below 2**24). A dropped or doubled contribution changes it.

torch is imported only inside the tensor functions: the command line reads the parsers.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
PATTERN_PERIOD = 16
_EXACT_LIMIT = float(1 << 24)    # float32 integers are exact below this
_FLOAT32_MAX_EXP = 127

BUSBW_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}



_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """`4096`, `4K`, `4KiB`, `64M`, `1G` -> bytes (K, M, G are powers of 1024). ValueError says
    what is wrong; ddp_doctor.cli.options.byte_size turns it into an argparse error."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size (e.g. 4096, 64K, 256M, 1G)")
    value = float(m.group(1)) * {"": 1, "k": KIB, "m": MIB, "g": GIB, "t": 1 << 40}[m.group(2).lower()]
    if value < 4:
        raise ValueError(f"{text!r} must be at least 4 bytes (one float32)")
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
    """nccl-tests' bus bandwidth factor: all_reduce 2(n-1)/n, all_gather (n-1)/n, broadcast 1.
    A group of one rank moves nothing over a link: 0, as nccl-tests counts it (its algbw is the
    speed of a local no-op or copy, which no link bounds)."""
    if n <= 1:
        return 0.0
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
