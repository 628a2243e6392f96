"""The evidence file (ddp_doctor/training/evidence_file.py): what a verdict was judged from, written
beside the report and judged again by `ddp-doctor analyze X.evidence.json`. Every field of the
judge's input survives the file; a replay gives the recorded verdict; a file that is not evidence
gets a clear error, never a traceback. (The suite's last check replays every evidence file the e2e
tests leave: tests/helpers/report_files.py.)"""
from __future__ import annotations

import dataclasses
import json
import signal
import sys
from pathlib import Path

import pytest
from helpers.procs import clean_env, run
from helpers.report_files import evidence_mismatches

from ddp_doctor.checks.job import JobEvidence
from ddp_doctor.findings import Finding
from ddp_doctor.processes.stop_signals import Interrupt
from ddp_doctor.report.publish import Output, publish
from ddp_doctor.report.sinks import evidence_path
from ddp_doctor.training import evidence_file
from ddp_doctor.training.job_report import judge, replay

FAILED = {1: {"rank": 1, "time": 10.0, "exit_code": 1,
              "exception": {"type": "ValueError", "message": "bad batch", "traceback": "", "time": 10.0}}}
PREFLIGHT = Finding(id="DDP402", category="communication", severity="warning", title="t", message="m", hint="h",
                    ranks=[0], time=1.0)


def every_field() -> JobEvidence:
    """JobEvidence with a value of its own kind in every field (tuples, sets, int keys, a stop)."""
    return JobEvidence(
        ranks=[0, 1], outcomes=dict(FAILED), exits={0: 1, 1: -9}, crashes={1: ("Fatal Python error", 12.5)},
        last_calls={1: {"op": "all_reduce", "pg": "0"}}, ledgers={0: {"entries": []}},
        init_calls=[{"rank": 0, "time": 1.0}], probes=[{"rank": 0, "steps": 3}],
        stopped_at={0: {"where": "train.py:3", "bound": 30.0}}, stacks={0: "File train.py"},
        interrupted=Interrupt(signal.SIGTERM, sender_pid=7, sender="timeout", at=99.0, to="the launcher",
                              repeated=(Interrupt(signal.SIGINT, at=100.0),)),
        hung=True, hang_timeout=30.0, slow={"rank": 1}, stuck_in_init=True, launcher_code=1, world_size=2,
        started=False, launched_alone=True, vanished={1: {"pid": 3}}, unlogged={1, 0}, launched_known="one node",
        clock_offsets={1: (0.25, 0.01)}, rank_branches={"t.py:3": [{"line": 2}]}, heartbeats={0: {"pid": 2}})


def test_every_field_of_the_judges_input_survives_the_file():
    ev = every_field()
    text = json.dumps(evidence_file.evidence_to_dict(ev))  # plain JSON: no object is left in it
    back = evidence_file.evidence_from_dict(json.loads(text))
    for f in dataclasses.fields(JobEvidence):
        if f.name != "interrupted":
            assert getattr(back, f.name) == getattr(ev, f.name), f.name
    assert back.interrupted.to_dict() == ev.interrupted.to_dict() and back.interrupted.at == 99.0
    assert back.interrupted.exit_code == 128 + signal.SIGTERM
    assert back.interrupted.describe() == ev.interrupted.describe()


def test_a_replay_gives_the_verdict_the_file_recorded(tmp_path: Path):
    judged = judge(JobEvidence(ranks=[0, 1], outcomes=FAILED), world={"launcher": "torchrun"}, earlier=[PREFLIGHT])
    assert judged.report["root_cause"]["id"] == "DDP800" and judged.code == 1
    doc = json.loads(json.dumps(judged.evidence, default=str))  # as read back from its file
    again = replay(doc)
    assert evidence_file.verdict(again.report, again.code) == doc["verdict"]
    assert ("DDP402", "warning", [0]) in [tuple(f) for f in doc["verdict"]["findings"]]  # the preflight's kept


