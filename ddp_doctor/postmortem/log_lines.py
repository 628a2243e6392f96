"""Whose line is it: the rank prefixes launchers and torch put on a job's console lines.

- torchrun `--tee`/`--redirects` into one console: `[default3]:` (the role, "default" unless the
  script's launcher named another, then the LOCAL rank);
- torch itself, on an uncaught exception once the process group exists: `[rank3]:` (the GLOBAL
  rank), also inside torchrun's prefix: `[default1]:[rank3]: Traceback ...`;
- Open MPI `--tag-output`: `[1,3]<stderr>:` (job, global rank, stream); SageMaker's MPI launch
  (smdistributed, `mpirun` from the toolkit): `[1,mpirank:3,algo-2]<stderr>:` (with the host);
- SLURM `srun --label`: `3: ` (the task, the global rank). A number and a colon also start many
  ordinary lines, so this one is taken only for a file that carries it on most of its lines
  (`srun_labelled`).

Pure functions over text; nothing here reads a file.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_TORCHRUN = re.compile(r"^\[(?P<role>[A-Za-z_][A-Za-z_-]*?)(?P<n>\d{1,9})\]:")
_TORCH_RANK = re.compile(r"^\[rank(?P<n>\d{1,9})\]:\s?")
_OMPI = re.compile(r"^\[(?P<job>\d{1,18}),(?P<n>\d{1,9})\]<(?P<stream>stdout|stderr|stddiag)>:\s?")
_SAGEMAKER_MPI = re.compile(r"^\[(?P<job>\d{1,18}),mpirank:(?P<n>\d{1,9}),(?P<host>[^\]]+)\]"
                            r"<(?P<stream>stdout|stderr)>:\s?")
_SRUN = re.compile(r"^\s*(?P<n>\d{1,6}): ")


@dataclass(frozen=True)
class Line:
    """One console line and whose it is: `rank` the global rank, `local_rank` torchrun's local
    rank (its `[default3]:` prefix), `host` when the prefix names one; all None for the launcher's
    own lines."""

    text: str
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None


def split_prefix(raw: str, *, srun_labelled: bool = False) -> Line:
    """The line without its rank prefixes, and the rank they name."""
    text = raw.rstrip("\r\n")
    rank = local = None
    host = None
    m = _SAGEMAKER_MPI.match(text)
    if m:
        rank, host, text = int(m.group("n")), m.group("host"), text[m.end():]
    elif (m := _OMPI.match(text)) is not None:
        rank, text = int(m.group("n")), text[m.end():]
    elif srun_labelled and (m := _SRUN.match(text)) is not None:
        rank, text = int(m.group("n")), text[m.end():]
    elif (m := _TORCHRUN.match(text)) is not None and m.group("role") != "rank":
        local, text = int(m.group("n")), text[m.end():]
    m = _TORCH_RANK.match(text)
    if m:
        rank, text = int(m.group("n")), text[m.end():]
    return Line(text=text, rank=rank, local_rank=local, host=host)


def srun_labelled(sample: list[str]) -> bool:
    """Whether a file's first lines carry srun's `--label` (most non-empty lines start `N: `)."""
    lines = [ln for ln in sample if ln.strip()]
    return len(lines) >= 3 and sum(1 for ln in lines if _SRUN.match(ln)) >= 0.8 * len(lines)


def has_rank_prefix(line: str) -> bool:
    """Whether a line carries one of the rank prefixes (srun's aside): tells a console log."""
    s = split_prefix(line)
    return s.rank is not None or s.local_rank is not None
