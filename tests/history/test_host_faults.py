"""A host the root causes keep naming (action exclude_host): each host's record says so
(history/from_report.HOST_FAULT), DDP607 names it from its own past (checks/history_rules), and
`ddp-doctor history --hosts` ranks the hosts by such failures."""
from __future__ import annotations

import json
from pathlib import Path

from helpers.procs import DDP, assert_clean_output, clean_env, run

from ddp_doctor.checks.history_rules import against_history, host_fault_findings
from ddp_doctor.history.database import History, RunRecord
from ddp_doctor.history.from_report import HOST_FAULT, records_of


def _report(status: str = "fail", cause: dict | None = None) -> dict:
    ranks = [{"rank": r, "host": f"algo-{r + 1}"} for r in range(2)]
    return {"phase": "training", "status": status, "world": {"world_size": 2, "nnodes": 2, "nproc_per_node": 1},
            "ranks": ranks, "findings": [], "measurements": {}, "root_cause": cause}


ECC = {"id": "DDP506", "action": "exclude_host", "cause_class": "host", "ranks": [1], "hosts": ["algo-2"]}


def test_the_blamed_host_and_only_it_keeps_the_fault_in_its_record():
    recs = {r.host: r for r in records_of(_report(cause=ECC), now=1.0)}
    assert recs["algo-2"].figures == {HOST_FAULT + "DDP506": 1.0}
    assert recs["algo-1"].figures == {}
    code = {"id": "DDP800", "action": "fix_code", "cause_class": "code", "ranks": [1]}
    assert all(not r.figures for r in records_of(_report(cause=code), now=1.0))


def _past(host: str, ids: list[str | None]) -> list[RunRecord]:
    return [RunRecord(time=1_760_000_000.0 + i, kind="run", host=host,
                      figures={HOST_FAULT + cid: 1.0} if cid else {}) for i, cid in enumerate(ids)]


def test_a_host_named_twice_before_is_named_once_only_is_not():
    now = [RunRecord(time=2e9, kind="run", host="algo-2")]
    [f] = host_fault_findings(now, _past("algo-2", ["DDP506", None, "DDP401", None]))
    assert f.id == "DDP607" and f.severity == "warning" and f.kind == ("host", "exclude_host")
    assert f.message.startswith("host algo-2 was named by the root cause of 2 of its last 4 run(s) in the history "
                                "(DDP401, DDP506; the last at ")
    assert host_fault_findings(now, _past("algo-2", ["DDP506", None])) == []
    assert host_fault_findings(now, _past("algo-1", ["DDP506", "DDP506"])) == []  # another host's past


def _history(tmp_path: Path) -> Path:
    path = tmp_path / "history.sqlite"
    recs = [r for t in range(3) for r in records_of(_report(cause=ECC), now=1_760_000_000.0 + t)]
    recs += records_of(_report(status="pass"), now=1_760_000_100.0)
    assert History(str(path)).add(recs) is None
    return path


def test_the_next_run_on_that_host_is_told(tmp_path):
    env = {"DDP_DOCTOR_HISTORY": str(_history(tmp_path))}
    found = against_history(_report(status="pass"), env, ())
    assert [(f.id, f.evidence["host"]) for f in found] == [("DDP607", "algo-2")]
    assert "3 of its last 4 run(s)" in found[0].message


def test_history_hosts_ranks_the_hosts_by_their_faults(tmp_path):
    _history(tmp_path)
    res = run([*DDP, "history", "--history", "history.sqlite", "--hosts"], clean_env(), str(tmp_path), timeout=60)
    assert_clean_output(res)
    assert res.rc == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("2 host(s) in ")
    assert lines[1].split() == ["host", "runs", "host", "faults", "IDs", "last", "fault"]
    assert lines[2].split()[:5] == ["algo-2", "4", "3", "DDP506", "x3"] and lines[3].split()[:3] == ["algo-1", "4", "0"]
    res = run([*DDP, "history", "--history", "history.sqlite", "--hosts", "--json"], clean_env(), str(tmp_path),
              timeout=60)
    hosts = json.loads(res.stdout)["hosts"]
    assert [(h["host"], h["host_faults"], h["ids"]) for h in hosts] == [("algo-2", 3, {"DDP506": 3}), ("algo-1", 0, {})]
