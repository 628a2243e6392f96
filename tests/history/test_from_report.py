"""A finished report as history records (history/from_report.py), and publish() writing them."""
from __future__ import annotations

import dataclasses
import json

from ddp_doctor.checks import load_catalogue
from ddp_doctor.history.database import History
from ddp_doctor.history.from_report import BUSY, figures_of, record, recordable, records_of

# The figures a finding gives come from its ID's `kept_in_history` flag in the loaded catalogue, as
# in the process that judged the report.
load_catalogue()

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
    # readable column names, not the figures' keys (those stay the names --figure takes)
    assert lines[1].split()[:10] == ["when", "job", "kind", "script", "host", "layout", "torch", "nccl", "status",
                                     "load"], lines[1]
    assert "all_reduce 256 MiB busbw (GB/s)" in lines[1] and "preflight total (s)" in lines[1], lines[1]
    assert "all_reduce.busbw_gbps@" not in lines[1] and "stage_seconds." not in lines[1], lines[1]
    assert "algo-2" in lines[2] and " 150 " in lines[2] + " " and " 90 " in lines[3] + " ", out
    assert main(["history", "--history", str(path), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["records"]) == 4
    assert main(["history", "--history", str(path), "--figure", "list"]) == 0
    listed = capsys.readouterr().out
    assert "arrival.median_lag_s" in listed and "straggler's median lag (s)" in listed, listed
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
    # readable names: the step time of the script (its digest's start), the bandwidth by size
    assert "median step (s) of script [abc]" in head and "all_reduce 256 MiB busbw (GB/s)" in head, head
    png = tmp_path / "h.png"
    assert main(["history", "--history", str(path), "--host", "algo-1", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _sweep(rows: list[dict], world_size: int = 16, nproc: int = 8) -> dict:
    return {**REPORT, "world": {**REPORT["world"], "world_size": world_size, "nnodes": world_size // nproc,
                                "nproc_per_node": nproc},
            "measurements": {"all_reduce": rows}, "findings": []}


def test_a_figure_that_cannot_be_real_is_never_kept():
    big = {"bytes": 268435456, "busbw_gbps": 1173.0, "correct": True}
    # a 1-rank "busbw" (bench-comm on one rank: a memory copy's speed), by the entry's group or the world
    assert figures_of(_sweep([{**big, "nranks": 1}])) == {}
    assert figures_of(_sweep([big], world_size=1, nproc=1)) == {}
    assert figures_of(_sweep([{**big, "nranks": 16}])) == {"all_reduce.busbw_gbps@268435456": 1173.0}
    # not finite, negative, zero rates: never kept
    bad = [{**big, "bytes": 1 << 20, "busbw_gbps": float("nan")}, {**big, "bytes": 1 << 21, "busbw_gbps": -3.0},
           {**big, "bytes": 1 << 22, "busbw_gbps": float("inf")}, {**big, "bytes": 1 << 23, "busbw_gbps": 0.0}]
    assert figures_of(_sweep(bad)) == {}
    rep = {**REPORT, "phase": "training", "measurements": {"training": {"median_step_s": -0.5, "script_key": "k"},
                                                          "stage_seconds": {"total": float("nan")}}}
    assert figures_of(rep) == {"arrival.median_lag_s": 0.05, "arrival.waited_share": 0.5}


def test_an_old_records_impossible_figure_is_left_out_when_read(tmp_path):
    import sqlite3

    from ddp_doctor.checks.history_rules import history_findings
    path = tmp_path / "h.sqlite"
    h = History(str(path))
    one = records_of(_sweep([{"bytes": 268435456, "busbw_gbps": 50.0, "correct": True}], world_size=1, nproc=1),
                     now=1.0)[:1]
    assert one[0].figures == {} and h.add(one) is None
    # what an older ddp-doctor kept: a 1-rank world's busbw, a negative and a NaN figure
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE runs SET figures = ?", ('{"all_reduce.busbw_gbps@268435456": 1173.0, '
                                                     '"stage_seconds.total": -1.0, "stage_seconds.x": NaN, '
                                                     '"stage_seconds.rendezvous": 0.5}',))
    (rec,) = h.records()
    assert rec.world_size == 1 and rec.figures == {"stage_seconds.rendezvous": 0.5}, rec.figures
    # so a 1-rank past never makes a baseline
    past = [dataclasses.replace(rec, time=float(t), figures={"all_reduce.busbw_gbps@268435456": 1173.0})
            for t in range(10)]
    assert h.add(past) is None  # a writer that still holds such figures: they are not written either
    assert not [r for r in h.records(limit=100) if "all_reduce.busbw_gbps@268435456" in r.figures]
    now = dataclasses.replace(rec, time=50.0, figures={"all_reduce.busbw_gbps@268435456": 10.0})
    assert history_findings([now], h.records(limit=100)) == []


def test_whether_the_job_was_busy_and_the_script_are_kept():
    load = {"busy": True, "busy_nodes": {"1": "load average 130.0 on 96 cores"},
            "other_cores_on_rank_cpus": {"0": 0.0, "8": 3.1}}
    rep = {**REPORT, "measurements": {**REPORT["measurements"], "host_load": load}}
    # the job's figures are its slowest host's: one busy host makes every host's record a busy run
    assert [r.figures[BUSY] for r in records_of(rep)] == [1.0, 1.0]
    quiet = {**rep, "measurements": {**REPORT["measurements"], "host_load": {
        "busy": False, "busy_nodes": {}, "other_cores_on_rank_cpus": {"0": 0.1}}}}
    assert records_of(quiet)[0].figures[BUSY] == 0.0
    # no load measured (no host_load, or none of it could be read): unknown, no figure
    assert BUSY not in records_of(REPORT)[0].figures
    unread = {**rep, "measurements": {"host_load": {"busy": False, "busy_nodes": {}, "other_cores_on_rank_cpus": {}}}}
    assert BUSY not in records_of(unread)[0].figures
    run = {**REPORT, "phase": "training", "measurements": {"training": {"median_step_s": 0.1, "script": "train.py",
                                                                        "script_key": "k1"}}}
    assert [r.script for r in records_of(run)] == ["train.py", "train.py"] and records_of(REPORT)[0].script is None


def test_a_busy_runs_drop_against_the_history_is_info(tmp_path):
    from ddp_doctor.checks.history_rules import against_history
    path = tmp_path / "h.sqlite"
    quiet = {"busy": False, "busy_nodes": {}, "other_cores_on_rank_cpus": {"0": 0.0}}
    for t in range(6):
        History(str(path)).add(records_of(_report(150.0, quiet), now=float(t)))
    busy = {"busy": True, "busy_nodes": {"0": "other processes used 50.0 of its 96 cores"},
            "other_cores_on_rank_cpus": {"0": 0.0}}
    env = {"DDP_DOCTOR_HISTORY": str(path)}
    found = against_history(_report(90.0, busy), env)
    assert [(f.evidence["host"], f.severity) for f in found] == [("algo-1", "info"), ("algo-2", "info")], found
    assert "(node 0: other processes used 50.0 of its 96 cores)" in found[0].message, found[0].message
    assert [f.severity for f in against_history(_report(90.0, quiet), env)] == ["warning", "warning"]


def _report(busbw: float, load: dict) -> dict:
    return {**REPORT, "world": {**REPORT["world"], "run_id": f"job-{busbw:g}"},
            "measurements": {"all_reduce": [{"bytes": 268435456, "busbw_gbps": busbw, "correct": True, "nranks": 16}],
                             "host_load": load}, "findings": []}


def test_the_history_command_shows_the_runs_a_judgement_compared_with(tmp_path, capsys):
    from ddp_doctor.cli import main
    path = tmp_path / "h.sqlite"
    h = History(str(path))
    step = "training.median_step_s@k1"

    def run(t: float, step_s: float, busy: bool | None, key: str = "k1", script: str = "train.py") -> dict:
        m = {"training": {"median_step_s": step_s, "script": script, "script_key": key}}
        if busy is not None:
            m["host_load"] = {"busy": busy, "busy_nodes": {"algo-1": "x"} if busy else {},
                              "other_cores_on_rank_cpus": {"0": 0.0}}
        return {**REPORT, "phase": "training", "world": {**REPORT["world"], "run_id": f"job-{t:g}"},
                "ranks": REPORT["ranks"][:1], "measurements": m}
    for t in range(6):
        h.add(records_of(run(1000.0 + t, 0.100 + 0.001 * (t % 2), False), now=1000.0 + t))
    h.add(records_of(run(1010.0, 0.300, True), now=1010.0))  # busy: left out
    h.add(records_of(run(1011.0, 0.020, False, key="k2", script="other.py"), now=1011.0))  # another script
    h.add(records_of(run(1020.0, 0.150, False), now=1020.0))  # the run judged
    assert main(["history", "--history", str(path), "--host", "algo-1", "--figure", step]) == 0
    out = capsys.readouterr().out
    table, judged = out.split("\n\n")
    assert "median step (s) of train.py [k1]" in table.splitlines()[1] and "busy" in table, table
    lines = judged.splitlines()
    assert lines[0].startswith("The newest run (") and "job job-1020, 0.15 s) against this host's 6 comparable " \
           "quiet runs: median 0.1005 s, MAD 0.0005 s, band 0.09045-0.1106 s; outside it: DDP409" in lines[0], lines
    assert lines[1] == "compared with:"
    assert lines[2].split() == ["when", "job", "kind", "script", "host", "load", "median", "step", "(s)", "of",
                                "train.py", "[k1]"], lines[2]
    rows = lines[3:]
    assert len(rows) == 6 and all(" job-100" in r and " train.py " in r and " quiet " in r for r in rows), rows
    assert "job-1010" not in judged and "other.py" not in judged
    assert main(["history", "--history", str(path), "--host", "algo-1", "--figure", step, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    compared = got["compared"]
    assert compared["judged"] and compared["worse"] and compared["median"] == 0.1005 and len(compared["runs"]) == 6
    assert compared["runs"][0] == {"time": 1005.0, "job": "job-1005", "host": "algo-1", "kind": "run",
                                   "script": "train.py", "value": 0.101}, compared["runs"][0]
    assert got["columns"] == {step: "median step (s) of train.py [k1]"} and len(got["records"]) == 9
    # too few quiet runs: it says why nothing was judged
    few = tmp_path / "few.sqlite"
    for t in range(3):
        History(str(few)).add(records_of(run(float(t), 0.1, False), now=float(t)))
    History(str(few)).add(records_of(run(5.0, 0.1, True), now=5.0))
    History(str(few)).add(records_of(run(9.0, 0.2, False), now=9.0))
    assert main(["history", "--history", str(few), "--host", "algo-1", "--figure", step]) == 0
    assert "was not judged by DDP409: fewer than 5 comparable quiet runs before it (this host: 4 comparable, 3 " \
           "quiet, 1 busy, 0 of unknown load)" in capsys.readouterr().out


def test_only_the_ids_declared_kept_in_history_give_figures():
    """The straggler's lag and waited share come from the findings declared kept_in_history (the
    rank that arrives last), not from another finding with the same evidence (a node that does)."""
    kept = sorted(c.id for c in load_catalogue().values() if c.kept_in_history)
    assert kept == ["DDP877"]
    node = {"id": "DDP878", "evidence": {"median_lag_s": 0.05, "waited_s": 2.0, "span_s": 4.0}}
    assert not [k for k in figures_of({**REPORT, "findings": [node]}) if k.startswith("arrival.")]
