"""init_late.py: a rank that had not called init_process_group when a peer's init timed out waiting
for it is the cause (DDP879), with where it was; the peer's store timeout is its consequence.
Pure: JobEvidence built by hand, as `ddp-doctor run`'s parent reads it from the run directory
(tests/training/test_late_init_e2e.py makes it with real 2-rank jobs)."""
from __future__ import annotations

from ddp_doctor.checks.job import JobEvidence, job_findings
from ddp_doctor.findings import Finding

T0 = 1000.0  # rank 0 calls init here; its 8 s timeout ends the wait at T0 + 8
KEY = "wait timeout after 8000ms, keys: /default_pg/0//cpu//0/1"
TB = ('Traceback (most recent call last):\n  File "/job/train.py", line 9, in <module>\n'
      '    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=8))\n'
      '  File "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 1899, in '
      'init_process_group\n    default_pg, _ = _new_process_group_helper(\n'
      'torch.distributed.DistStoreError: {msg}\n')


def _call(rank: int, t: float, *, done: bool = False, ok: bool = False, ended: float | None = None) -> dict:
    env = {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}
    rec = {"pid": 100 + rank, "time": t, "done": done, "site": "/job/train.py:9", "init_method": None,
           "env": env, "launched_rank": True, "launcher": {"rank": rank, "world_size": 2, "env": env}}
    if done:
        rec.update(ok=ok, ended=ended)
    return rec


def _timed_out(msg: str = KEY, t: float = T0 + 8) -> dict:
    return {"rank": 0, "pid": 100, "exit_code": 1, "time": t + 0.05, "phase": "training",
            "exception": {"type": "DistStoreError", "message": msg, "traceback": TB.format(msg=msg), "time": str(t)}}


def _beat(rank: int, t: float, where: str, in_collective: bool = False) -> dict:
    return {"rank": rank, "pid": 100 + rank, "time": t, "where": where, "in_collective": in_collective}


def _late_rank_evidence(rank1_call: list[dict], **more) -> JobEvidence:
    """Rank 0's init timed out at T0 + 8; rank 1 slept at /job/train.py:7 and was stopped by the launcher."""
    return JobEvidence(
        ranks=[0, 1], outcomes={0: _timed_out()}, exits={0: 1, 1: -15},
        init_calls=[_call(0, T0, done=True, ok=False, ended=T0 + 8), *rank1_call],
        ledgers={1: {"rank": 1, "time": T0 + 8.6, "position": "running", "where": "/job/train.py:7 in <module>",
                     "entries": []}},
        heartbeats={0: _beat(0, T0 + 8.4, "/job/train.py:9 in <module>", True),
                    1: _beat(1, T0 + 9.5, "/job/train.py:7 in <module>")},
        world_size=2, launched_alone=True, **more)


def _by_id(findings: list[Finding]) -> dict[str, Finding]:
    return {f.id: f for f in findings}


def test_a_rank_that_had_not_called_init_when_the_wait_expired_is_the_cause_with_its_line():
    findings, code = job_findings(_late_rank_evidence([]))
    got = _by_id(findings)
    late = got["DDP879"]
    assert late.ranks == [1] and late.severity == "error" and late.caused_by is None
    assert "rank 1 had not called init_process_group when rank 0's init (at /job/train.py:9)" in late.message
    assert "rank 1 was at /job/train.py:7 in <module>" in late.message
    assert "after init_process_group" in late.hint and "timeout=" in late.hint
    assert late.evidence["late"]["1"]["where"] == "/job/train.py:7 in <module>"
    assert late.evidence["waiting"]["0"]["awaited"] == 1
    # rank 0's timeout is the consequence; the cause dates from rank 0's call, before it
    assert got["DDP835"].caused_by == "DDP879" and got["DDP835"].to_dict()["evidence"]["consequence"]
    assert late.time == T0 and code == 1


def test_a_call_after_the_deadline_is_late_too():
    findings, _ = job_findings(_late_rank_evidence([_call(1, T0 + 9.0)]))
    late = _by_id(findings)["DDP879"]
    assert late.ranks == [1] and "it called it 1.0 s after the wait ended" in late.message


