"""Compact rank lists for messages: [0, 1, 2, 3, 7] -> "0-3, 7"."""
from __future__ import annotations

from typing import Iterable


def format_ranks(ranks: Iterable[int]) -> str:
    rs = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(parts)
