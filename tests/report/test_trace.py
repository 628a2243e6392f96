"""The Chrome trace of the ranks' timelines (report/chrome_trace.py) from hand-made records, and the
stage times behind it (runner timings, RankPreflight stage_seconds, their merge across ranks)."""
from __future__ import annotations

import json

import pytest
from helpers.context import make_ctx, torchrun_env

from ddp_doctor import check_runner
from ddp_doctor.preflight_ranks.one_rank import PreflightOptions, RankPreflight, merge_measurements
from ddp_doctor.report import chrome_trace as tracelib
from ddp_doctor.report import sinks

T0 = 1_700_000_000.0


def us(x: float) -> object:
    """Microseconds, to the precision Unix times in doubles allow."""
    return pytest.approx(x, abs=1.0)


def timeline() -> list[dict]:
    return [
        {"name": "local_checks", "cat": "stage", "start": T0, "end": T0 + 0.1},
        {"name": "DDP101", "cat": "check", "title": "Rank variables", "start": T0 + 0.01, "end": T0 + 0.02},
        {"name": "rendezvous", "cat": "stage", "start": T0 + 0.1, "end": T0 + 0.3},
        {"name": "group_checks", "cat": "stage", "start": T0 + 0.3, "end": T0 + 1.3},
        {"name": "DDP401", "cat": "check", "title": "all_reduce gives a wrong result",
         "category": "communication", "start": T0 + 0.3, "end": T0 + 1.2},
        {"name": "teardown", "cat": "stage", "start": T0 + 1.3, "end": T0 + 1.35},
    ]


def ledger(pending_last: bool) -> dict:
    def entry(seq: int, at: float, op: str = "all_reduce", retired: bool = True) -> dict:
        return {"collective_seq_id": seq, "profiling_name": f"gloo:{op}", "input_sizes": [[4]],
                "input_dtypes": ["Float"], "process_group": ["0", "default_pg"],
                "time_created_ns": int(at * 1e9), "time_discovered_started_ns": 0,
                "time_discovered_completed_ns": 0, "retired": retired, "state": "scheduled"}
    return {"rank": 0, "time": T0 + 9.0, "position": "hung", "entries": [
        entry(1, T0 + 2.0, "broadcast"), entry(2, T0 + 3.0), entry(3, T0 + 4.0, retired=not pending_last)]}


def lanes() -> dict[int, dict]:
    report = {"root_cause": {"id": "DDP800", "message": "rank 1 raised ValueError: bad"}, "findings": [
        {"id": "DDP800", "severity": "error", "title": "A rank raised", "message": "rank 1 raised ValueError: bad",
         "ranks": [1], "phase": "training", "time": T0 + 5.0},
        {"id": "DDP500", "severity": "info", "title": "n/a", "message": "", "ranks": [0, 1], "time": T0}]}
    found = tracelib.finding_records(report)
    hb = {"phase": "training", "steps": 5, "step_times": [T0 + 2.5, T0 + 3.5, T0 + 4.5],
          "last_progress": T0 + 4.5, "time": T0 + 9.0, "where": "train.py:12 in main"}
    probe = {"events": [{"kind": "init_process_group", "t": T0 + 1.5, "site": "train.py:3"},
                        {"kind": "ddp", "t": T0 + 1.8, "site": "train.py:8"}, {"kind": "other", "t": T0}]}
    return {
        0: {"host": "algo-1", "records": tracelib.preflight_records(timeline()) + tracelib.probe_records(probe)
            + tracelib.script_records(T0 + 1.4, None) + tracelib.step_records(hb) + tracelib.stall_records(hb)
            + tracelib.ledger_records(ledger(pending_last=True)) + found.get(0, [])},
        1: {"host": "algo-2", "records": tracelib.preflight_records(timeline())
            + tracelib.script_records(T0 + 1.4, T0 + 5.0)
            + tracelib.outcome_records({"time": T0 + 5.0, "exit_code": 1,
                                        "exception": {"type": "ValueError", "message": "bad"}})
            + found.get(1, [])},
        2: {"host": None, "records": []},  # a rank that left nothing still has its lane
    }


def events_of(trace: dict, pid: int) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["pid"] == pid and e["ph"] != "M"]


def thread_names(trace: dict, pid: int) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
            if e["pid"] == pid and e["ph"] == "M" and e["name"] == "thread_name"}