def test_the_report_and_its_evidence_are_written_side_by_side_and_a_stale_one_is_removed(tmp_path: Path):
    judged = judge(JobEvidence(ranks=[0, 1], outcomes=FAILED), world={"launcher": "torchrun"})
    path = str(tmp_path / "r.json")
    publish(judged.report, Output(report_path=path, quiet=True), path=path, evidence=judged.evidence, env={})
    assert evidence_path(path) == str(tmp_path / "r.evidence.json")
    assert evidence_mismatches(tmp_path) == []
    assert evidence_file.read(evidence_path(path))["verdict"]["root_cause"] == {"id": "DDP800", "ranks": [1]}
    # a later report at the same path without evidence (a preflight's) leaves no evidence of the earlier job
    publish(judged.report, Output(report_path=path, quiet=True), path=path, env={})
    assert not Path(evidence_path(path)).exists()


@pytest.mark.invalid_reports_expected
def test_a_verdict_the_replay_does_not_reproduce_is_named(tmp_path: Path):
    judged = judge(JobEvidence(ranks=[0, 1], outcomes=FAILED), world={"launcher": "torchrun"})
    doc = json.loads(json.dumps(judged.evidence, default=str))
    doc["verdict"]["root_cause"] = {"id": "DDP803", "ranks": [0]}
    (tmp_path / "x.evidence.json").write_text(json.dumps(doc))
    (tmp_path / "cut.evidence.json").write_text(json.dumps(judged.evidence, default=str)[:-20])  # cut short
    doc["evidence"]["outcomes"] = ["not", "by", "rank"]
    (tmp_path / "odd.evidence.json").write_text(json.dumps(doc))
    found = dict(evidence_mismatches(tmp_path))
    assert set(found) == {str(tmp_path / f"{n}.evidence.json") for n in ("x", "cut", "odd")}
    assert "cannot be read as JSON" in found[str(tmp_path / "cut.evidence.json")][0]
    assert found[str(tmp_path / "x.evidence.json")] == [
        "root_cause: recorded {'id': 'DDP803', 'ranks': [0]}, replayed {'id': 'DDP800', 'ranks': [1]}"]
    assert "'outcomes' cannot be read" in found[str(tmp_path / "odd.evidence.json")][0]


def analyze(*args: str, cwd: Path) -> tuple[int, str, str]:
    p = run([sys.executable, "-m", "ddp_doctor", "analyze", *args], env=clean_env(), cwd=str(cwd), timeout=120)
    return p.rc, p.stdout, p.stderr


@pytest.mark.slow
@pytest.mark.invalid_reports_expected
def test_analyze_judges_an_evidence_file_alone_and_says_what_it_cannot_read(tmp_path: Path):
    judged = judge(JobEvidence(ranks=[0, 1], outcomes=FAILED), world={"launcher": "torchrun"})
    ev = tmp_path / "r.evidence.json"
    ev.write_text(json.dumps(judged.evidence, default=str))
    code, out, err = analyze(str(ev), "--report", str(tmp_path / "again.json"), cwd=tmp_path)
    assert code == 3 and "Root cause: DDP800" in out and err == "", (out, err)
    assert json.loads((tmp_path / "again.json").read_text())["root_cause"]["ranks"] == [1]
    # judged otherwise than recorded (rules that changed): said, the new verdict stands
    doc = json.loads(ev.read_text())
    doc["verdict"]["status"], doc["verdict"]["root_cause"] = "pass", None
    (tmp_path / "old.evidence.json").write_text(json.dumps(doc))
    code, out, err = analyze(str(tmp_path / "old.evidence.json"), cwd=tmp_path)
    assert code == 3 and "was judged pass when it was written; this ddp-doctor judges it fail (DDP800 on rank(s) 1)" \
        in err
    # with other artifacts: a usage error; a later version, or a broken field: bad input said clearly, exit 2
    (tmp_path / "log.txt").write_text("hello\n")
    code, _, err = analyze(str(ev), str(tmp_path / "log.txt"), cwd=tmp_path)
    assert code == 2 and "it is judged alone" in err
    (tmp_path / "new.evidence.json").write_text(json.dumps({**doc, "version": 99}))
    code, out, err = analyze(str(tmp_path / "new.evidence.json"), cwd=tmp_path)
    assert code == 2 and "version 99" in err and "Traceback" not in err and out == ""
    doc["evidence"]["crashes"] = {"1": "one value"}
    (tmp_path / "bad.evidence.json").write_text(json.dumps(doc))
    code, out, err = analyze(str(tmp_path / "bad.evidence.json"), cwd=tmp_path)
    assert code == 2 and "'crashes' cannot be read" in err and "Traceback" not in err
