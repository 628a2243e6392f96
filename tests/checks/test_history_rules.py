"""checks/history_rules.py: a host against its own past (DDP409). Pure: history records in.

Like with like (the host, the series, the figure: message size or script), quiet runs only, and a
robust test: worse than the median by more than max(3.5 x 1.4826 x MAD, 10%), with MIN_RUNS runs at
least."""
from __future__ import annotations

import dataclasses

from ddp_doctor.checks.history_rules import BANDWIDTH, FLOOR, LAST_RUNS, MIN_RUNS, history_findings
from ddp_doctor.history.database import RunRecord
from ddp_doctor.history.from_report import BUSY

BIG = "all_reduce.busbw_gbps@268435456"


def _rec(host: str, t: float, busbw: float, torch: str = "2.13.0", small: float = 1.0,
         busy: float | None = None) -> RunRecord:
    return RunRecord(time=t, kind="preflight", host=host, job=f"job-{t:g}", world_size=16, nnodes=2, nproc_per_node=8,
                     backend="nccl", versions={"torch": torch, "nccl": "2.21.5", "cuda": "12.4"},
                     figures={BIG: busbw, "all_reduce.busbw_gbps@4096": small,
                              **({} if busy is None else {BUSY: busy})})


def _past() -> list[RunRecord]:
    # two hosts with histories of their own: algo-1 runs near 150 GB/s, algo-2 near 90 GB/s
    return [_rec("algo-1", t, 150 + (t % 3)) for t in range(10)] + [_rec("algo-2", t, 90 + (t % 3)) for t in range(10)]


def test_a_drop_is_flagged_against_the_hosts_own_history_not_the_others():
    # 90 GB/s is algo-2's normal, 40% below algo-1's
    (f,) = history_findings([_rec("algo-1", 20, 90), _rec("algo-2", 20, 90)], _past())
    assert f.id == "DDP409" and f.severity == "warning" and f.evidence["host"] == "algo-1"
    # the message now says which runs (quiet ones) and the band it fell outside, not a fixed 25%
    assert "on algo-1 all_reduce at 268435456 bytes ran at 90 GB/s busbw, 40% below this host's median of 151 " \
           "GB/s over the last 10 comparable quiet runs, under their band of 136-166 GB/s (MAD 1 GB/s; the band: " \
           "the median +/- the larger of 3.5 x 1.4826 x MAD and 10%)" in f.message, f.message
    (drop,) = f.evidence["drops"]
    assert drop["median"] == 151 and drop["mad"] == 1 and drop["runs"] == 10 and drop["robust_z"] > 3.5, drop
    # small messages measure latency: never compared
    assert history_findings([_rec("algo-1", 20, 150, small=0.01)], _past()) == []


def test_nothing_until_enough_comparable_runs_exist():
    few = [_rec("algo-1", t, 150) for t in range(MIN_RUNS - 1)]
    assert history_findings([_rec("algo-1", 20, 50)], few) == []
    # another torch is another series
    assert history_findings([_rec("algo-1", 20, 50, torch="2.14.0")], _past()) == []
    assert len(history_findings([_rec("algo-1", 20, 50)], few + [_rec("algo-1", 9, 150)])) == 1


def test_fewer_than_min_runs_quiet_runs_judge_nothing_however_many_busy_ones_there_are():
    quiet = [_rec("algo-1", t, 150, busy=0.0) for t in range(MIN_RUNS - 1)]
    busy = [_rec("algo-1", 10 + t, 150, busy=1.0) for t in range(10)]
    assert history_findings([_rec("algo-1", 30, 50, busy=0.0)], quiet + busy) == []
    (f,) = history_findings([_rec("algo-1", 30, 50, busy=0.0)], quiet + busy + [_rec("algo-1", 25, 150, busy=0.0)])
    assert f.evidence["drops"][0]["runs"] == MIN_RUNS


def test_busy_past_runs_are_left_out_of_the_baseline():
    # six quiet runs near 150 GB/s, then fifteen runs on a busy machine near 100: the host's
    # normal is its quiet figure, not what it did while other work ran beside the job
    quiet = [_rec("algo-1", t, 150 + (t % 2), busy=0.0) for t in range(6)]
    busy = [_rec("algo-1", 10 + t, 100 + (t % 2), busy=1.0) for t in range(15)]
    (f,) = history_findings([_rec("algo-1", 40, 100, busy=0.0)], quiet + busy)
    drop = f.evidence["drops"][0]
    assert drop["runs"] == 6 and drop["median"] == 150.5, drop
    assert sorted(r["value"] for r in f.evidence["compared"]) == [150, 150, 150, 151, 151, 151]
    assert f.evidence["load"] == "quiet"


