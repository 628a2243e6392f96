"""`ddp-doctor run --trace PATH`: the parent turns what the ranks left in the run directory into one
Chrome trace (report/chrome_trace.py draws it, sinks.write_trace_file writes it), once the run ended.

    run directory                          lane of rank N (one track each)
    preflight/rank-N.json  timeline   ->   preflight: stages (rendezvous, init_process_group, each
                                           check, the sweep DDP401, teardown)
    probe-PID.json  events            ->   script: init_process_group, DDP construction, ...
    ledger-N.json   since_ns          ->   script: from its start ...
    rank-N.json     outcome           ->   ... to how it ended (failure, exit)
    crash-N.txt     (its time)        ->   script: fatal signal
    hb-N.json       step_times, stall ->   steps; script: no progress
    ledger-N.json   entries           ->   collectives <group>: #seq op, pending ones marked
    the report's error findings       ->   instants on the ranks they name (the root cause marked)

Heartbeats are overwritten as the run goes: the steps drawn are the latest ones the last heartbeat
kept (watchdog.STEP_TIMES). A trace that cannot be made or written is a warning, never a failure.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from ddp_doctor.training import records

TRACE_IN_RUN_DIR = "trace.json"  # with --run-dir, the kept run directory gets the trace too


def rank_lanes(run_dir: str, rep: dict[str, Any] | None) -> dict[int, dict[str, Any]]:
    """rank -> {"host", "records"} from a run directory and the run's report."""
    from ddp_doctor.checks import arrivals
    from ddp_doctor.processes.launch_dir import launch_timelines
    from ddp_doctor.report import chrome_trace as tracelib
    timelines, hosts = launch_timelines(records.preflight_dir(run_dir))
    heartbeats = records.read_heartbeats(run_dir)
    outcomes = records.read_outcomes(run_dir)
    ledgers = records.read_ledgers(run_dir)
    crashes = records.read_crashes(run_dir)
    probes: dict[int, list[dict[str, Any]]] = {}
    for p in records.read_probes(run_dir):
        if p.get("rank") is not None:
            probes.setdefault(int(p["rank"]), []).append(p)
    for r in (rep or {}).get("ranks") or []:
        if r.get("rank") is not None and r.get("host"):
            hosts.setdefault(int(r["rank"]), r["host"])
    found = tracelib.finding_records(rep)
    lags = arrivals.lags_behind_first(ledgers, arrivals.clock_offsets_of((rep or {}).get("measurements")))
    ranks = set(timelines) | set(heartbeats) | set(outcomes) | set(ledgers) | set(probes) | set(found)
    lanes: dict[int, dict[str, Any]] = {}
    for r in sorted(ranks):
        outcome, ledger, hb = outcomes.get(r), ledgers.get(r), heartbeats.get(r)
        started = None
        if ledger and ledger.get("since_ns"):
            started = int(ledger["since_ns"]) / 1e9
        elif probes.get(r):
            started = min(float(p.get("started") or 0) for p in probes[r]) or None
        recs = tracelib.preflight_records(timelines.get(r, []))
        recs += tracelib.script_records(started, float(outcome["time"]) if outcome and outcome.get("time") else None)
        for p in probes.get(r, []):
            recs += tracelib.probe_records(p)
        recs += tracelib.step_records(hb)
        recs += tracelib.stall_records(hb)
        recs += tracelib.ledger_records(ledger, failed_in_collective=_failed_in_collective(outcome),
                                        lags=lags.get(r), key=arrivals.collective_key)
        recs += tracelib.outcome_records(outcome, crashes[r][1] if r in crashes else None)
        recs += found.get(r, [])
        host = hosts.get(r) or (outcome or {}).get("host") or next((p.get("host") for p in probes.get(r, [])), None)
        lanes[r] = {"host": host, "records": recs}
    return lanes


def _failed_in_collective(outcome: dict[str, Any] | None) -> bool:
    """As the report judges it (ledger.from_exception): the lane then marks the same collective."""
    from ddp_doctor.training.run.ledger import from_exception
    return from_exception((outcome or {}).get("exception"))[0]


def write_trace_if_asked(opts: Any, run_dir: str, rep: dict[str, Any] | None) -> None:
    """With --trace PATH, write the run's Chrome trace there (and into a kept --run-dir)."""
    path = getattr(opts, "trace_path", None)
    if not path:
        return
    from ddp_doctor.report import chrome_trace as tracelib
    from ddp_doctor.report import sinks
    from ddp_doctor.report.publish import warn
    try:
        trace = tracelib.chrome_trace(rank_lanes(run_dir, rep))
        err = sinks.write_trace_file(trace, path)
        if getattr(opts, "run_dir", None):
            sinks.write_trace_file(trace, os.path.join(run_dir, TRACE_IN_RUN_DIR), private=True)
    except Exception as e:  # noqa: BLE001 - the trace never takes the run down
        err = f"could not make the trace {path}: {type(e).__name__}: {e}"
    if err:
        warn(err)
    else:
        sys.stderr.write(f"ddp-doctor: trace of the ranks' timelines: {path} "
                         "(open it in https://ui.perfetto.dev or chrome://tracing)\n")
