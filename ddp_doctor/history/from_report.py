"""A finished report as history records (store.py): one per host the report's ranks ran on, with
the figures a host is later compared on. Written by report/publish.py for the reports of jobs that
ran here (a preflight, a run); never for a post-mortem (`analyze`), a planned job (`sagemaker-check`)
or a report still "running"."""
from __future__ import annotations

import socket
import time
from typing import Any, Callable

from ddp_doctor.history.opened import open_history
from ddp_doctor.history.store import RunRecord, default_path

COLLECTIVES = ("all_reduce", "all_reduce_intra", "all_reduce_inter", "broadcast", "all_gather")
STRAGGLER_ID = "DDP877"


def recordable(rep: dict[str, Any]) -> bool:
    world = rep.get("world") or {}
    return (rep.get("phase") in ("preflight", "training") and rep.get("status") not in (None, "running")
            and world.get("source") != "post-mortem" and not world.get("planned"))


def figures_of(rep: dict[str, Any]) -> dict[str, float]:
    """name -> value: each collective's busbw per message size (correct results only), the
    preflight's stage times, a run's median step time (per script and arguments), and the
    straggler's lag and share when DDP877 named one."""
    m = rep.get("measurements") or {}
    out: dict[str, float] = {}
    for coll in COLLECTIVES:
        for row in m.get(coll) or []:
            if isinstance(row, dict) and row.get("correct", True) and isinstance(row.get("busbw_gbps"), (int, float)) \
                    and isinstance(row.get("bytes"), int):
                out[f"{coll}.busbw_gbps@{row['bytes']}"] = float(row["busbw_gbps"])
    for stage, seconds in (m.get("stage_seconds") or {}).items():
        if isinstance(seconds, (int, float)):
            out[f"stage_seconds.{stage}"] = float(seconds)
    training = m.get("training") or {}
    if isinstance(training.get("median_step_s"), (int, float)) and training.get("script_key"):
        # keyed by the script and its arguments: another script's steps are another series
        out[f"training.median_step_s@{training['script_key']}"] = float(training["median_step_s"])
    for f in rep.get("findings") or []:
        if f.get("id") == STRAGGLER_ID:
            ev = f.get("evidence") or {}
            if isinstance(ev.get("median_lag_s"), (int, float)):
                out["arrival.median_lag_s"] = float(ev["median_lag_s"])
            if ev.get("span_s"):
                out["arrival.waited_share"] = float(ev.get("waited_s") or 0) / float(ev["span_s"])
    return out


def records_of(rep: dict[str, Any], *, now: float | None = None) -> list[RunRecord]:
    world = rep.get("world") or {}
    ranks = [r for r in rep.get("ranks") or [] if isinstance(r, dict)]
    hosts = sorted({str(r["host"]) for r in ranks if r.get("host")}) or [socket.gethostname()]
    figures = figures_of(rep)
    out = []
    for host in hosts:
        mine = next((r for r in ranks if r.get("host") == host), ranks[0] if ranks else {})
        versions = {k: v for k, v in (mine.get("versions") or {}).items() if isinstance(v, (str, type(None)))}
        out.append(RunRecord(
            time=time.time() if now is None else now, kind="preflight" if rep.get("phase") == "preflight" else "run",
            host=host, job=world.get("run_id"), instance_type=world.get("instance_type"),
            gpus=sorted({str(r["device_uuid"]) for r in ranks if r.get("host") == host and r.get("device_uuid")}),
            world_size=world.get("world_size"), nnodes=world.get("nnodes"), nproc_per_node=world.get("nproc_per_node"),
            backend=world.get("backend"), versions=versions, status=rep.get("status"), figures=figures))
    return out


def record(rep: dict[str, Any], env: Any, stop: Callable[[float], Any] | None = None) -> str | None:
    """Append the report's records to the history $DDP_DOCTOR_HISTORY names (default: the user's
    cache); None when written or not asked for, else one line saying why not. `stop(s)` (a wait for
    a stop signal) cuts an S3 history's write short (history/s3_store.py)."""
    if not recordable(rep):
        return None
    path = default_path(dict(env))
    if path is None:
        return None
    return open_history(path, stop=stop).add(records_of(rep))
