"""checks/arrivals.py: the rank that makes the others wait (DDP877), from the ranks' ledgers.
Pure: ledger records shaped as training/run/ledger.py writes them (tests/training/
test_arrivals_e2e.py makes real ones on gloo ranks)."""
from __future__ import annotations

import random

from ddp_doctor.checks.arrivals import arrival_findings, clock_offsets_of, node_arrival_findings

T0 = 1_795_000_000_000_000_000
STEP_NS = 5_000_000  # 5 ms of work per step on every rank


def _ledger(times_ns: list[int], host: str = "node-a", samples: dict | None = None) -> dict:
    entries = [{"collective_seq_id": i + 1, "process_group": ["0", "default_pg"], "profiling_name": "gloo:all_reduce",
                "time_created_ns": t, "is_p2p": False} for i, t in enumerate(times_ns)]
    return {"entries": entries, "host": host, **({"samples": samples} if samples else {})}


def _job(extra_ns: dict[int, int], steps: int = 40, jitter_ns: int = 0, seed: int = 0, hosts=None, samples=None):
    """Each rank issues one all_reduce per step; rank r is extra_ns[r] late every step (its own
    work), the others wait for it; jitter: a loaded host's noise."""
    rnd = random.Random(seed)
    ranks = sorted(set(extra_ns) | {0, 1} | set(hosts or {}))
    times = {r: [] for r in ranks}
    t = T0
    for _ in range(steps):
        arrive = {r: t + STEP_NS + extra_ns.get(r, 0) + rnd.randint(0, jitter_ns) for r in ranks}
        for r in ranks:
            times[r].append(arrive[r])
        t = max(arrive.values())  # the collective completes when the last rank arrives
    return {r: _ledger(times[r], host=(hosts or {}).get(r, "node-a"), samples=(samples or {}).get(r))
            for r in ranks}


def test_a_rank_slow_in_its_own_work_is_named_with_its_lag_share_and_place():
    where = {"total": 9, "where": {"train.py:18 in <module>": 8, "train.py:20 in <module>": 1}}
    (f,) = arrival_findings(_job({1: 50_000_000}, samples={1: where}))
    assert f.id == "DDP877" and f.ranks == [1] and f.severity == "warning"
    assert "arrived last at 40 of 40 collectives, a median 50.0 ms" in f.message
    assert "(91%)" in f.message  # 50 ms of the 55 ms each step takes
    assert "before arriving it works at train.py:18 in <module> (8 of its 9 stack samples" in f.message


def test_a_rank_slow_to_get_its_data_is_named_as_waiting_for_data():
    probes = {r: {"loaders": [{"iterations": [{"training": True}], "data_times": [0.5] + [d] * 20}]}
              for r, d in ((0, 0.001), (1, 0.041))}
    (f,) = arrival_findings(_job({1: 40_000_000}), probes)
    assert f.ranks == [1] and "waits for its data: 41.0 ms per training batch from its DataLoader, the others 1.0 ms" \
        in f.message, f.message


def test_quiet_when_the_ranks_take_turns_or_the_lag_is_noise_or_small_against_the_step():
    # a loaded host: random delays of up to 8 ms on every rank, no rank slow on its own
    for seed in range(20):
        assert arrival_findings(_job({}, jitter_ns=8_000_000, seed=seed)) == [], seed
    # always last, but by 3 ms in a 5 ms step: what a shared host's CPU scheduling does to a correct run
    assert arrival_findings(_job({1: 3_000_000})) == []
    # always last by 30 ms, but the step is 1 s: the others wait 3% of the time
    slow_steps = {r: _ledger([T0 + i * 1_000_000_000 + (30_000_000 if r == 1 else 0) for i in range(40)])
                  for r in (0, 1)}
    assert arrival_findings(slow_steps) == []
    # too few collectives to say
    assert arrival_findings(_job({1: 50_000_000}, steps=5)) == []


def _last_at(order: list[bool], lag_ns: int = 13_000_000, step_ns: int = 40_000_000) -> dict:
    """Two ranks, one collective a step; rank 1 arrives `lag_ns` after rank 0 where order[i] is
    True, rank 0 that much after rank 1 elsewhere."""
    times: dict[int, list[int]] = {0: [], 1: []}
    for i, late in enumerate(order):
        t = T0 + i * step_ns
        times[1].append(t + (lag_ns if late else 0))
        times[0].append(t + (0 if late else lag_ns))
    return {r: _ledger(v) for r, v in times.items()}


