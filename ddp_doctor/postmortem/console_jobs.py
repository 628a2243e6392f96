"""Consoles of several jobs among the inputs: kept apart before anything is read.

A console names whose each line is (its rank prefixes), not which job it belongs to: two runs of
one script saved in one directory (`job.log` and `job-retry.log`) both hold `[default0]:` and
`[default1]:` lines, and read together they would make one rank out of two processes. Consoles
are of different jobs when they hold the same rank's output and that output differs (its first
lines, or the pid torchrun's summary gives the rank): the newest console (by modification time)
is read with those that agree with it; the others are left out and named (DDP954). Consoles
of one job's nodes hold different ranks (global prefixes), or the same local ranks on hosts
their lines or summaries name apart: they agree. A console copied twice agrees with itself.

A console's digest is read from two bounded parts: its first HEAD bytes (each rank's first lines) and its last
TAIL bytes (torchrun's summary), so a large console costs two short reads."""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field

from ddp_doctor.postmortem.log_lines import split_prefix, srun_labelled

HEAD = 64 << 10
TAIL = 64 << 10
LINES_PER_RANK = 50  # of a rank's first lines, compared
# torchrun's summary block: "host : algo-1", "rank : 3 (local_rank: 1)", "exitcode : 1 (pid: 4242)"
_SUMMARY = re.compile(r"^\s+host\s*:\s*(?P<host>\S+)\s*\n\s+rank\s*:\s*(?P<rank>\d+) \(local_rank: (?P<local>\d+)\)"
                      r"\s*\n\s+exitcode\s*:\s*-?\d+ \(pid: (?P<pid>\d+)\)", re.M)


@dataclass
class ConsoleDigest:
    """What a console says of whose output it holds, in digests of each rank's first lines."""

    path: str
    mtime: float
    lines: dict[tuple, str] = field(default_factory=dict)  # ("rank", R) / ("local", L) -> digest of its first lines
    pids: dict[tuple, int] = field(default_factory=dict)  # the same keys -> the pid torchrun's summary gives
    hosts: set[str] = field(default_factory=set)  # hosts its lines or its summary name


def digest(path: str) -> ConsoleDigest | None:
    """What a console says of whose output it holds; None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(HEAD)
            tail = b""
            if size > HEAD:
                f.seek(max(HEAD, size - TAIL))
                tail = f.read(TAIL)
            mtime = os.fstat(f.fileno()).st_mtime
    except OSError:
        return None
    out = ConsoleDigest(path, mtime)
    text = head.decode("utf-8", errors="replace")
    lines = text.splitlines()
    if size > HEAD and lines:
        lines.pop()  # cut in the middle
    labelled = srun_labelled(lines[:50])
    kept: dict[tuple, list[str]] = {}
    for raw in lines:
        line = split_prefix(raw, srun_labelled=labelled)
        key = ("rank", line.rank) if line.rank is not None else ("local", line.local_rank) \
            if line.local_rank is not None else None
        if key is None:
            continue
        if line.host:
            out.hosts.add(line.host)
        got = kept.setdefault(key, [])
        if len(got) < LINES_PER_RANK:
            got.append(line.text)
    out.lines = {k: hashlib.sha256("\n".join(v).encode()).hexdigest() for k, v in kept.items()}
    for m in _SUMMARY.finditer(text + "\n" + tail.decode("utf-8", errors="replace")):
        out.hosts.add(m["host"])
        out.pids[("rank", int(m["rank"]))] = int(m["pid"])
        out.pids[("local", int(m["local"]))] = int(m["pid"])
    return out


def _differ(a: ConsoleDigest, b: ConsoleDigest) -> bool:
    """Whether the two consoles hold different processes' output for one rank."""
    apart = bool(a.hosts) and bool(b.hosts) and not (a.hosts & b.hosts)  # two nodes of one job
    for key in (set(a.lines) & set(b.lines)) | (set(a.pids) & set(b.pids)):
        if key[0] == "local" and apart:
            continue
        if key in a.lines and key in b.lines and a.lines[key] != b.lines[key]:
            return True
        if key in a.pids and key in b.pids and a.pids[key] != b.pids[key]:
            return True
    return False


def one_job(digests: list[ConsoleDigest]) -> tuple[list[str], list[str], dict[str, str]]:
    """(the consoles read: the newest and those that agree with it; the consoles of other jobs,
    left out; copies of a console read, path -> the console it copies: read once)."""
    kept: list[ConsoleDigest] = []
    left: list[str] = []
    copies: dict[str, str] = {}
    for v in sorted(digests, key=lambda v: (-v.mtime, v.path)):
        same = next((k for k in kept if v.lines and v.lines == k.lines and v.pids == k.pids), None)
        if same is not None:
            copies[v.path] = same.path
        elif any(_differ(v, k) for k in kept):
            left.append(v.path)
        else:
            kept.append(v)
    return [v.path for v in kept], sorted(left), copies