def test_a_busy_run_is_at_most_info_and_says_so():
    past = [_rec("algo-1", t, 150, busy=0.0) for t in range(10)]
    now = _rec("algo-1", 20, 90, busy=1.0)
    load = {"busy": True, "busy_nodes": {"1": "other processes used 40.0 of its 96 cores"}}
    (f,) = history_findings([now], past, load=load)
    assert f.severity == "info", f
    assert "but a host of the job was busy while it was timed (node 1: other processes used 40.0 of its 96 cores): " \
           "the drop may be the other work's, not this host's" in f.message, f.message
    assert f.evidence["load"] == "busy" and f.evidence["busy_nodes"] == load["busy_nodes"]
    # the same drop on a quiet run: a warning
    assert [f.severity for f in history_findings([dataclasses.replace(now, figures={BIG: 90, BUSY: 0.0})],
                                                 past)] == ["warning"]


def test_a_drop_within_the_run_to_run_spread_is_not_flagged_beyond_it_is():
    # a host whose bandwidth varies by about 20% from run to run: MAD 10, spread 14.8 GB/s
    noisy = [_rec("algo-1", t, v) for t, v in enumerate([100, 110, 90, 120, 80, 100, 110, 90, 120, 80])]
    assert history_findings([_rec("algo-1", 20, 60)], noisy) == []  # 40% below, within 3.5 spreads (51.9)
    (f,) = history_findings([_rec("algo-1", 20, 45)], noisy)  # beyond them
    assert f.evidence["drops"][0]["robust_z"] > 3.5 and f.evidence["drops"][0]["mad"] == 10
    # a host that repeats within 1%: a 15% drop is beyond its spread, and past the floor
    steady = [_rec("algo-1", t, 150 + (t % 3) * 0.5) for t in range(10)]
    (f,) = history_findings([_rec("algo-1", 20, 127)], steady)
    assert f.evidence["drops"][0]["below"] > FLOOR
    # ... but never closer to the median than the floor (10%), however steady the past
    identical = [_rec("algo-1", t, 150) for t in range(10)]
    assert history_findings([_rec("algo-1", 20, 140)], identical) == []
    assert len(history_findings([_rec("algo-1", 20, 134)], identical)) == 1


def test_old_records_of_unknown_load_count_until_the_load_is_known():
    # a history from before the load was kept: it keeps working
    old = [_rec("algo-1", t, 150) for t in range(6)]
    (f,) = history_findings([_rec("algo-1", 50, 90, busy=0.0)], old)
    assert f.evidence["drops"][0]["runs"] == 6
    # once runs say their load, a run of unknown load written after the first of them (its load
    # was not measured) is left out: here 2 known quiet + the 6 older ones, not the 5 later unknown
    known = [_rec("algo-1", 10 + t, 150, busy=0.0) for t in range(2)]
    later = [_rec("algo-1", 20 + t, 60) for t in range(5)]
    (f,) = history_findings([_rec("algo-1", 50, 90, busy=0.0)], old + known + later)
    assert f.evidence["drops"][0]["runs"] == 8 and f.evidence["drops"][0]["median"] == 150
    assert history_findings([_rec("algo-1", 50, 90, busy=0.0)], known + later) == []  # 2 quiet runs: too few


STEP = "training.median_step_s@0123abcd4567"


def _run(host: str, t: float, step_s: float, figure: str = STEP, script: str | None = "train.py",
         job: str | None = None) -> RunRecord:
    return RunRecord(time=t, kind="run", host=host, job=job or f"job-{t:g}", world_size=16, nnodes=2,
                     nproc_per_node=8, backend="nccl", versions={"torch": "2.13.0"}, figures={figure: step_s},
                     script=script)


def test_a_runs_step_time_is_judged_against_the_same_scripts_past_on_its_host():
    past = [_run("algo-1", t, 0.100 + 0.001 * (t % 3)) for t in range(8)]
    # 0.14 s a step: 28% fewer steps per second than the median 0.101 s
    (f,) = history_findings([_run("algo-1", 20, 0.14)], past)
    assert f.id == "DDP409" and f.evidence["drops"][0]["figure"] == STEP, f
    assert "on algo-1 the training step took a median 0.14 s, 28% fewer steps per second than this host's " \
           "median of 0.101 s over the last 8 comparable quiet runs of the same script and arguments, above their " \
           "band of 0.0909-0.111 s" in f.message, f.message
    # 0.125 s (19% fewer steps per second) was within the old fixed 25%; this past repeats within
    # 2%, so it is now beyond its band. A step within the floor (10% longer) is not.
    assert len(history_findings([_run("algo-1", 20, 0.125)], past)) == 1
    assert history_findings([_run("algo-1", 20, 0.108)], past) == []
    assert history_findings([_run("algo-1", 20, 0.05)], past) == []  # faster is never a finding
    # another script (another key), or the preflight's bandwidth figures only: nothing
    assert history_findings([_run("algo-1", 20, 0.5, figure="training.median_step_s@ffff")], past) == []
    assert history_findings([_run("algo-1", 20, 0.5)], past, BANDWIDTH) == []


