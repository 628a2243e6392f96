"""checks/history_rules.py: a host against its own past (DDP409). Pure: history records in."""
from __future__ import annotations

from ddp_doctor.checks.history_rules import BANDWIDTH, MIN_RUNS, history_findings
from ddp_doctor.history.store import RunRecord

BIG = "all_reduce.busbw_gbps@268435456"


def _rec(host: str, t: float, busbw: float, torch: str = "2.13.0", small: float = 1.0) -> RunRecord:
    return RunRecord(time=t, kind="preflight", host=host, world_size=16, nnodes=2, nproc_per_node=8, backend="nccl",
                     versions={"torch": torch, "nccl": "2.21.5", "cuda": "12.4"},
                     figures={BIG: busbw, "all_reduce.busbw_gbps@4096": small})


def _past() -> list[RunRecord]:
    # two hosts with histories of their own: algo-1 runs near 150 GB/s, algo-2 near 90 GB/s
    return [_rec("algo-1", t, 150 + (t % 3)) for t in range(10)] + [_rec("algo-2", t, 90 + (t % 3)) for t in range(10)]


def test_a_drop_is_flagged_against_the_hosts_own_history_not_the_others():
    # 90 GB/s is algo-2's normal, 40% below algo-1's
    (f,) = history_findings([_rec("algo-1", 20, 90), _rec("algo-2", 20, 90)], _past())
    assert f.id == "DDP409" and f.severity == "warning" and f.evidence["host"] == "algo-1"
    assert "on algo-1 all_reduce at 268435456 bytes ran at 90 GB/s busbw, 40% below this host's median of 151 " \
           "GB/s over the last 10 comparable runs" in f.message, f.message
    # small messages measure latency: never compared
    assert history_findings([_rec("algo-1", 20, 150, small=0.01)], _past()) == []


def test_nothing_until_enough_comparable_runs_exist():
    few = [_rec("algo-1", t, 150) for t in range(MIN_RUNS - 1)]
    assert history_findings([_rec("algo-1", 20, 50)], few) == []
    # another torch is another series
    assert history_findings([_rec("algo-1", 20, 50, torch="2.14.0")], _past()) == []
    assert len(history_findings([_rec("algo-1", 20, 50)], few + [_rec("algo-1", 9, 150)])) == 1


STEP = "training.median_step_s@0123abcd4567"


def _run(host: str, t: float, step_s: float, figure: str = STEP) -> RunRecord:
    return RunRecord(time=t, kind="run", host=host, world_size=16, nnodes=2, nproc_per_node=8, backend="nccl",
                     versions={"torch": "2.13.0"}, figures={figure: step_s})


def test_a_runs_step_time_is_judged_against_the_same_scripts_past_on_its_host():
    past = [_run("algo-1", t, 0.100 + 0.001 * (t % 3)) for t in range(8)]
    # 0.14 s a step: 28% fewer steps per second than the median 0.101 s
    (f,) = history_findings([_run("algo-1", 20, 0.14)], past)
    assert f.id == "DDP409" and f.evidence["drops"][0]["figure"] == STEP, f
    assert "on algo-1 the training step took a median 0.14 s, 28% fewer steps per second than this host's " \
           "median of 0.101 s over the last 8 comparable runs of the same script and arguments" in f.message, f.message
    assert history_findings([_run("algo-1", 20, 0.125)], past) == []  # 19% fewer: within the bound
    assert history_findings([_run("algo-1", 20, 0.05)], past) == []  # faster is never a finding
    # another script (another key), or the preflight's bandwidth figures only: nothing
    assert history_findings([_run("algo-1", 20, 0.5, figure="training.median_step_s@ffff")], past) == []
    assert history_findings([_run("algo-1", 20, 0.5)], past, BANDWIDTH) == []


def test_a_new_host_is_judged_against_its_instance_types_past_until_it_has_its_own():
    import dataclasses

    def typed(rec: RunRecord, itype: str = "ml.p4d.24xlarge") -> RunRecord:
        return dataclasses.replace(rec, instance_type=itype)
    # a fleet: every job on new hosts of the same type, near 150 GB/s; another type near 50
    fleet = [typed(_rec(f"job{t}-algo-1", t, 150 + (t % 3))) for t in range(12)]
    fleet += [typed(_rec(f"other{t}", t, 50), "ml.g5.48xlarge") for t in range(12)]
    (f,) = history_findings([typed(_rec("new-algo-1", 20, 90))], fleet)
    assert f.evidence["drops"][0]["against"] == "instance_type" and f.evidence["instance_type"] == "ml.p4d.24xlarge"
    assert "below ml.p4d.24xlarge's (this host has fewer than 5 runs of its own) median of 151 GB/s over the last " \
           "12 comparable runs" in f.message, f.message
    # the slower type's own past makes 50 its normal
    assert history_findings([typed(_rec("new-algo-2", 20, 50), "ml.g5.48xlarge")], fleet) == []
    # no instance type known: a new host has nothing to be compared with
    assert history_findings([_rec("new-algo-1", 20, 90)], fleet) == []
    # once the host has its own past, that is what counts (here: 90 is its normal)
    own = [typed(_rec("new-algo-1", t, 90)) for t in range(5)]
    assert history_findings([typed(_rec("new-algo-1", 20, 90))], fleet + own) == []
    # the same records read twice (as the host's and as its type's) count once
    (f,) = history_findings([typed(_rec("new-algo-1", 20, 90))], fleet + fleet)
    assert f.evidence["drops"][0]["runs"] == 12
