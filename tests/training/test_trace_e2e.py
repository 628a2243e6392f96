"""`--trace PATH` on real ranks: the Chrome trace of a self-launched `ddp-doctor preflight` (its
stages, with their wall times in the report). The trace of a failing `ddp-doctor run` is checked
on the launch of test_run_e2e.py's failing-rank test."""
from __future__ import annotations

import json

import pytest
from helpers.procs import DDP, clean_env, load_json, run

from ddp_doctor.report import chrome_trace as tracelib

pytestmark = pytest.mark.slow
STAGES = {"local_checks", "rendezvous", "init_process_group", "group_checks", "teardown"}


def events(trace: dict, pid: int, cat: str | None = None) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["pid"] == pid and e["ph"] != "M"
            and (cat is None or e.get("cat") == cat)]


def test_preflight_trace_and_stage_times_in_the_report(tmp_path):
    path, report = tmp_path / "pf-trace.json", tmp_path / "r.json"
    res = run([*DDP, "preflight", "--timeout", "20", "--report", str(report), "--trace", str(path)],
              clean_env(), str(tmp_path), timeout=120)
    assert res.rc == 0, res.output
    stages = load_json(str(report))["measurements"]["stage_seconds"]
    assert STAGES | {"startup", "launch", "communication", "total"} <= set(stages), stages
    assert all(isinstance(v, float) and v >= 0 for v in stages.values())
    assert stages["launch"] >= stages["startup"] and stages["launch"] >= stages["total"]
    assert load_json(str(report))["measurements"]["check_seconds"]["DDP401"] > 0
    trace = json.loads(path.read_text())
    assert tracelib.validate(trace) == []
    assert sorted(tracelib.lanes_named(trace)) == [0, 1]
    for rank in (0, 1):
        assert STAGES | {"startup"} <= {e["name"] for e in events(trace, rank, "preflight.stage")}
