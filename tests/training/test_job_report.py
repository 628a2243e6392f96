"""One builder for a training job's report (ddp_doctor/training/job_report.py): the job's verdict runs
as a stage, so a bug in a rule is a finding in a report that is still written."""
from __future__ import annotations

import signal

from ddp_doctor.checks import job as job_rules
from ddp_doctor.checks.job import JobEvidence, exit_code_without_rules
from ddp_doctor.exit_codes import EXIT_HANG
from ddp_doctor.training.job_report import job_report

FAILED = {1: {"rank": 1, "time": 10.0, "exit_code": 1,
              "exception": {"type": "ValueError", "message": "bad batch", "traceback": "", "time": 10.0}}}


def test_a_failing_rank_is_judged_and_its_status_is_the_jobs():
    rep, code = job_report(JobEvidence(ranks=[0, 1], outcomes=FAILED), world={"launcher": "torchrun"})
    assert code == 1 and rep["status"] == "fail"
    assert rep["root_cause"]["id"] == "DDP800" and rep["root_cause"]["ranks"] == [1]


STOPPED = {"exit_code": 143, "exception": None, "phase": "training",
           "interrupted": {"signal": "SIGTERM", "signo": 15, "sender_pid": 7}}


def test_a_rank_its_launcher_stopped_after_a_peer_vanished_is_named_as_the_consequence():
    """Under an outside launcher a rank notes the launcher's SIGTERM itself: when it came before the
    rank's own lost-peer error (a race), the report still names the rank and what it was stopped for;
    a stop with no failure anywhere is the whole job's stop, never a consequence."""
    gone = {0: {"pid": 41, "time": 9.0, "where": "train.py:12 in <module>"}}
    rep, code = job_report(JobEvidence(ranks=[0, 1], outcomes={1: STOPPED}, vanished=gone), world={})
    assert rep["status"] == "fail" and rep["root_cause"]["id"] == "DDP803" and rep["root_cause"]["ranks"] == [0]
    (stopped,) = [f for f in rep["findings"] if f["ranks"] == [1]]
    assert stopped["id"] == "DDP802" and stopped["caused_by"] == "DDP803" and stopped["severity"] == "error"
    assert "stopped by its launcher (SIGTERM) after rank 0 failed" in stopped["message"]
    # after a peer's own error too; and a rank that also raised is judged by its error, once
    rep, _ = job_report(JobEvidence(ranks=[0, 1, 2], outcomes={**FAILED, 2: STOPPED}), world={})
    assert [(f["id"], f["ranks"]) for f in rep["findings"] if f["ranks"] == [2]] == [("DDP802", [2])]
    # nobody failed: nothing here (the job's own stop, DDP808, says it when the job was stopped)
    rep, _ = job_report(JobEvidence(ranks=[0, 1], outcomes={0: STOPPED, 1: STOPPED}), world={})
    assert not [f for f in rep["findings"] if f["id"] == "DDP802"]


def test_a_rule_that_raises_is_ddp001_and_the_report_is_still_built(monkeypatch):
    def broken(ev, earlier):
        raise KeyError("a bug in a rule")
    monkeypatch.setattr(job_rules, "job_findings", broken)
    import ddp_doctor.training.job_report as builder
    monkeypatch.setattr(builder, "job_findings", broken)
    rep, code = job_report(JobEvidence(ranks=[0, 1], outcomes=FAILED), world={})
    assert code == 1  # the job's own status, from the raw evidence
    assert rep["status"] == "fail" and [f["id"] for f in rep["findings"]] == ["DDP001"]
    assert "KeyError" in rep["findings"][0]["message"] and "a bug in a rule" in rep["findings"][0]["message"]


def test_the_exit_code_without_rules_follows_the_raw_evidence():
    class Stop:
        exit_code = 143
    assert exit_code_without_rules(JobEvidence(interrupted=Stop())) == 143
    assert exit_code_without_rules(JobEvidence(hung=True)) == EXIT_HANG
    assert exit_code_without_rules(JobEvidence(exits={0: -signal.SIGKILL})) == 137
    assert exit_code_without_rules(JobEvidence()) == 0


def test_a_callbacks_probe_records_alone_make_a_report():
    rep, code = job_report(JobEvidence(probes=[]), world={})
    assert code == 0 and rep["status"] == "pass" and rep["phase"] == "training"


def test_ranks_that_trained_alone_on_the_same_data_are_said_once(monkeypatch):
    from ddp_doctor.checks import init_arguments, sampler
    from ddp_doctor.checks.internal import event_finding
    from ddp_doctor.findings import Finding

    def alone(*args) -> Finding:
        return event_finding(init_arguments.NO_PROCESS_GROUP, "ranks 0-1 ended without calling init_process_group",
                             rank=None, ranks=[0, 1], phase="training")
    monkeypatch.setattr(job_rules, "no_process_group_finding", alone)
    ev = JobEvidence(ranks=[0, 1], launched_alone=True)
    assert [f.id for f in job_rules.job_findings(ev)[0]] == ["DDP876"]
    same_data = event_finding(sampler.TRAINED_ALONE, "ranks 0-1 each trained on all the data", rank=None,
                              ranks=[0, 1], phase="training")
    monkeypatch.setattr(job_rules, "probe_findings", lambda probes, failed, load=None: [same_data])
    assert [f.id for f in job_rules.job_findings(ev)[0]] == ["DDP855"]


def test_the_runs_pace_is_measured_and_compared_with_the_hosts_history_only_when_asked(tmp_path):
    import dataclasses

    from ddp_doctor.history.database import History, RunRecord
    from ddp_doctor.training.job_report import step_figures
    probes = [{"rank": r, "step_interval": s, "steps": 30, "script": {"name": "train.py", "key": "k1"}}
              for r, s in ((0, 0.30), (1, 0.32), (2, 0.31))] + [{"rank": 3, "step_interval": None, "steps": 1}]
    assert step_figures(probes) == {"median_step_s": 0.31, "steps": 30, "ranks_measured": 3, "script": "train.py",
                                    "script_key": "k1"}
    assert step_figures([{"rank": 0, "steps": 2}]) == {}
    ranks = [{"rank": 0, "host": "h1", "versions": {}}]
    hist = str(tmp_path / "h.sqlite")
    past = RunRecord(time=1.0, kind="run", host="h1", world_size=None, nnodes=None, nproc_per_node=None,
                     backend=None, versions={}, figures={"training.median_step_s@k1": 0.2})
    History(hist).add([dataclasses.replace(past, time=float(i)) for i in range(6)])
    rep, _ = job_report(JobEvidence(probes=probes), world={}, ranks=ranks)
    assert rep["measurements"]["training"]["median_step_s"] == 0.31 and rep["status"] == "pass"
    rep, _ = job_report(JobEvidence(probes=probes), world={}, ranks=ranks,
                        history_env={"DDP_DOCTOR_HISTORY": hist})
    assert [f["id"] for f in rep["findings"]] == ["DDP409"] and rep["status"] == "warn", rep["findings"]
    # history off: nothing read
    rep, _ = job_report(JobEvidence(probes=probes), world={}, ranks=ranks, history_env={"DDP_DOCTOR_HISTORY": "off"})
    assert rep["findings"] == []
