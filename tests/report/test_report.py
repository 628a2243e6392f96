"""The report: merging, status, root cause, schema, text rendering, launch-dir and measurement merging."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddp_doctor.findings import ROOT_CAUSE, Finding, format_ranks
from ddp_doctor.preflight_ranks.one_rank import merge_measurements
from ddp_doctor.processes.launch_dir import merge_launch_dir
from ddp_doctor.report import build as reportlib
from ddp_doctor.report.render import render_text, verdict_line

TOP_KEYS = {"schema", "schema_version", "tool_version", "status", "phase", "world", "ranks", "findings",
            "measurements", "root_cause"}
FINDING_KEYS = {"id", "category", "severity", "title", "message", "hint", "ranks", "evidence", "phase", "time",
                "caused_by", "cause_class", "action"}
WORLD = {"launcher": "torchrun", "backend": "gloo", "world_size": 8, "nnodes": 2, "nproc_per_node": 4,
         "master_addr": "10.0.0.1", "master_port": 29500}


def fnd(id: str = "DDP101", *, severity: str = "error", message: str = "m", hint: str = "h",
        ranks: list[int] | None = None, time: float = 100.0, category: str = "launcher_env",
        evidence: dict[str, Any] | None = None, caused_by: str | None = None) -> Finding:
    return Finding(id=id, category=category, severity=severity, title=f"title {id}", message=message,
                   hint=hint, ranks=ranks if ranks is not None else [0], evidence=evidence or {}, time=time,
                   caused_by=caused_by)


# ---------------------------------------------------------------- ranges

@pytest.mark.parametrize("ranks,text", [
    ([], ""), ([5], "5"), ([0, 1, 2, 3, 7], "0-3, 7"), ([7, 3, 2, 1, 0, 3], "0-3, 7"),
    ([0, 2, 4], "0, 2, 4"), ([1, 2, 5, 6, 7, 9], "1-2, 5-7, 9"),
])
def test_format_ranks(ranks: list[int], text: str) -> None:
    assert format_ranks(ranks) == text


# ---------------------------------------------------------------- merging

def test_same_problem_on_two_ranks_is_one_finding() -> None:
    merged = reportlib.merge_findings([
        fnd(ranks=[1], time=105.0), fnd(ranks=[0], time=101.0), fnd(ranks=[1], time=99.5)])
    assert len(merged) == 1
    assert merged[0].ranks == [0, 1]
    assert merged[0].time == 99.5


def test_different_messages_or_ids_stay_apart() -> None:
    merged = reportlib.merge_findings([
        fnd(message="RANK=1"), fnd(message="RANK=2"), fnd(id="DDP102", message="RANK=1")])
    assert len(merged) == 3


def test_merge_does_not_mutate_inputs() -> None:
    a, b = fnd(ranks=[0], time=5.0), fnd(ranks=[1], time=3.0)
    reportlib.merge_findings([a, b])
    assert a.ranks == [0] and a.time == 5.0 and b.ranks == [1]


def test_merge_orders_by_severity_then_time() -> None:
    merged = reportlib.merge_findings([
        fnd("DDP105", severity="info", time=1.0), fnd("DDP104", severity="warning", time=2.0),
        fnd("DDP103", severity="error", time=9.0), fnd("DDP102", severity="error", time=3.0)])
    assert [f.id for f in merged] == ["DDP102", "DDP103", "DDP104", "DDP105"]


def test_status_of() -> None:
    assert reportlib.status_of([]) == "pass"
    assert reportlib.status_of([fnd(severity="info")]) == "pass"
    assert reportlib.status_of([fnd(severity="info"), fnd(severity="warning")]) == "warn"
    assert reportlib.status_of([fnd(severity="warning"), fnd(severity="error")]) == "fail"


def test_root_cause_is_earliest_error() -> None:
    early_warning = fnd("DDP100", severity="warning", time=1.0)
    late = fnd("DDP320", time=50.0, ranks=[0])
    early = fnd("DDP310", time=10.0, ranks=[3])
    cause = reportlib.root_cause([early_warning, late, early])
    assert cause is not None and cause.id == "DDP310"
    assert reportlib.root_cause([early_warning]) is None
    assert reportlib.root_cause([]) is None


def test_root_cause_passes_over_consequences() -> None:
    consequence = fnd("DDP320", time=1.0, caused_by=ROOT_CAUSE)
    real = fnd("DDP311", time=20.0)
    cause = reportlib.root_cause([consequence, real])
    assert cause is not None and cause.id == "DDP311"
    # when only consequences exist, the earliest of them is still named
    only = reportlib.root_cause([fnd("DDP320", time=5.0, caused_by=ROOT_CAUSE),
                                 fnd("DDP324", time=2.0, caused_by="DDP311")])
    assert only is not None and only.id == "DDP324"


def test_caused_by_is_a_field_resolved_by_the_report_and_kept_readable_for_schema_1() -> None:
    rep = reportlib.build_report(world={}, ranks=[], findings=[
        fnd("DDP320", time=1.0, caused_by=ROOT_CAUSE), fnd("DDP311", time=20.0), fnd("DDP324", caused_by="DDP311")])
    by_id = {f["id"]: f for f in rep["findings"]}
    assert rep["root_cause"]["id"] == "DDP311" and rep["root_cause"]["caused_by"] is None
    assert by_id["DDP320"]["caused_by"] == "DDP311" and by_id["DDP324"]["caused_by"] == "DDP311"
    # readers of schema 1 find what they read before
    assert by_id["DDP320"]["evidence"] == {"consequence": True, "explained_by": "DDP311"}
    assert "consequence" not in by_id["DDP311"]["evidence"]
    # a report written before the field still says which findings are consequences
    old = Finding.from_dict({"id": "DDP802", "evidence": {"consequence": True}})
    assert old.caused_by == ROOT_CAUSE
    assert Finding.from_dict({"id": "DDP802", "evidence": {"consequence": True, "explained_by": "DDP893"}}
                             ).caused_by == "DDP893"
    assert Finding.from_dict(by_id["DDP311"]).caused_by is None


def test_root_cause_tie_broken_by_id() -> None:
    cause = reportlib.root_cause([fnd("DDP202", time=1.0), fnd("DDP201", time=1.0)])
    assert cause is not None and cause.id == "DDP201"


# ---------------------------------------------------------------- the report document

def test_build_report_schema() -> None:
    findings = [fnd("DDP101", ranks=[1], time=3.0), fnd("DDP101", ranks=[0], time=2.0),
                fnd("DDP205", severity="warning", category="sagemaker_job", ranks=[0], time=1.0)]
    measurements = {"all_reduce": [{"bytes": 1048576, "time_us": 10.0, "algbw_gbps": 1.0,
                                    "busbw_gbps": 1.0, "correct": True}]}
    rep = reportlib.build_report(world=WORLD, ranks=[{"rank": 1}, {"rank": 0}, {"rank": None}],
                                 findings=findings, measurements=measurements)
    assert set(rep) == TOP_KEYS
    assert rep["schema"] == "ddp-doctor.report" and rep["schema_version"] == 1
    assert rep["tool_version"] == "0.1.0"
    assert rep["status"] == "fail" and rep["phase"] == "preflight"
    assert rep["world"] == WORLD
    assert [r["rank"] for r in rep["ranks"]] == [0, 1, None]
    assert len(rep["findings"]) == 2
    for f in rep["findings"]:
        assert set(f) == FINDING_KEYS
    first = rep["findings"][0]
    assert first["id"] == "DDP101" and first["ranks"] == [0, 1] and first["time"] == 2.0
    assert set(rep["root_cause"]) == FINDING_KEYS
    assert rep["root_cause"]["id"] == "DDP101"
    assert rep["measurements"] == measurements
    json.dumps(rep)  # serialisable as is
    assert reportlib.exit_code(rep) == 3


def test_passing_report() -> None:
    rep = reportlib.build_report(world=WORLD, ranks=[], findings=[fnd(severity="warning")], phase="training")
    assert rep["status"] == "warn" and rep["root_cause"] is None and rep["phase"] == "training"
    assert rep["measurements"] == {}
    assert reportlib.exit_code(rep) == 0
    assert reportlib.exit_code(reportlib.build_report(world=WORLD, ranks=[], findings=[])) == 0


def test_findings_round_trip() -> None:
    rep = reportlib.build_report(world=WORLD, ranks=[], findings=[fnd(ranks=[2, 1], evidence={"k": [1]})])
    [back] = reportlib.findings_of(rep)
    assert back.ranks == [1, 2] and back.evidence == {"k": [1]} and back.title == "title DDP101"


# ---------------------------------------------------------------- text

def test_render_text_failure() -> None:
    findings = [fnd("DDP310", message="MASTER_ADDR=nohost does not resolve", hint="set MASTER_ADDR",
                    ranks=[0, 1, 2, 3, 7], time=1.0, category="network"),
                fnd("DDP205", severity="warning", message="warned", hint="warn hint", ranks=[4], time=2.0)]
    rep = reportlib.build_report(world=WORLD, ranks=[], findings=findings)
    text = render_text(rep, report_path="/tmp/r.json")
    first = text.splitlines()[0]
    assert "FAIL" in first and "1 error(s), 1 warning(s)" in first
    assert "8 rank(s) on 2 node(s)" in first and "torchrun" in first and "gloo" in first
    assert "Root cause: DDP310 title DDP310 [ranks 0-3, 7]" in text
    assert "MASTER_ADDR=nohost does not resolve" in text
    assert "Fix: set MASTER_ADDR" in text
    assert "Errors:" not in text and "Warnings:" in text  # the root cause is said once, not again under Errors
    assert text.count("MASTER_ADDR=nohost does not resolve") == 1
    assert "DDP205 title DDP205 [rank 4]" in text
    assert "Fix: warn hint" in text
    assert text.rstrip().endswith("Report: /tmp/r.json")


def test_render_text_pass_and_info_folding() -> None:
    infos = [fnd(f"DDP70{i}", severity="info", message=f"info {i}", hint=f"ih{i}") for i in range(6)]
    rep = reportlib.build_report(world=WORLD, ranks=[], findings=infos)
    text = render_text(rep)
    assert text.splitlines()[0].startswith("ddp-doctor preflight: PASS (0 error(s), 0 warning(s))")
    assert "Root cause" not in text
    assert "Info: 6 (shown with --verbose" in text and "info 3" not in text
    verbose = render_text(rep, verbose=True)
    assert "info 3" in verbose and "Fix: ih3" in verbose
    # one rule whatever the status or the count: info findings are counted, shown with --verbose
    few = render_text(reportlib.build_report(world=WORLD, ranks=[], findings=infos[:2]))
    assert "Info: 2 (shown with --verbose" in few and "info 1" not in few
    warned = render_text(reportlib.build_report(world=WORLD, ranks=[], findings=[*infos[:2], fnd(
        "DDP603", severity="warning", message="a warning", hint="wh")]))
    assert "Info: 2 (shown with --verbose" in warned and "info 1" not in warned and "a warning" in warned


def test_render_text_measurements() -> None:
    m = {"all_reduce": [{"bytes": 1024, "time_us": 5.0, "algbw_gbps": 0.1, "busbw_gbps": 0.2, "correct": True},
                        {"bytes": 1048576, "time_us": 1234.4, "algbw_gbps": 0.8, "busbw_gbps": 1.6,
                         "correct": False}]}
    text = render_text(reportlib.build_report(world=WORLD, ranks=[], findings=[], measurements=m))
    assert "all_reduce: 1048576 bytes in 1234 us, busbw 1.600 GB/s, WRONG" in text
    one = {"all_reduce": [{"bytes": 268435456, "time_us": 24.1, "algbw_gbps": 11126.9, "busbw_gbps": 0.0,
                           "correct": True, "nranks": 1}]}
    text = render_text(reportlib.build_report(world=WORLD, ranks=[], findings=[], measurements=one))
    assert "all_reduce: 268435456 bytes over 1 rank: no link crossed, no bandwidth to measure; correct" in text
    assert "GB/s" not in text


# ---------------------------------------------------------------- launch dir (self-launched preflight)

def write(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data))


def partial(rank: int, *, final: bool, findings: list[Finding] | None = None) -> dict[str, Any]:
    return {"rank": rank, "final": final,
            "view": {"rank": rank, "local_rank": rank, "node_rank": 0, "hostname": "h", "device": "cpu"},
            "findings": [f.to_dict() for f in findings or []]}


def test_merge_launch_dir_with_merged_report(tmp_path: Path) -> None:
    merged = reportlib.build_report(
        world={**WORLD, "world_size": 2, "nnodes": 1},
        ranks=[{"rank": r, "local_rank": r, "node_rank": 0, "host": "h", "device": "cpu"} for r in (0, 1)],
        findings=[fnd("DDP205", severity="warning", ranks=[0, 1])],
        measurements={"all_reduce": [{"bytes": 8, "time_us": 1.0, "algbw_gbps": 0.0, "busbw_gbps": 0.0,
                                      "correct": True}]})
    write(tmp_path / "report.json", merged)
    # partials of ranks the merged report covers are not counted twice
    write(tmp_path / "rank-1.json", partial(1, final=True, findings=[fnd("DDP205", severity="warning", ranks=[1])]))
    rep = merge_launch_dir(str(tmp_path), 2, 0, False, 100.0)
    assert set(rep) == TOP_KEYS
    assert rep["status"] == "warn"
    assert [f["id"] for f in rep["findings"]] == ["DDP205"]
    assert rep["findings"][0]["ranks"] == [0, 1]
    assert rep["world"]["launched_by"] == "ddp-doctor" and rep["world"]["world_size"] == 2
    assert rep["measurements"]["all_reduce"][0]["bytes"] == 8


def test_merge_launch_dir_only_partials(tmp_path: Path) -> None:
    write(tmp_path / "rank-0.json", partial(0, final=True, findings=[fnd("DDP311", ranks=[0], time=2.0)]))
    write(tmp_path / "rank-1.json", partial(1, final=True, findings=[fnd("DDP311", ranks=[1], time=1.0)]))
    (tmp_path / "rank-2.json").write_text("{truncated")  # a rank killed mid-write is skipped
    rep = merge_launch_dir(str(tmp_path), 2, 1, False, 100.0)
    assert [f["id"] for f in rep["findings"]] == ["DDP311"]
    assert rep["findings"][0]["ranks"] == [0, 1]
    assert [r["rank"] for r in rep["ranks"]] == [0, 1]
    assert rep["world"]["launcher"] == "torchrun" and rep["world"]["world_size"] == 2
    assert rep["status"] == "fail" and rep["root_cause"]["id"] == "DDP311"


def test_merge_launch_dir_missing_rank_is_ddp003(tmp_path: Path) -> None:
    write(tmp_path / "rank-0.json", partial(0, final=True))
    write(tmp_path / "rank-1.json", partial(1, final=False, findings=[fnd("DDP205", severity="warning", ranks=[1])]))
    rep = merge_launch_dir(str(tmp_path), 3, -9, False, 100.0)
    lost = [f for f in rep["findings"] if f["id"] == "DDP003"]
    assert sorted(r for f in lost for r in f["ranks"]) == [1, 2]
    assert all("status -9" in f["message"] for f in lost)
    assert any(f["id"] == "DDP205" for f in rep["findings"])  # what rank 1 left is kept
    assert rep["status"] == "fail"
    assert reportlib.exit_code(rep) == 3


def test_merge_launch_dir_timeout_and_empty(tmp_path: Path) -> None:
    rep = merge_launch_dir(str(tmp_path), 2, None, True, 180.0)
    lost = [f for f in rep["findings"] if f["id"] == "DDP003"]
    assert sorted(r for f in lost for r in f["ranks"]) == [0, 1]
    assert "stopped after 180 s" in lost[0]["message"]
    assert lost[0]["evidence"] == {"launcher_exit": None, "timed_out": True}


# ---------------------------------------------------------------- measurements

def m(bytes_: int, time_us: float, correct: bool = True) -> dict[str, Any]:
    return {"bytes": bytes_, "time_us": time_us, "algbw_gbps": bytes_ / time_us / 1e3,
            "busbw_gbps": bytes_ / time_us / 1e3, "correct": correct}


def test_merge_measurements_slowest_wins_and_correct_only_if_all() -> None:
    into: dict[str, Any] = {}
    merge_measurements(into, {"all_reduce": [m(1024, 10.0), m(8, 1.0)]})
    merge_measurements(into, {"all_reduce": [m(1024, 30.0), m(8, 0.5, correct=False)]})
    merge_measurements(into, {"all_reduce": [m(1024, 20.0)], "broadcast": [m(64, 2.0)]})
    small, big = into["all_reduce"]
    assert small["bytes"] == 8 and small["time_us"] == 1.0 and small["correct"] is False
    assert big["bytes"] == 1024 and big["time_us"] == 30.0 and big["correct"] is True
    assert into["broadcast"] == [m(64, 2.0)]


def test_merge_measurements_slower_rank_wrong() -> None:
    into: dict[str, Any] = {}
    merge_measurements(into, {"all_reduce": [m(1024, 10.0)]})
    merge_measurements(into, {"all_reduce": [m(1024, 50.0, correct=False)]})
    merge_measurements(into, {"all_reduce": [m(1024, 5.0)]})
    [only] = into["all_reduce"]
    assert only["time_us"] == 50.0 and only["correct"] is False


def test_merge_measurements_does_not_alias_input() -> None:
    src = {"all_reduce": [m(8, 1.0)]}
    into: dict[str, Any] = {}
    merge_measurements(into, src)
    merge_measurements(into, {"all_reduce": [m(8, 0.5, correct=False)]})
    assert src["all_reduce"][0]["correct"] is True


def test_render_text_unknown_world_size() -> None:
    rep = reportlib.build_report(world={"launcher": "env", "backend": "gloo", "world_size": None},
                                 ranks=[], findings=[])
    first = render_text(rep).splitlines()[0]
    assert "None rank(s)" not in first and "world size unknown" in first
    assert "launcher env, backend gloo" in first


def test_render_text_groups_consequences_under_the_cause_with_the_users_line_and_hides_info_on_failure() -> None:
    from ddp_doctor.findings import ROOT_CAUSE
    cause = fnd("DDP800", message="rank 1 raised ValueError: bad", hint="fix it", ranks=[1], time=1.0,
                evidence={"raised_at": "train.py:7 in <module>"}, category="training_failure")
    peer = fnd("DDP802", message="rank 0 failed after rank 1 failed", ranks=[0], time=2.0, caused_by=ROOT_CAUSE)
    other = fnd("DDP310", message="another error", ranks=[3], time=3.0)
    info = fnd("DDP500", severity="info", message="no GPU", ranks=[0])
    m = {"all_reduce": [{"bytes": 1024, "time_us": 5.0, "algbw_gbps": 0.1, "busbw_gbps": 0.2, "correct": True}]}
    rep = reportlib.build_report(world={**WORLD, "launched_by": "ddp-doctor"}, ranks=[],
                                 findings=[cause, peer, other, info], measurements=m)
    lines = render_text(rep, report_path="r.json").splitlines()
    assert lines[0].endswith("launcher ddp-doctor (4 local rank(s) per node), backend gloo"), lines[0]
    assert lines[1:5] == ["Root cause: DDP800 title DDP800 [rank 1]", "  rank 1 raised ValueError: bad",
                          "  at train.py:7 in <module>", "  Fix: fix it"]
    # what to do with the job, from the root cause's class (a training failure's: the code)
    assert lines[5] == "  Next: fix the code (cause: code); running the job again fails the same way"
    assert rep["root_cause"]["cause_class"] == "code" and rep["root_cause"]["action"] == "fix_code"
    assert lines[6] == "  Then, as a consequence:"
    assert lines[7] == "    DDP802 [rank 0]: rank 0 failed after rank 1 failed"
    assert lines[8:10] == ["Other errors:", "  DDP310 title DDP310 [rank 3]"]
    text = "\n".join(lines)
    assert "no GPU" not in text and "Info: 1 (shown with --verbose" in text and "all_reduce" not in text
    assert sum(line.count("rank 0 failed after") for line in lines) == 1  # each finding once
    verbose = render_text(rep, verbose=True)
    assert "no GPU" in verbose and "all_reduce: 1024 bytes" in verbose
    # one headline for every command: the one-line verdict starts as the text does
    assert verdict_line(rep, report_path="r.json") == (
        lines[0] + "; root cause DDP800 [rank 1] title DDP800 - report r.json")
    ok = reportlib.build_report(world=WORLD, ranks=[], findings=[])
    assert verdict_line(ok, report_path="r.json", command="run") == (
        "ddp-doctor run: PASS (0 error(s), 0 warning(s)) - 8 rank(s) on 2 node(s), launcher torchrun, backend gloo"
        " - report r.json")
    unknown = reportlib.build_report(world={}, ranks=[], findings=[])  # a rank that knows nothing of its world
    assert verdict_line(unknown) == ("ddp-doctor preflight: PASS (0 error(s), 0 warning(s)) - world size unknown, "
                                     "launcher unknown, backend unknown")


def test_render_text_of_a_planned_sagemaker_job_says_the_job_not_a_launcher() -> None:
    world = {"launcher": "python", "backend": "nccl", "world_size": 16, "nnodes": 2, "planned": True,
             "instance_type": "ml.p4d.24xlarge", "instance_count": 2, "distribution": "torch_distributed"}
    rep = reportlib.build_report(world=world, ranks=[], findings=[fnd("DDP901", message="m", hint="h")])
    first = render_text(rep, command="sagemaker-check").splitlines()[0]
    assert first == ("ddp-doctor sagemaker-check: FAIL (1 error(s), 0 warning(s)) - planned job: 2 x ml.p4d.24xlarge, "
                     "16 rank(s), distribution torch_distributed")


def test_the_status_is_coloured_on_a_terminal_unless_no_color() -> None:
    import io

    from ddp_doctor.report.publish import wants_colour
    from ddp_doctor.report.render import coloured

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    line = verdict_line(reportlib.build_report(world=WORLD, ranks=[], findings=[fnd()]))
    assert coloured(line).startswith("ddp-doctor preflight: \033[1;31mFAIL\033[0m (1 error(s)")
    assert coloured("ddp-doctor training: PASS (0 error(s)").startswith("ddp-doctor training: \033[1;32mPASS")
    assert coloured("no headline here: FAIL") == "no headline here: FAIL"
    assert wants_colour(Tty(), {}) and not wants_colour(io.StringIO(), {})
    assert not wants_colour(Tty(), {"NO_COLOR": "1"}) and wants_colour(Tty(), {"NO_COLOR": ""})


def test_the_world_of_ranks_the_script_started_comes_from_their_records():
    from ddp_doctor.report.build import with_started_ranks
    none = {"launcher": "none", "backend": "gloo", "world_size": None, "nnodes": None, "nproc_per_node": None}
    ray = [{"rank": r, "world_size": 2, "host": "vm", "started_by": "ray"} for r in (0, 1)]
    got = with_started_ranks(none, [*ray, {"rank": None, "world_size": None, "host": "vm"}])  # the driver's own
    assert (got["launcher"], got["world_size"], got["nnodes"], got["nproc_per_node"]) == ("ray", 2, 1, 2)
    # one node's records of a 4-rank job: the nodes are not counted
    part = with_started_ranks(none, [{"rank": r, "world_size": 4, "host": "a", "started_by": "spawn"} for r in (0, 1)])
    assert (part["launcher"], part["world_size"], part["nnodes"], part["nproc_per_node"]) == ("spawn", 4, None, None)
    # a launcher's own world, or ranks nobody started from the script, stay as they were
    launched = {**none, "launcher": "torchrun", "world_size": 2}
    assert with_started_ranks(launched, ray) is launched
    assert with_started_ranks(none, [{"rank": 0, "world_size": 2, "host": "vm"}]) is none
