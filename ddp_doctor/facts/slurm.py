"""What SLURM says of the job around this process: its nodes (SLURM_JOB_NODELIST, in SLURM's
compressed host list form `node[01-04,07],gpu-a1`), this node (SLURMD_NODENAME), and the step's
tasks (SLURM_STEP_NUM_TASKS, SLURM_STEP_NUM_NODES), as srun and sbatch set them. Pure functions
over an environment mapping; nothing here raises.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from ddp_doctor.facts.env_values import as_int, env_int

MAX_HOSTS = 65536  # a host list expands to at most this many names (more is not believed)
_RANGE = re.compile(r"^(\d{1,9})(?:-(\d{1,9}))?$")


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    nodes: tuple[str, ...] | None   # SLURM_JOB_NODELIST expanded; None when it cannot be read
    node_list: str                  # as SLURM wrote it
    this_node: str | None           # SLURMD_NODENAME (inside a step or a batch script)
    step_tasks: int | None          # SLURM_STEP_NUM_TASKS, else SLURM_NTASKS (srun's tasks)
    step_nodes: int | None          # SLURM_STEP_NUM_NODES, else SLURM_NNODES


def expand_hostlist(text: str, limit: int = MAX_HOSTS) -> list[str] | None:
    """`node[01-03,7],login1` -> ["node01", "node02", "node03", "node7", "login1"], zero padding
    kept; None when the text is not a host list or names more than `limit` hosts."""
    out: list[str] = []
    for part in _top_level(text.strip()):
        names = _expand_one(part, limit - len(out))
        if names is None:
            return None
        out += names
    return out or None


def _top_level(text: str) -> list[str]:
    """The comma-separated entries outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in (x.strip() for x in parts) if p]


def _expand_one(part: str, room: int) -> list[str] | None:
    m = re.match(r"^([^\[\]]*)\[([^\[\]]+)\](.*)$", part)
    if not m:
        return [part] if "[" not in part and "]" not in part and room > 0 else None
    prefix, ranges, rest = m.groups()
    tails = _expand_one(rest, room) if rest else [""]
    if tails is None:
        return None
    out: list[str] = []
    for r in ranges.split(","):
        rm = _RANGE.match(r.strip())
        if not rm:
            return None
        lo, hi = rm.group(1), rm.group(2) or rm.group(1)
        if int(hi) < int(lo) or (int(hi) - int(lo) + 1) * len(tails) > room - len(out):
            return None
        out += [f"{prefix}{n:0{len(lo)}d}{t}" for n in range(int(lo), int(hi) + 1) for t in tails]
    return out


def read(env: Mapping[str, str]) -> SlurmJob | None:
    """The job's view, or None outside a SLURM job (no SLURM_JOB_ID)."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job:
        return None
    raw = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    tasks = as_int(env_int(env, "SLURM_STEP_NUM_TASKS"))
    nodes = as_int(env_int(env, "SLURM_STEP_NUM_NODES"))
    return SlurmJob(job_id=job, nodes=tuple(expand_hostlist(raw) or ()) or None, node_list=raw,
                    this_node=env.get("SLURMD_NODENAME") or None,
                    step_tasks=tasks if tasks is not None else as_int(env_int(env, "SLURM_NTASKS")),
                    step_nodes=nodes if nodes is not None else as_int(env_int(env, "SLURM_NNODES")))
