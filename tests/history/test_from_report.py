"""A finished report as history records (history/from_report.py), and publish() writing them."""
from __future__ import annotations

import json

from ddp_doctor.history.from_report import figures_of, record, recordable, records_of
from ddp_doctor.history.store import History

REPORT = {
    "schema": "ddp-doctor.report", "phase": "preflight", "status": "pass",
    "world": {"launcher": "torchrun", "backend": "nccl", "world_size": 16, "nnodes": 2, "nproc_per_node": 8,
              "instance_type": "ml.p4d.24xlarge"},
    "ranks": [{"rank": 0, "host": "algo-1", "versions": {"torch": "2.13.0", "nccl": "2.21.5", "cuda": "12.4"}},
              {"rank": 8, "host": "algo-2", "versions": {"torch": "2.13.0", "nccl": "2.21.5", "cuda": "12.4"}}],
    "measurements": {
        "all_reduce": [{"bytes": 1048576, "busbw_gbps": 80.5, "correct": True},
                       {"bytes": 268435456, "busbw_gbps": 150.0, "correct": True},
                       {"bytes": 4096, "busbw_gbps": 1.0, "correct": False}],
        "stage_seconds": {"total": 4.25, "rendezvous": 0.5}},
    "findings": [{"id": "DDP877", "evidence": {"median_lag_s": 0.05, "waited_s": 2.0, "span_s": 4.0}}],
}


def test_a_report_becomes_one_record_per_host_with_its_figures():
    recs = records_of(REPORT, now=100.0)
    assert [r.host for r in recs] == ["algo-1", "algo-2"]
    r = recs[0]
    assert (r.kind, r.world_size, r.nnodes, r.nproc_per_node, r.backend, r.instance_type, r.status) == \
        ("preflight", 16, 2, 8, "nccl", "ml.p4d.24xlarge", "pass")
    assert r.versions == {"torch": "2.13.0", "nccl": "2.21.5", "cuda": "12.4"}
    assert figures_of(REPORT) == {"all_reduce.busbw_gbps@1048576": 80.5, "all_reduce.busbw_gbps@268435456": 150.0,
                                  "stage_seconds.total": 4.25, "stage_seconds.rendezvous": 0.5,
                                  "arrival.median_lag_s": 0.05, "arrival.waited_share": 0.5}


def test_a_runs_step_time_is_kept_per_script_and_each_hosts_gpus_by_uuid():
    rep = {**REPORT, "phase": "training",
           "ranks": [{**REPORT["ranks"][0], "device_uuid": "GPU-b"}, {**REPORT["ranks"][0], "device_uuid": "GPU-a"},
                     {**REPORT["ranks"][1], "device_uuid": "GPU-c"}],
           "measurements": {"training": {"median_step_s": 0.125, "steps": 40, "script": "train.py",
                                         "script_key": "0123abcd4567"}}}
    a, b = records_of(rep, now=1.0)
    assert a.kind == "run" and a.gpus == ["GPU-a", "GPU-b"] and b.gpus == ["GPU-c"]
    assert a.figures["training.median_step_s@0123abcd4567"] == 0.125
    # a step time without a script to key it by is not kept: it could not be compared
    rep["measurements"]["training"].pop("script_key")
    assert not [k for k in figures_of(rep) if k.startswith("training.")]


def test_only_reports_of_jobs_that_ran_here_and_ended_are_recorded(tmp_path):
    assert recordable(REPORT)
    assert not recordable({**REPORT, "status": "running"})
    assert not recordable({**REPORT, "phase": "training", "world": {"source": "post-mortem"}})
    assert not recordable({**REPORT, "world": {"planned": True}})
    path = tmp_path / "h.sqlite"
    assert record(REPORT, {"DDP_DOCTOR_HISTORY": str(path)}) is None
    assert record({**REPORT, "status": "running"}, {"DDP_DOCTOR_HISTORY": str(path)}) is None
    assert History(str(path)).count() == 2  # two hosts, one report
    assert record(REPORT, {"DDP_DOCTOR_HISTORY": "off"}) is None and History(str(path)).count() == 2


def test_publish_records_the_report_it_delivers(tmp_path):
    from ddp_doctor.report.publish import Output, publish
    path = tmp_path / "h.sqlite"
    env = {"DDP_DOCTOR_HISTORY": str(path)}
    publish(REPORT, Output(quiet=True), env=env, write=False)
    assert [r.host for r in History(str(path)).records()] == ["algo-1", "algo-2"]
    # a rank's own partial report (path.rankN.json) is not the job's
    publish(REPORT, Output(quiet=True), env=env, write=False, suffix=".rank1")
    assert History(str(path)).count() == 2


def test_the_history_command_shows_a_hosts_records(tmp_path, capsys):
    from ddp_doctor.cli import main
    path = tmp_path / "h.sqlite"
    for t, busbw in ((100.0, 150.0), (200.0, 90.0)):
        rep = {**REPORT, "measurements": {**REPORT["measurements"], "all_reduce": [
            {"bytes": 268435456, "busbw_gbps": busbw, "correct": True}]}}
        History(str(path)).add(records_of(rep, now=t))
    assert main(["history", "--history", str(path), "--host", "algo-2"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"2 record(s) of {path}"
    assert "all_reduce.busbw_gbps@268435456" in lines[1] and "stage_seconds.total" in lines[1]
    assert "algo-2" in lines[2] and " 150 " in lines[2] + " " and " 90 " in lines[3] + " ", out
    assert main(["history", "--history", str(path), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["records"]) == 4
    assert main(["history", "--history", str(path), "--figure", "list"]) == 0
    assert "arrival.median_lag_s" in capsys.readouterr().out
    assert main(["history", "--history", str(tmp_path / "none.sqlite")]) == 2
    assert "no history at" in capsys.readouterr().err


def test_the_history_command_shows_and_plots_the_step_time_of_the_newest_runs_script(tmp_path, capsys):
    import pytest
    pytest.importorskip("matplotlib")
    from ddp_doctor.cli import main
    path = tmp_path / "h.sqlite"
    for t, step in ((100.0, 0.10), (200.0, 0.11), (300.0, 0.20)):
        rep = {**REPORT, "phase": "training", "measurements": {
            **REPORT["measurements"], "training": {"median_step_s": step, "script_key": "abc"}}}
        History(str(path)).add(records_of(rep, now=t))
    assert main(["history", "--history", str(path), "--host", "algo-1"]) == 0
    head = capsys.readouterr().out.splitlines()[1]
    assert "training.median_step_s@abc" in head and "all_reduce.busbw_gbps@268435456" in head, head
    png = tmp_path / "h.png"
    assert main(["history", "--history", str(path), "--host", "algo-1", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
