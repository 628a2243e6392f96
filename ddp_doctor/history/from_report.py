"""A finished report as history records (database.py): one per host the report's ranks ran on, with
the figures a host is later compared on. Written by report/publish.py for the reports of jobs that
ran here (a preflight, a run); never for a post-mortem (`analyze`), a planned job (`sagemaker-check`)
or a report still "running".

Whether the machine was busy is kept as the figure BUSY, for the job as a whole: each figure is
the job's (its slowest host sets a collective's time and the step's pace), so one busy host makes
every host's record of that run a busy one. The history compares a host with its quiet runs only
(checks/history_rules.py)."""
from __future__ import annotations

import socket
import time
from typing import Any, Callable

from ddp_doctor.history.database import RunRecord, default_path, group_size, possible_figure
from ddp_doctor.history.opened import open_history
from ddp_doctor.registry import REGISTRY

COLLECTIVES = ("all_reduce", "all_reduce_intra", "all_reduce_inter", "broadcast", "all_gather")
BUSY = "host_load.busy"  # 1.0: a host of the job was busy while it was timed; 0.0: none was; absent: not known


def recordable(rep: dict[str, Any]) -> bool:
    world = rep.get("world") or {}
    return (rep.get("phase") in ("preflight", "training") and rep.get("status") not in (None, "running")
            and world.get("source") != "post-mortem" and not world.get("planned"))


def figures_of(rep: dict[str, Any]) -> dict[str, float]:
    """name -> value: each collective's busbw per message size (correct results only, over 2 ranks
    or more), the preflight's stage times, a run's median step time (per script and arguments), the
    straggler's lag and share when DDP877 named one, and whether a host of the job was busy while
    it was timed (BUSY, from measurements.host_load). A figure that cannot be real (not finite,
    negative, a busbw of a 1-rank group: database.possible_figure) is left out.

    The straggler's figures come from the findings whose ID is declared `kept_in_history` in the
    catalogue as loaded: a report with such a finding was judged in this process, by the checks
    module that declares it."""
    m = rep.get("measurements") or {}
    world = rep.get("world") or {}
    layout = RunRecord(time=0.0, kind="", host="", world_size=world.get("world_size"), nnodes=world.get("nnodes"),
                       nproc_per_node=world.get("nproc_per_node"))
    out: dict[str, float] = {}
    for coll in COLLECTIVES:
        for row in m.get(coll) or []:
            if isinstance(row, dict) and row.get("correct", True) and isinstance(row.get("busbw_gbps"), (int, float)) \
                    and isinstance(row.get("bytes"), int):
                name = f"{coll}.busbw_gbps@{row['bytes']}"
                nranks = row.get("nranks") if isinstance(row.get("nranks"), int) else group_size(name, layout)
                if possible_figure(name, row["busbw_gbps"], nranks):
                    out[name] = float(row["busbw_gbps"])
    for stage, seconds in (m.get("stage_seconds") or {}).items():
        if isinstance(seconds, (int, float)):
            out[f"stage_seconds.{stage}"] = float(seconds)
    training = m.get("training") or {}
    if isinstance(training.get("median_step_s"), (int, float)) and training.get("script_key"):
        # keyed by the script and its arguments: another script's steps are another series
        out[f"training.median_step_s@{training['script_key']}"] = float(training["median_step_s"])
    kept = {c.id for c in REGISTRY.values() if c.kept_in_history}
    for f in rep.get("findings") or []:
        if f.get("id") in kept:
            ev = f.get("evidence") or {}
            if isinstance(ev.get("median_lag_s"), (int, float)):
                out["arrival.median_lag_s"] = float(ev["median_lag_s"])
            if ev.get("span_s"):
                out["arrival.waited_share"] = float(ev.get("waited_s") or 0) / float(ev["span_s"])
    load = m.get("host_load")
    if isinstance(load, dict) and isinstance(load.get("busy"), bool):
        # not busy is known only when the load was read (no /proc: no rank's CPUs measured, busy false)
        unread = load.get("other_cores_on_rank_cpus") == {} and not load.get("busy_nodes")
        if load["busy"] or not unread:
            out[BUSY] = 1.0 if load["busy"] else 0.0
    return {k: v for k, v in out.items() if possible_figure(k, v)}


def script_of(rep: dict[str, Any]) -> str | None:
    """The file name of the script a run trained (measurements.training.script), None for a preflight."""
    script = ((rep.get("measurements") or {}).get("training") or {}).get("script")
    return str(script) if script else None


HOST_FAULT = "root_cause.host_fault."  # + the root cause's ID: 1.0 on the hosts a host-class root cause blamed


def blamed_hosts(rep: dict[str, Any]) -> tuple[str | None, list[str]]:
    """(the root cause's ID, the hosts it says to run without: root_cause.hosts when its action is
    exclude_host), or (None, [])."""
    cause = rep.get("root_cause")
    if not isinstance(cause, dict) or cause.get("action") != "exclude_host" or not cause.get("id"):
        return None, []
    return str(cause["id"]), [str(h) for h in cause.get("hosts") or []]


def records_of(rep: dict[str, Any], *, now: float | None = None) -> list[RunRecord]:
    world = rep.get("world") or {}
    ranks = [r for r in rep.get("ranks") or [] if isinstance(r, dict)]
    hosts = sorted({str(r["host"]) for r in ranks if r.get("host")}) or [socket.gethostname()]
    figures = figures_of(rep)
    fault, blamed = blamed_hosts(rep)
    out = []
    for host in hosts:
        mine = next((r for r in ranks if r.get("host") == host), ranks[0] if ranks else {})
        versions = {k: v for k, v in (mine.get("versions") or {}).items() if isinstance(v, (str, type(None)))}
        out.append(RunRecord(
            time=time.time() if now is None else now, kind="preflight" if rep.get("phase") == "preflight" else "run",
            host=host, job=world.get("run_id"), instance_type=world.get("instance_type"),
            gpus=sorted({str(r["device_uuid"]) for r in ranks if r.get("host") == host and r.get("device_uuid")}),
            world_size=world.get("world_size"), nnodes=world.get("nnodes"), nproc_per_node=world.get("nproc_per_node"),
            backend=world.get("backend"), versions=versions, status=rep.get("status"),
            figures={**figures, **({HOST_FAULT + fault: 1.0} if fault and host in blamed else {})},
            script=script_of(rep)))
    return out


def record(rep: dict[str, Any], env: Any, stop: Callable[[float], Any] | None = None) -> str | None:
    """Append the report's records to the history $DDP_DOCTOR_HISTORY names (default: the user's
    cache); None when written or not asked for, else one line saying why not. `stop(s)` (a wait for
    a stop signal) cuts an S3 history's write short (history/s3_bucket.py)."""
    if not recordable(rep):
        return None
    path = default_path(dict(env))
    if path is None:
        return None
    return open_history(path, stop=stop).add(records_of(rep))