def test_the_trace_is_a_chrome_trace_with_one_named_lane_per_rank():
    trace = tracelib.chrome_trace(lanes())
    trace = json.loads(json.dumps(trace))  # plain JSON, as a viewer reads it
    assert tracelib.validate(trace) == []
    assert trace["displayTimeUnit"] == "ms" and trace["otherData"]["origin_unix_s"] == T0
    assert tracelib.lanes_named(trace) == {0: "rank 0 (algo-1)", 1: "rank 1 (algo-2)", 2: "rank 2"}
    for e in trace["traceEvents"]:
        assert {"name", "ph", "ts", "pid", "tid"} <= set(e)
    assert thread_names(trace, 0) == {1: "preflight", 2: "script", 3: "steps", 4: "collectives default_pg"}
    assert min(e["ts"] for e in trace["traceEvents"] if e["ph"] != "M") == 0  # microseconds from the origin


def test_preflight_stages_and_checks_are_spans_in_microseconds():
    trace = tracelib.chrome_trace(lanes())
    by_name = {e["name"]: e for e in events_of(trace, 0)}
    assert by_name["rendezvous"]["ph"] == "X"
    assert by_name["rendezvous"]["ts"] == us(100_000) and by_name["rendezvous"]["dur"] == us(200_000)
    sweep = by_name["DDP401 all_reduce gives a wrong result"]
    assert sweep["cat"] == "preflight.check" and sweep["args"]["category"] == "communication"
    assert sweep["dur"] == us(900_000)
    group = by_name["group_checks"]  # the check nests inside its stage
    assert group["ts"] <= sweep["ts"] and sweep["ts"] + sweep["dur"] <= group["ts"] + group["dur"]


def test_training_lane_init_ddp_steps_collectives_stall():
    trace = tracelib.chrome_trace(lanes())
    ev = events_of(trace, 0)
    names = [e["name"] for e in ev]
    assert "init_process_group" in names and "DDP construction" in names and "other" not in names
    steps = sorted((e for e in ev if e["cat"] == "step"), key=lambda e: e["name"])
    # steps 3..5 were kept: step 3's end is an instant, 4 and 5 run from the previous end
    assert [(e["name"], e["ph"]) for e in steps] == [("step 3 end", "i"), ("step 4", "X"), ("step 5", "X")]
    assert steps[1]["dur"] == us(1_000_000)
    coll = [e for e in ev if e["name"].startswith("#")]
    assert [e["name"] for e in coll] == ["#1 broadcast", "#2 all_reduce", "#3 all_reduce (pending)"]
    assert coll[0]["dur"] == us(1_000_000)  # gloo: to the next collective's creation
    assert coll[2]["cat"] == "stall" and coll[2]["dur"] == us(5_000_000)  # pending: to the ledger's dump
    assert coll[2]["args"]["seq_id"] == 3 and coll[2]["args"]["input_sizes"] == [[4]]
    [stall] = [e for e in ev if e["name"] == "no progress"]
    assert stall["args"]["where"] == "train.py:12 in main" and stall["dur"] == us(4_500_000)


def test_the_failure_and_the_root_cause_are_on_the_failing_rank():
    trace = tracelib.chrome_trace(lanes())
    ev = events_of(trace, 1)
    [failed] = [e for e in ev if e["cat"] == "failure"]
    assert failed["ph"] == "i" and failed["name"] == "failed: ValueError: bad"
    [cause] = [e for e in ev if e["cat"] == "root_cause"]
    assert cause["name"] == "root cause: DDP800 A rank raised" and cause["tid"] == 2  # the script track
    assert not [e for e in events_of(trace, 0) if e["cat"] in ("root_cause", "finding")]  # info is not drawn


def test_a_retired_last_collective_has_no_end_unless_the_rank_failed_in_it():
    done = tracelib.ledger_records(ledger(pending_last=False))
    assert done[-1]["name"] == "#3 all_reduce" and "end" not in done[-1]  # an instant
    failed = tracelib.ledger_records(ledger(pending_last=False), failed_in_collective=True)
    assert failed[-1]["name"] == "#3 all_reduce (failed)" and failed[-1]["end"] == T0 + 9.0


def test_validate_names_what_is_wrong():
    assert tracelib.validate([]) == ["not a JSON object with a traceEvents list"]
    bad = {"traceEvents": [{"name": "a", "ph": "X", "ts": 0, "pid": 0}, {"name": "b", "ph": "X", "ts": 0,
                                                                       "pid": 0, "tid": 1}]}
    assert tracelib.validate(bad) == ["event 0: missing tid", "event 1: a complete event needs dur >= 0"]


