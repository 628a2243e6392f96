"""The launch directory: where the preflight's ranks, started by a ddp-doctor parent, leave their
files, and how the parent reads them back into one report.

The parent (`ddp-doctor preflight`'s local launch; `ddp-doctor run`'s parent, whose run directory
holds it as preflight/) makes it private and names it to the ranks in DDP_DOCTOR_LAUNCH_DIR. In it:

    rank-N.json   rank N's findings, view and timeline ("final" once its preflight ended; "verdict":
                  the job's, as a rank that is not the reporting one read it)
    report.json   the merged report, from the reporting rank (report/publish.py, deliver)
    stage-N.json  the stage rank N is in now, for the parent's progress line (note_stage)
    nccl-debug.*  NCCL's INFO log of each process (facts/efa.py, nccl_log_env; DDP335 reads it)

The parent merges them (merge_launch_dir): the reporting rank's report, plus what the ranks that
never joined it left behind, and a finding for each rank that left nothing. On a node without the
reporting rank (a pod of several), the job's root cause as its ranks read it stands with their
own findings.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Any

from ddp_doctor.checks import internal as events
from ddp_doctor.findings import Finding
from ddp_doctor.report import build as reportlib
from ddp_doctor.report.sinks import LAUNCH_REPORT_FILE

LAUNCH_DIR_ENV = "DDP_DOCTOR_LAUNCH_DIR"
LAUNCHED_AT_ENV = "DDP_DOCTOR_LAUNCHED_AT"  # Unix time a ddp-doctor parent started the launcher
RANK_FILE = "rank-{}.json"  # {} is the rank
REPORT_FILE = LAUNCH_REPORT_FILE
STAGE_FILE = "stage-{}.json"


def rank_path(launch_dir: str, rank: int) -> str:
    return os.path.join(launch_dir, RANK_FILE.format(rank))


def report_path(launch_dir: str) -> str:
    return os.path.join(launch_dir, REPORT_FILE)


def read_by_rank(pattern: str) -> dict[int, dict[str, Any]]:
    """rank -> the JSON record of each file that matches the glob `pattern` (each holds its "rank"); a
    file that cannot be read (half written, damaged) is skipped."""
    out: dict[int, dict[str, Any]] = {}
    for p in glob.glob(pattern):
        try:
            with open(p, encoding="utf-8") as f:
                d = json.load(f)
            out[int(d["rank"])] = d
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def merge_launch_dir(tmp: str, nproc: int, rc: int | None, timed_out: bool, bound: float,
                     expected: list[int] | None = None, world: dict[str, Any] | None = None) -> dict[str, Any]:
    """The reporting rank's report, plus what ranks that never joined it left behind. `expected`:
    the ranks started here (default 0..nproc-1; on one node of several, that node's ranks).
    `world`: the report's world when the reporting rank's report is not here (another node's)."""
    merged: dict[str, Any] | None = None
    try:
        with open(report_path(tmp), encoding="utf-8") as f:
            merged = json.load(f)
    except (OSError, ValueError):
        merged = None
    partials = read_by_rank(os.path.join(tmp, RANK_FILE.format("*")))
    findings: list[Finding] = reportlib.findings_of(merged) if merged else []
    ranks: list[dict[str, Any]] = list(merged["ranks"]) if merged else []
    covered = {r["rank"] for r in ranks}
    for r, d in sorted(partials.items()):
        if r in covered:
            continue
        findings += [Finding.from_dict(x) for x in d.get("findings", [])]
        if d.get("view"):
            ranks.append(reportlib.rank_entry(d["view"]))
    if merged is None:  # the reporting rank is on another node: the job's root cause, as read here
        causes = [d["verdict"]["root_cause"] for _, d in sorted(partials.items())
                  if isinstance(d.get("verdict"), dict) and isinstance(d["verdict"].get("root_cause"), dict)]
        if causes and not any(f.id == causes[0].get("id") and f.ranks == causes[0].get("ranks") for f in findings):
            findings.append(Finding.from_dict(causes[0]))
    reported = covered | {r for r, d in partials.items() if d.get("final")}
    for r in (expected if expected is not None else range(nproc)):
        if r not in reported:
            findings.append(events.launched_rank_lost(r, rc, timed_out=timed_out, bound=bound))
    world = dict(merged["world"]) if merged else dict(world or {
        "launcher": "torchrun", "backend": None, "world_size": nproc, "nnodes": 1,
        "nproc_per_node": nproc, "master_addr": None, "master_port": None})
    if world.get("backend") is None:  # another node's report holds it: this node's ranks say it too
        world["backend"] = next((d["view"].get("backend") for _, d in sorted(partials.items())
                                 if isinstance(d.get("view"), dict) and d["view"].get("backend")), None)
    world["launched_by"] = "ddp-doctor"
    return reportlib.build_report(world=world, ranks=ranks, findings=findings,
                                  measurements=(merged or {}).get("measurements") or {})


def launch_timelines(tmp: str) -> tuple[dict[int, list[dict[str, Any]]], dict[int, Any]]:
    """(rank -> preflight timeline, rank -> host) from what the ranks left in a launch directory."""
    timelines: dict[int, list[dict[str, Any]]] = {}
    hosts: dict[int, Any] = {}
    for r, d in read_by_rank(os.path.join(tmp, RANK_FILE.format("*"))).items():
        timeline, view = d.get("timeline"), d.get("view")
        timelines[r] = [e for e in timeline if isinstance(e, dict)] if isinstance(timeline, list) else []
        hosts[r] = view.get("hostname") if isinstance(view, dict) else None
    return timelines, hosts


def note_stage(launch_dir: str | None, rank: int, stage: str, since: float) -> None:
    """A rank entered `stage` at `since` (time.time()): the parent's progress line reads it. A
    stage name is ddp-doctor's own word (no user text); a failed write loses only the line."""
    if not launch_dir:
        return
    from ddp_doctor.report.private_files import write_private
    try:
        write_private(os.path.join(launch_dir, STAGE_FILE.format(rank)),
                      json.dumps({"rank": rank, "stage": stage, "since": since}))
    except (OSError, ValueError):
        pass


def read_stages(launch_dir: str) -> dict[int, dict[str, Any]]:
    """rank -> {"rank", "stage", "since"}: the stage each rank is in now."""
    return read_by_rank(os.path.join(launch_dir, STAGE_FILE.format("*")))