def test_last_more_often_than_chance_in_each_half_and_beyond_its_own_spread():
    # 11 of 13 collectives last, 13 ms behind, 25% of the span: what two ranks taking turns on a
    # busy host do 1 run in 90 (binomial p = 0.011 > 0.005): not named; 12 of 13 is
    eleven = [True] * 5 + [False] + [True] * 6 + [False]
    assert arrival_findings(_last_at(eleven)) == []
    (f,) = arrival_findings(_last_at([True] * 6 + [False] + [True] * 6))
    assert f.ranks == [1] and f.evidence["p"] < 0.005
    # every collective of the second half, none of the first: a burst, not a rank that holds the job
    assert arrival_findings(_last_at([False] * 10 + [True] * 30)) == []
    # last at every collective, but its lag moves from one collective to the next by more than
    # its median (11 to 13 ms or 200 to 220 ms by turns: median 106 ms, spread 140 ms): no steady delay
    cycle = [11_000_000, 12_000_000, 13_000_000, 200_000_000, 210_000_000, 220_000_000]
    times = {0: [T0 + i * 400_000_000 for i in range(42)]}
    times[1] = [t + cycle[i % 6] for i, t in enumerate(times[0])]
    assert arrival_findings({r: _ledger(v) for r, v in times.items()}) == []
    # late by about the same each time: named
    rnd = random.Random(7)
    times[1] = [t + 50_000_000 + rnd.randint(0, 4_000_000) for t in times[0]]
    assert [f.ranks for f in arrival_findings({r: _ledger(v) for r, v in times.items()})] == [[1]]


def _load(own: float, busy_mine: float, busy_host: float, cores: int = 2, key: float = 1.0, load1: float = 0.5):
    return {"busy_mine": busy_mine, "own": own, "busy_host": busy_host, "steal": 0.0, "load1": load1,
            "cores": cores, "cpus_key": key, "seconds": 10.0}


def test_on_a_busy_host_the_rank_that_arrives_last_is_info_and_the_report_says_why():
    job = _job({1: 50_000_000})
    for r in (0, 1):  # two busy loops beside the two ranks on 2 cores
        job[r]["host_load"] = _load(own=0.5, busy_mine=2.0, busy_host=2.0, load1=4.0)
    few = {r: {**led, "entries": led["entries"][:20]} for r, led in job.items()}  # 20 collectives
    (f,) = arrival_findings(few)
    assert f.severity == "info" and f.ranks == [1]
    assert "the host was busy while it trained (other processes used 1.0 of its 2 cores, load average 4.0" \
        in f.message, f.message
    # last at 40 of 40 by a steady 50 ms: far above what the load's noise does, still a warning
    (f,) = arrival_findings(job)
    assert f.severity == "warning" and "the host was busy" in f.message and "far beyond" in f.message
    # quiet: the ranks are the host's only work
    for r in (0, 1):
        job[r]["host_load"] = _load(own=0.9, busy_mine=1.8, busy_host=1.8)
    (f,) = arrival_findings(job)
    assert f.severity == "warning" and "busy" not in f.message
    # rank 1 pinned beside other work, rank 0 alone on its CPU: its cause, said, a warning
    job[0]["host_load"] = _load(own=1.0, busy_mine=1.0, busy_host=2.0, key=10.0)
    job[1]["host_load"] = _load(own=0.3, busy_mine=1.0, busy_host=2.0, key=11.0)
    (f,) = arrival_findings(job)
    assert f.severity == "warning" and "other processes used 0.70 cores of its CPUs" in f.message, f.message


def test_clocks_are_compared_within_a_host_only():
    # host b's clock runs 80 ms ahead: across hosts its ranks would look late at every collective
    job = _job({3: 30_000_000}, hosts={0: "a", 1: "a", 2: "b", 3: "b"})
    for r in (2, 3):
        for e in job[r]["entries"]:
            e["time_created_ns"] += 80_000_000
    (f,) = arrival_findings(job)
    assert f.ranks == [3] and "the other ranks of b waited" in f.message, f.message
    # a ledger whose host is unknown (a dump read after the fact) is not compared at all
    job = _job({1: 50_000_000})
    for led in job.values():
        del led["host"]
    assert arrival_findings(job) == []


FOUR = {0: "a", 1: "a", 2: "b", 3: "b"}


def _skewed(job: dict, host: str, skew_ns: int) -> dict:
    """`host`'s clock runs skew_ns ahead of the others'."""
    for led in job.values():
        if led["host"] == host:
            for e in led["entries"]:
                e["time_created_ns"] += skew_ns
    return job