def test_other_jobs_step_times_never_enter_the_comparison():
    # the user's history: four runs of train.py, and many of other jobs on the same host and
    # layout (a Lightning script, an HF script), slower and faster
    mine = [_run("algo-1", t, 0.100) for t in range(MIN_RUNS - 1)]
    others = [_run("algo-1", 10 + t, 0.030, figure="training.median_step_s@11111111aaaa", script="lit.py",
                   job="lightning") for t in range(12)]
    others += [_run("algo-1", 30 + t, 0.400, figure="training.median_step_s@22222222bbbb", script="hf.py", job="hf")
               for t in range(12)]
    assert history_findings([_run("algo-1", 50, 0.105)], mine + others) == []  # too few of its own
    assert history_findings([_run("algo-1", 50, 0.300)], mine + others) == []
    (f,) = history_findings([_run("algo-1", 50, 0.300)], mine + others + [_run("algo-1", 9, 0.100)])
    assert f.evidence["drops"][0]["median"] == 0.100 and f.evidence["drops"][0]["runs"] == MIN_RUNS
    # the finding lists the runs it compared with: this script's, newest first, none of the others'
    compared = f.evidence["compared"]
    assert [r["time"] for r in compared] == [9, 3, 2, 1, 0] and {r["script"] for r in compared} == {"train.py"}
    assert compared[0] == {"time": 9, "job": "job-9", "host": "algo-1", "kind": "run", "script": "train.py",
                           "value": 0.1}, compared[0]


def test_the_finding_lists_at_most_the_last_runs_it_compared_with():
    past = [_run("algo-1", t, 0.100) for t in range(3 * LAST_RUNS)]
    (f,) = history_findings([_run("algo-1", 100, 0.2)], past)
    assert len(f.evidence["compared"]) == LAST_RUNS and f.evidence["compared"][0]["time"] == 3 * LAST_RUNS - 1


def test_a_new_host_is_judged_against_its_instance_types_past_until_it_has_its_own():
    def typed(rec: RunRecord, itype: str = "ml.p4d.24xlarge") -> RunRecord:
        return dataclasses.replace(rec, instance_type=itype)
    # a fleet: every job on new hosts of the same type, near 150 GB/s; another type near 50
    fleet = [typed(_rec(f"job{t}-algo-1", t, 150 + (t % 3))) for t in range(12)]
    fleet += [typed(_rec(f"other{t}", t, 50), "ml.g5.48xlarge") for t in range(12)]
    (f,) = history_findings([typed(_rec("new-algo-1", 20, 90))], fleet)
    assert f.evidence["drops"][0]["against"] == "instance_type" and f.evidence["instance_type"] == "ml.p4d.24xlarge"
    assert "below ml.p4d.24xlarge's (this host has fewer than 5 quiet runs of its own) median of 151 GB/s over the " \
           "last 12 comparable quiet runs" in f.message, f.message
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
    # the same rules for the type: its busy runs are left out, and too few quiet ones judge nothing
    busy_fleet = [dataclasses.replace(r, figures={**r.figures, BUSY: 1.0}) for r in fleet]
    assert history_findings([typed(_rec("new-algo-1", 20, 90, busy=0.0))], busy_fleet) == []


def _sizes(host: str, t: float, values: list[float]) -> RunRecord:
    """A preflight with a busbw figure at each of len(values) sizes from 1 MiB up."""
    rec = _rec(host, t, values[0])
    return dataclasses.replace(rec, figures={f"all_reduce.busbw_gbps@{1 << (20 + i)}": v for i, v in enumerate(values)})


def test_a_bandwidth_drop_at_a_few_sizes_of_many_is_a_burst_not_a_slow_host():
    """Measured on a quiet 2-core VM: one preflight in 20 ran 46% below its past at 64 MiB and 16%
    at 32 MiB while the other five sizes held: a moment of other work, not the host. A slow link is
    slow at every large size: named when at least half of the sizes compared fell."""
    past = [_sizes("algo-1", t, [100 + (t % 3)] * 7) for t in range(10)]
    burst = [100, 100, 100, 100, 100, 80, 54]
    assert history_findings([_sizes("algo-1", 20, burst)], past) == []
    slow = [100, 100, 100, 60, 55, 52, 50]  # 4 of 7 below the band
    (f,) = history_findings([_sizes("algo-1", 20, slow)], past)
    assert len(f.evidence["drops"]) == 4 and "(3 other figure(s) too)" in f.message, f.message