def test_the_sink_writes_a_redacted_trace(tmp_path):
    rec = tracelib.instant("failed: token hf_abcdefghijklmnopqrstuvwxyz0123456789", T0, cat="failure", track="script")
    path = tmp_path / "sub" / "t.json"
    assert sinks.write_trace_file(tracelib.chrome_trace({0: {"host": "h", "records": [rec]}}), str(path)) is None
    text = path.read_text()
    assert "hf_abcdefghijklmnopqrstuvwxyz0123456789" not in text
    assert tracelib.validate(json.loads(text)) == []
    assert sinks.write_trace_file({}, str(path / "x")) is not None  # an error text, no raise


def test_the_runner_times_each_check():
    ctx = make_ctx(torchrun_env(rank=0, world_size=1))
    timings: list[dict] = []
    check_runner.run_stage("local", (ctx,), 0, select=["DDP101", "DDP102"], timings=timings)
    assert [t["name"] for t in timings] == ["DDP101", "DDP102"]
    assert all(t["cat"] == "check" and t["title"] and t["start"] <= t["end"] for t in timings)


def test_stage_seconds_per_rank_and_the_slowest_rank_across_ranks():
    pf = RankPreflight(make_ctx(torchrun_env(rank=0, world_size=1)), PreflightOptions())
    pf.started = T0 - 0.5
    pf.timeline = timeline()
    pf._stage_measurements()
    stages = pf.measurements["stage_seconds"]
    assert stages["rendezvous"] == 0.2 and stages["communication"] == 0.9 and stages["total"] == 1.85
    assert pf.measurements["check_seconds"] == {"DDP101": 0.01, "DDP401": 0.9}
    merged: dict = {"all_reduce": [{"bytes": 4, "time_us": 1.0, "correct": True}]}
    merge_measurements(merged, {"stage_seconds": {"rendezvous": 0.2, "teardown": 0.05}})
    merge_measurements(merged, {"stage_seconds": {"rendezvous": 0.5}, "all_reduce": [
        {"bytes": 4, "time_us": 2.0, "correct": True}]})
    assert merged["stage_seconds"] == {"rendezvous": 0.5, "teardown": 0.05}
    assert merged["all_reduce"][0]["time_us"] == 2.0


def test_a_garbled_rank_file_in_the_launch_directory_gives_an_empty_lane_not_a_lost_report(tmp_path):
    import json

    from ddp_doctor.processes.launch_dir import launch_timelines
    (tmp_path / "rank-0.json").write_text(json.dumps({"rank": 0, "timeline": "oops", "view": ["x"]}))
    (tmp_path / "rank-1.json").write_text(json.dumps({"rank": 1, "timeline": [{"name": "probe"}, 3],
                                                      "view": {"hostname": "algo-2"}}))
    (tmp_path / "rank-2.json").write_text("{not json")
    timelines, hosts = launch_timelines(str(tmp_path))
    assert timelines == {0: [], 1: [{"name": "probe"}]} and hosts == {0: None, 1: "algo-2"}


def test_checks_that_found_nothing_at_once_share_one_slice_and_slices_never_overlap_after_rounding():
    t = [{"name": "local_checks", "cat": "stage", "start": T0, "end": T0 + 0.1}]
    t += [{"name": f"DDP9{i:02d}", "cat": "check", "title": "SageMaker thing", "start": T0 + i * 1e-4,
           "end": T0 + (i + 1) * 1e-4, "found": 0} for i in range(40)]  # 40 checks that do not apply here
    t += [{"name": "DDP401", "cat": "check", "title": "all_reduce", "start": T0 + 0.004, "end": T0 + 0.05,
           "found": 0},  # slow: its own slice
          {"name": "DDP102", "cat": "check", "title": "found one", "start": T0 + 0.05, "end": T0 + 0.0501,
           "found": 1},
          {"name": "DDP103", "cat": "check", "title": "alone", "start": T0 + 0.0501, "end": T0 + 0.0502, "found": 0}]
    recs = tracelib.preflight_records(t)
    names = [r["name"] for r in recs]
    assert names == ["local_checks", "40 checks, nothing found", "DDP401 all_reduce", "DDP102 found one",
                     "DDP103 alone"], names
    assert recs[1]["args"]["checks"][:2] == ["DDP900", "DDP901"] and len(recs[1]["args"]["checks"]) == 40
    # back to back at sub-microsecond boundaries: the rounded end of one is never after the next start
    lane = [tracelib.span(f"s{i}", T0 + i * 0.0000013, T0 + (i + 1) * 0.0000013, cat="c", track="t")
            for i in range(50)]
    events = [e for e in tracelib.chrome_trace({0: {"host": None, "records": lane}})["traceEvents"]
              if e["ph"] == "X"]
    for a, b in zip(events, events[1:]):
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-9, (a, b)