def test_the_position_record_nearest_the_deadline_says_where():
    ev = _late_rank_evidence([])
    ev.ledgers = {}
    ev.heartbeats[1] = _beat(1, T0 + 8.9, "/job/data.py:31 in load")
    late = _by_id(job_findings(ev)[0])["DDP879"]
    assert "rank 1 was at /job/data.py:31 in load (its heartbeat, 0.9 s after the wait ended)" in late.message


def test_a_rank_that_ended_without_init_while_the_other_waited_is_the_cause():
    ev = JobEvidence(
        ranks=[0, 1], outcomes={0: _timed_out(), 1: {"rank": 1, "pid": 101, "exit_code": 0, "time": T0 + 0.1}},
        exits={0: 1, 1: 0}, init_calls=[_call(0, T0, done=True, ok=False, ended=T0 + 8)],
        probes=[{"pid": 101, "ended": {"pg_initialized": False}, "steps": 0}],
        heartbeats={1: {"rank": 1, "pid": 101, "time": T0 + 0.05, "where": None}},
        world_size=2, launched_alone=True)
    findings, _ = job_findings(ev)
    got = _by_id(findings)
    assert "rank 1 ended (exit status 0) without calling init_process_group while rank 0 waited for it" \
        in got["DDP879"].message
    assert got["DDP835"].caused_by == "DDP879"
    assert "DDP876" not in got  # "trained alone" is not the story: it left rank 0 waiting


def test_a_rank_that_called_init_in_time_is_not_blamed():
    # rank 1 called 2 s after rank 0, within the timeout: the wait failed for another reason
    findings, _ = job_findings(_late_rank_evidence([_call(1, T0 + 2.0)]))
    got = _by_id(findings)
    assert "DDP879" not in got and got["DDP835"].caused_by is None


def test_a_late_rank_within_the_timeout_is_clean():
    ev = JobEvidence(
        ranks=[0, 1], outcomes={r: {"rank": r, "pid": 100 + r, "exit_code": 0, "time": T0 + 5} for r in (0, 1)},
        exits={0: 0, 1: 0},
        init_calls=[_call(0, T0, done=True, ok=True, ended=T0 + 2), _call(1, T0 + 2, done=True, ok=True, ended=T0 + 2)],
        heartbeats={r: _beat(r, T0 + 4, "/job/train.py:12 in <module>") for r in (0, 1)},
        world_size=2, launched_alone=True)
    findings, code = job_findings(ev)
    assert code == 0 and not [f for f in findings if f.severity == "error"]


def test_without_init_records_or_a_record_of_the_rank_it_cannot_tell():
    # the waiting rank's own init was not recorded: "no record" of rank 1 proves nothing
    ev = _late_rank_evidence([])
    ev.init_calls = []
    assert "DDP879" not in _by_id(job_findings(ev)[0])
    # rank 1 left nothing here (another node's rank): not judged
    ev = _late_rank_evidence([])
    ev.ranks, ev.exits, ev.ledgers, ev.heartbeats = [0, 1], {0: 1}, {}, {0: ev.heartbeats[0]}
    assert "DDP879" not in _by_id(job_findings(ev)[0])


def test_where_unknown_is_said():
    ev = _late_rank_evidence([])
    ev.ledgers, ev.heartbeats = {}, {1: _beat(1, T0 + 30, "/job/train.py:7 in <module>")}  # too far from the deadline
    late = _by_id(job_findings(ev)[0])["DDP879"]
    assert "where rank 1 was then is not known" in late.message


def test_a_store_wait_outside_init_names_the_rank_it_waited_for():
    msg = "wait timeout after 8000ms, keys: /1//cpu//0/1"  # new_group's gloo rendezvous
    out = _timed_out(msg)
    out["exception"]["traceback"] = out["exception"]["traceback"].replace("init_process_group", "new_group")
    ev = JobEvidence(ranks=[0, 1], outcomes={0: out}, exits={0: 1, 1: -15},
                     init_calls=[_call(r, T0 - 20, done=True, ok=True, ended=T0 - 19) for r in (0, 1)],
                     heartbeats={1: _beat(1, T0 + 8.5, "/job/train.py:40 in evaluate")},
                     world_size=2, launched_alone=True)
    got = _by_id(job_findings(ev)[0])
    assert "DDP879" not in got
    assert "it waited for rank 1, which was at /job/train.py:40 in evaluate" in got["DDP835"].message
    assert got["DDP835"].evidence["awaited_rank"] == 1
