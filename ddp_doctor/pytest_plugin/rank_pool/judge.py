"""ddp-doctor's judgement of a failed or hung distributed test: the judgement `ddp-doctor run` makes
(the job's verdict, checks/job.py, through training/job_report.py: each rank's ending, the hang,
and the ledgers of collectives, checks/collectives.py), fed with what the test's ranks left.

    parent (no torch)                      child of the forkserver (torch loaded)
    judge_inputs(RunResult) ──("judge")──> judge_and_write(inputs): judge(inputs) -> judgement.json
    read back by RankPool.judge; verdict.classify words it

What each rank gives, as `ddp-doctor run` has it from a script's ranks:
- its outcome: the exception of a rank whose test raised (type, message, traceback, time), or
  none; a rank that died on its own, its exit status (and faulthandler's dump for a fatal signal);
- at a hang (the test's timeout), where each live rank was (its innermost line of the test's code,
  and whether it sat inside a collective) and its Python stack, as `run` has them at a hang;
- its ledger of collectives (ledger-RANK.json, rank_pool/ledgers.py), from which the verdict names
  the rank that went its own way and marks the ranks that only waited for it.

The judgement is: the findings (merged as the report merges them), the root cause
(report.build.root_cause), and each rank's part: the cause, or a consequence (waiting in the
collective at fault, or failed after the cause).
"""
from __future__ import annotations

import json
import os
from typing import Any

from ddp_doctor.pytest_plugin.rank_pool.results import RunResult
from ddp_doctor.pytest_plugin.rank_pool.wire import judgement_path

CRASH_TAIL = 8000  # characters of a crashed rank's stderr searched for faulthandler's dump


# ---------------------------------------------------------------- parent side
def judge_inputs(res: RunResult) -> dict[str, Any]:
    """What the ranks of a finished test left, as the job's verdict (checks/job.py) takes it. Plain data: it is
    pickled to the forkserver."""
    outcomes: dict[int, dict[str, Any]] = {}
    exits: dict[int, int] = {}
    crashes: dict[int, tuple[str, float | None]] = {}
    hung: dict[int, dict[str, Any]] = {}
    stacks: dict[int, str] = {}
    for r, e in sorted(res.ends.items()):
        out = e.result
        if out is not None:
            record: dict[str, Any] = {"time": out.get("time"), "exit_code": 0}
            if out.get("outcome") == "failed":
                exc = out.get("exception") or {"type": "Failed", "message": out.get("message", ""),
                                               "traceback": out.get("traceback", ""), "time": out.get("time")}
                record.update(exception=exc, exit_code=1)
            outcomes[r] = record
            if e.killed is None and e.signal is not None:
                exits[r] = -e.signal   # reported its result, then died (the gloo abort at exit among them)
            continue
        if e.killed is not None:   # the parent ended it: at the timeout, or after a peer failed
            hung[r] = {k: v for k, v in (e.whereabouts or {}).items()
                       if k in ("where", "innermost", "in_collective", "position")}
            stacks[r] = e.stack
            continue
        if e.signal is not None:
            exits[r] = -e.signal
            crashes[r] = (e.stderr[-CRASH_TAIL:], e.exit_time)
        elif e.exit_code is not None:
            exits[r] = e.exit_code
    return {"world_size": res.world_size, "timeout": res.timeout, "timed_out": res.timed_out,
            "outcomes": outcomes, "exits": exits, "crashes": crashes, "hung": hung, "stacks": stacks}


# ---------------------------------------------------------------- child side (imports torch)
def judge(inputs: dict[str, Any], ledgers: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The judgement of `ddp-doctor run` on a test's ranks: {"findings": [...] (merged, as the
    report has them), "root_cause": {...} or None, "cause_ranks": [...], "waiting": {rank: the
    ledger entry it waits in}, "consequence": {rank: the id of the finding that says so}}."""
    from ddp_doctor.checks.stalls import RANK_HUNG
    report = _job_report(inputs, ledgers)
    findings = [f for f in report.get("findings") or [] if isinstance(f, dict)]
    cause = report.get("root_cause")
    cause_ranks = sorted(int(r) for r in (cause or {}).get("ranks") or [])
    waiting: dict[int, dict[str, Any]] = {}
    consequence: dict[int, str] = {}
    for f in findings:
        evidence = f.get("evidence") or {}
        per_rank = evidence.get("ranks")
        if isinstance(per_rank, dict):  # a ledger finding: the ranks it shows waiting in the collective
            for r, ev in per_rank.items():
                if isinstance(ev, dict) and (ev.get("waiting") or ev.get("consequence")) \
                        and int(r) not in cause_ranks:
                    waiting.setdefault(int(r), ev.get("entry") or {})
        if f.get("caused_by") and f.get("id") != RANK_HUNG.id:
            for r in f.get("ranks") or []:
                if int(r) not in cause_ranks:
                    consequence.setdefault(int(r), str(f.get("id")))
    return {"findings": findings, "root_cause": cause, "cause_ranks": cause_ranks,
            "waiting": {str(r): e for r, e in waiting.items()},
            "consequence": {str(r): i for r, i in consequence.items()}}


def _job_report(inputs: dict[str, Any], ledgers: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The report `ddp-doctor run` builds from a job's evidence (checks/job.py through
    training/job_report.py), with the test's ranks as the job's."""
    ws = int(inputs["world_size"])
    ranks = list(range(ws))
    outcomes = {int(r): o for r, o in inputs["outcomes"].items()}
    hung = bool(inputs["timed_out"] and inputs["hung"])
    stopped_at = {int(r): h for r, h in inputs["hung"].items()} if hung else {}
    stacks = {int(r): str(s) for r, s in inputs["stacks"].items()} if hung else {}
    exits = {} if hung else {int(r): int(c) for r, c in inputs["exits"].items()}
    crashes = {int(r): (str(d), t) for r, (d, t) in inputs["crashes"].items()}
    from ddp_doctor.checks.job import JobEvidence
    from ddp_doctor.training.job_report import job_report
    ev = JobEvidence(ranks=ranks, outcomes=outcomes, exits=exits, crashes=crashes, ledgers=ledgers,
                     stopped_at=stopped_at, stacks=stacks, hung=hung, hang_timeout=float(inputs["timeout"]),
                     world_size=ws, started=True)
    report, _ = job_report(ev, world={"launcher": "pytest (ddp-doctor's rank pool)"})
    return report


def judge_and_write(inputs: dict[str, Any]) -> None:
    """In the judging child: the judgement of the ranks that left their records in inputs["dir"]."""
    from ddp_doctor.training import records
    d = str(inputs["dir"])
    judgement = judge(inputs, records.read_ledgers(d))
    tmp = judgement_path(d) + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(judgement, f, default=str)
    os.replace(tmp, judgement_path(d))