def test_a_node_whose_every_rank_is_late_is_named_on_clocks_aligned_by_the_preflights_offsets():
    # both ranks of b are 40 ms late at every step; b's clock runs 80 ms ahead, which the offsets say
    job = _skewed(_job({2: 40_000_000, 3: 40_000_000}, hosts=FOUR), "b", 80_000_000)
    offsets = {0: (0.0, 0.0002), 1: (0.0, 0.0002), 2: (0.080, 0.0003), 3: (0.0801, 0.004)}
    assert arrival_findings(job) == []  # within each node no rank stands out
    (f,) = node_arrival_findings(job, offsets)
    assert f.id == "DDP878" and f.ranks == [2, 3] and f.severity == "warning", f
    assert "node b (ranks 2-3) arrived last at 40 of 40 collectives, a median 40.0 ms" in f.message, f.message
    assert "(+/- 0.6 ms)" in f.message  # twice the best-measured rank's error of the worst host
    assert f.evidence["hosts_compared"] == ["a", "b"] and f.evidence["clock_offset_s"]["b"] == 0.08


def test_a_slow_node_on_a_busy_host_is_info_unless_it_stands_far_above_the_noise():
    job = _job({2: 40_000_000, 3: 40_000_000}, hosts=FOUR)
    for led in job.values():
        led["host_load"] = _load(own=0.5, busy_mine=2.0, busy_host=2.0, load1=4.0)
    few = {r: {**led, "entries": led["entries"][:20]} for r, led in job.items()}
    (f,) = node_arrival_findings(few, {r: (0.0, 0.0001) for r in FOUR})
    assert f.severity == "info" and "a host was busy while it trained" in f.message, f.message
    (f,) = node_arrival_findings(job, {r: (0.0, 0.0001) for r in FOUR})  # 40 of 40, steady: far above
    assert f.severity == "warning"


def test_a_slow_node_is_named_with_what_its_ranks_did():
    where = {"total": 4, "where": {"train.py:30 in <module>": 3, "train.py:9 in load": 1}}
    job = _job({2: 40_000_000, 3: 40_000_000}, hosts=FOUR, samples={2: where, 3: where})
    (f,) = node_arrival_findings(job, {r: (0.0, 0.0001) for r in FOUR})
    assert "its ranks work at train.py:30 in <module> (6 of their 8 stack samples outside a collective, too few " \
        "to be sure)" in f.message, f.message
    tied = {"total": 4, "where": {"train.py:30 in <module>": 2, "train.py:31 in <module>": 2}}
    job = _job({2: 40_000_000, 3: 40_000_000}, hosts=FOUR, samples={2: tied, 3: tied})
    (f,) = node_arrival_findings(job, {r: (0.0, 0.0001) for r in FOUR})  # the samples do not tell them apart
    assert "work at train.py:30 in <module> and train.py:31 in <module> (4 each of their 8 stack samples" \
        in f.message, f.message
    many = {"total": 6, "where": {"train.py:30 in <module>": 5, "train.py:31 in <module>": 1}}
    job = _job({2: 40_000_000, 3: 40_000_000}, hosts=FOUR, samples={2: many, 3: many})
    (f,) = node_arrival_findings(job, {r: (0.0, 0.0001) for r in FOUR})
    assert "work at train.py:30 in <module> (10 of their 12 stack samples outside a collective)" in f.message
    probes = {r: {"loaders": [{"iterations": [{"training": True}], "data_times": [0.5] + [d] * 20}]}
              for r, d in ((0, 0.001), (1, 0.001), (2, 0.041), (3, 0.042))}
    (f,) = node_arrival_findings(job, {r: (0.0, 0.0001) for r in FOUR}, probes)
    assert "its ranks wait for their data: 41.5 ms per training batch" in f.message, f.message


def test_no_node_verdict_without_offsets_for_every_node_one_node_or_a_lag_within_the_clocks_error():
    job = _job({2: 40_000_000, 3: 40_000_000}, hosts=FOUR)
    assert node_arrival_findings(job, {}) == []  # the preflight did not measure the clocks
    assert node_arrival_findings(job, {0: (0.0, 0.0), 1: (0.0, 0.0)}) == []  # b's clock unknown
    # a 40 ms lag, but the clocks are known to +/- 25 ms only: it could be the clocks
    assert node_arrival_findings(job, {r: (0.0, 0.025) for r in FOUR}) == []
    # one host: nothing to compare with
    assert node_arrival_findings(_job({1: 40_000_000}), {0: (0.0, 0.0), 1: (0.0, 0.0)}) == []
    # a single slow rank on b: b's first rank is on time, so the node is not late (DDP877 names the rank)
    job = _job({3: 40_000_000}, hosts=FOUR)
    assert node_arrival_findings(job, {r: (0.0, 0.0001) for r in FOUR}) == []
    assert [f.ranks for f in arrival_findings(job)] == [[3]]
    # nodes taking turns on a loaded cluster
    for seed in range(10):
        job = _job({}, hosts=FOUR, jitter_ns=8_000_000, seed=seed)
        assert node_arrival_findings(job, {r: (0.0, 0.0001) for r in FOUR}) == [], seed


def test_clock_offsets_are_read_from_the_preflights_measurements():
    m = {"clock_offset_s": {"0": 0.0, "1": -0.25, "2": "bad"}, "clock_uncertainty_s": {"0": 0.001, "1": 0.002}}
    assert clock_offsets_of(m) == {0: (0.0, 0.001), 1: (-0.25, 0.002)}
    assert clock_offsets_of(None) == {} and clock_offsets_of({"clock_offset_s": [1]}) == {}


def test_the_traces_lags_are_the_jobs_on_aligned_clocks_else_each_hosts():
    from ddp_doctor.checks.arrivals import lags_behind_first
    job = _skewed(_job({2: 40_000_000, 3: 40_000_000}, hosts=FOUR, steps=12), "b", 80_000_000)
    key = ("default_pg", 5)
    aligned = lags_behind_first(job, {0: (0.0, 0.0), 1: (0.0, 0.0), 2: (0.08, 0.001), 3: (0.08, 0.001)})
    assert [round(aligned[r][key], 3) for r in range(4)] == [0.0, 0.0, 0.04, 0.04]
    alone = lags_behind_first(job)  # no offsets: each host's ranks against their own first
    assert [round(alone[r][key], 3) for r in range(4)] == [0.0, 0.0, 0.0, 0.0]


def test_what_the_slow_rank_was_doing_is_read_from_its_samples_activities():
    import os

    from ddp_doctor.training.run.watchdog import activity
    torch_file = os.path.join("site-packages", "torch", "{}")
    script = [("train.py", 20, "<module>")]
    assert activity(script) == "script"
    assert activity(script + [(torch_file.format("nn/modules/module.py"), 1773, "_call_impl"),
                              ("model.py", 9, "forward")]) == "forward"
    backward = script + [(torch_file.format("_tensor.py"), 625, "backward"),
                         (torch_file.format("autograd/__init__.py"), 354, "backward")]
    assert activity(backward) == "backward"
    # a forward recomputed inside the backward (activation checkpointing) is the backward's
    assert activity(backward + [(torch_file.format("nn/modules/module.py"), 1773, "_call_impl")]) == "backward"
    assert activity(script + [(torch_file.format("_tensor.py"), 500, "__format__")]) == "script"
    assert activity(script + [(torch_file.format("utils/data/dataloader.py"), 733, "__next__")]) == "data"
    assert activity(script + [(torch_file.format("optim/sgd.py"), 80, "step")]) == "optimizer"
    where = {"total": 10, "where": {"train.py:18 in <module>": 10}, "doing": {"backward": 8, "script": 2}}
    (f,) = arrival_findings(_job({1: 50_000_000}, samples={1: where}))
    assert "(10 of its 10 stack samples outside a collective; 80% in the backward, 20% elsewhere in the script)" \
        in f.message, f.message
    # a short job: a few samples only, said with a doubt
    few = {"total": 5, "where": {"train.py:18 in <module>": 3, "train.py:20 in <module>": 2}}
    (f,) = arrival_findings(_job({1: 50_000_000}, samples={1: few}))
    assert "(3 of its 5 stack samples outside a collective, too few to be sure)" in f.message, f.message


def test_every_run_report_sums_up_each_ranks_arrivals():
    from ddp_doctor.checks import arrivals
    job = _job({1: 20_000_000}, steps=12)
    got = arrivals.arrival_summary(job)
    assert got["clocks"] == "one host" and got["ranks"]["0"]["median_ms"] == 0.0, got
    assert got["ranks"]["1"] == {"compared": 12, "median_ms": 20.0, "p90_ms": 20.0, "max_ms": 20.0}
    nodes = _skewed(_job({2: 40_000_000, 3: 40_000_000}, hosts=FOUR, steps=12), "b", 80_000_000)
    assert arrivals.arrival_summary(nodes)["clocks"] == "each host's own"
    aligned = arrivals.arrival_summary(nodes, {0: (0.0, 0.0), 1: (0.0, 0.0), 2: (0.08, 0.001), 3: (0.08, 0.001)})
    assert aligned["clocks"] == "aligned across hosts" and aligned["clock_error_ms"] == 2.0
    assert aligned["ranks"]["3"]["median_ms"] == 40.0
    assert arrivals.arrival_summary({}) == {}
    # many ranks: the latest arrivers are listed, the rest counted
    big = _job({70: 30_000_000}, steps=10, hosts={r: "a" for r in range(80)})
    got = arrivals.arrival_summary(big)
    assert len(got["ranks"]) == arrivals.SUMMARY_RANKS and got["ranks_left_out"] == 16 and "70" in got["ranks"]
