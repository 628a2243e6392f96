"""Unit tests of the communication suite: bandwidth arithmetic, the correctness counter, the sweep's
bookkeeping (over a simulated group), and the decision functions of DDP403-DDP407."""
from __future__ import annotations

import argparse
from typing import Any

import pytest
import torch
from helpers.context import make_ctx, torchrun_env

from ddp_doctor.checks import communication as cc
from ddp_doctor.cli import build_parser
from ddp_doctor.cli.options import byte_size
from ddp_doctor.cli.preflight import check_options
from ddp_doctor.comm import arithmetic, layout, stragglers, sweep, table
from ddp_doctor.context import Group


# ---------------------------------------------------------------- arithmetic
def test_busbw_factors_follow_nccl_tests():
    assert arithmetic.busbw_factor(2) == 1.0
    assert arithmetic.busbw_factor(4) == 1.5
    assert arithmetic.busbw_factor(8) == 1.75
    assert arithmetic.busbw_factor(4, "all_gather") == 0.75
    assert arithmetic.busbw_factor(8, "broadcast") == 1.0
    assert arithmetic.busbw_factor(1) == 0.0  # one rank: no link crossed
    assert arithmetic.busbw_factor(1, "broadcast") == 0.0


def test_bandwidth_is_bytes_over_time_times_factor():
    algbw, busbw = arithmetic.bandwidth(2_000_000_000, 1.0, 4)
    assert algbw == pytest.approx(2.0) and busbw == pytest.approx(3.0)
    assert arithmetic.bandwidth(4096, 0.0, 2) == (0.0, 0.0)


def test_sizes_double_and_include_the_maximum():
    s = arithmetic.sizes(4 * arithmetic.KIB, 64 * arithmetic.MIB)
    assert s[0] == 4096 and s[-1] == 64 * arithmetic.MIB and len(s) == 15
    assert all(b == 2 * a for a, b in zip(s, s[1:]))
    assert arithmetic.sizes(4096, 10000) == [4096, 8192, 10000]
    assert arithmetic.sizes(8192, 4096) == [4096]


@pytest.mark.parametrize("text,value", [("4096", 4096), ("4K", 4096), ("4KiB", 4096), ("64M", 64 << 20),
                                        ("1g", 1 << 30), ("1.5M", 3 << 19)])
def test_parse_bytes(text, value):
    assert arithmetic.parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "lots", "2", "-4K"])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError):
        arithmetic.parse_bytes(text)
    with pytest.raises(argparse.ArgumentTypeError):  # as the command line reports it
        byte_size(text)


# ---------------------------------------------------------------- correctness counter
@pytest.mark.parametrize("n", [1, 2, 3, 7, 64])
def test_rank_values_sum_exactly_to_one_integer(n):
    count = 1000  # not a multiple of the fill row: the tail is filled too
    parts = [arithmetic.fill_rank_values(torch.empty(count), r, n) for r in range(n)]
    total = torch.zeros(count)
    for p in parts:
        total += p
    assert arithmetic.count_wrong(total, arithmetic.exact_sum(n)) == 0
    if n > 1:  # ranks hold different, element-varying values
        assert not torch.equal(parts[0], parts[1]) and parts[0].unique().numel() == n


def test_count_wrong_counts_a_deliberately_corrupted_result():
    n = 4
    t = torch.full((1 << 16,), arithmetic.exact_sum(n))
    assert arithmetic.count_wrong(t, arithmetic.exact_sum(n)) == 0
    t[7] += 1.0
    t[1000] = float("nan")
    t[-1] = 0.0
    assert arithmetic.count_wrong(t, arithmetic.exact_sum(n)) == 3
    ref = torch.arange(10.0)
    bad = ref.clone()
    bad[3] = -1
    assert arithmetic.count_wrong(bad, ref) == 1


def test_dropped_contribution_is_wrong_everywhere():
    n = 3
    total = arithmetic.fill_rank_values(torch.empty(300), 0, n) + arithmetic.fill_rank_values(torch.empty(300), 1, n)
    assert arithmetic.count_wrong(total, arithmetic.exact_sum(n)) == 300


def test_final_result_exactness():
    assert arithmetic.final_exact(2, 25) and arithmetic.final_exact(8, 30)
    assert arithmetic.final_exact(3, 5)            # 6 * 3**5 = 1458
    assert not arithmetic.final_exact(3, 25)       # 6 * 3**25 needs more than 24 bits
    assert not arithmetic.final_exact(2, 200)      # overflow


class SimulatedComm(sweep.Comm):
    """A test double: rank 0 of an n-rank group whose peers are simulated in-process. all_reduce
    really sums every rank's values (the peers' are rebuilt from fill_rank_values, then scaled the
    way repeated sums scale them); `corrupt` flips one element of rank 0's result at chosen calls."""

    def __init__(self, n: int, corrupt_calls: set[int] | None = None) -> None:
        super().__init__(rank=0, size=n, device="cpu", timeout=5.0, ranks=list(range(n)))
        self.calls, self.corrupt_calls = 0, corrupt_calls or set()
        self.first_of_size: dict[int, bool] = {}

    def all_reduce(self, t: Any) -> None:
        n = self.size
        if t.numel() not in self.first_of_size:
            self.first_of_size[t.numel()] = True
            peers = [arithmetic.fill_rank_values(torch.empty_like(t), r, n) for r in range(1, n)]
            for p in peers:
                t += p
        else:
            t *= n  # every rank already holds the same values
        if self.calls in self.corrupt_calls:
            t[0] += 1.0
        self.calls += 1

    def gather_floats(self, values):
        # the simulated peers took as long and saw nothing wrong
        return [list(values)] + [[values[0], 0.0] for _ in range(self.size - 1)]


def test_sweep_entries_and_keys():
    cfg = sweep.SweepConfig(min_bytes=4096, max_bytes=64 * 1024, iters=3, warmup=2)
    seen: list[int] = []
    entries = sweep.sweep_all_reduce(SimulatedComm(4), cfg, progress=lambda e: seen.append(e["bytes"]))
    assert [e["bytes"] for e in entries] == [4096, 8192, 16384, 32768, 65536] == seen
    for e in entries:
        assert {"bytes", "time_us", "algbw_gbps", "busbw_gbps", "correct", "wrong"} <= set(e)
        assert e["correct"] and e["wrong"] == 0 and e["iters"] == 3 and e["count"] == e["bytes"] // 4
        assert e["busbw_gbps"] == pytest.approx(e["algbw_gbps"] * 1.5)


def test_sweep_counts_a_corrupted_result():
    cfg = sweep.SweepConfig(min_bytes=4096, max_bytes=8192, iters=2, warmup=1)
    # call 0: size 4096's checked result; call 5: the last timed result of size 8192
    entries = sweep.sweep_all_reduce(SimulatedComm(2, corrupt_calls={0, 5}), cfg)
    assert [e["correct"] for e in entries] == [False, False]
    assert entries[0]["wrong"] >= 1 and entries[0]["wrong_ranks"] == [0]
    problems = cc.wrong_result_problems("all_reduce(sum)", entries, "gloo")
    assert len(problems) == 1 and "2 of 2 sizes" in problems[0].message and problems[0].ranks == (0,)


def test_sweep_budget_cuts_iterations_not_sizes():
    cfg = sweep.SweepConfig(min_bytes=4096, max_bytes=16384, iters=50, warmup=1, budget_s=1e-9)
    entries = sweep.sweep_all_reduce(SimulatedComm(2), cfg)
    assert len(entries) == 3 and all(e["iters"] == 1 and e["correct"] for e in entries)


def test_sweep_config_modes():
    pf = sweep.sweep_config({}, "cpu")
    assert pf.max_bytes == 16 * arithmetic.MIB and pf.budget_s == sweep.PREFLIGHT_BUDGET_S_CPU
    assert pf.iters == sweep.PREFLIGHT_ITERS
    assert sweep.sweep_config({"comm_mode": "bench"}, "cpu").max_bytes == 64 * arithmetic.MIB
    assert sweep.sweep_config({}, "cuda:0").max_bytes == 256 * arithmetic.MIB
    bench = sweep.sweep_config({"comm_mode": "bench"}, "cuda:0")
    assert bench.max_bytes == 256 * arithmetic.MIB and bench.budget_s is None and bench.iters == sweep.BENCH_ITERS
    custom = sweep.sweep_config({"comm_max_bytes": 1 << 20, "comm_iters": 7, "comm_budget_s": 0}, "cpu")
    assert custom.max_bytes == 1 << 20 and custom.iters == 7 and custom.budget_s is None


def test_cli_options_reach_ctx_options():
    args = build_parser().parse_args(["preflight", "--comm-max-bytes", "1M", "--comm-min-bytes", "8K",
                                      "--comm-iters", "4", "--instance-type", "ml.p4d.24xlarge",
                                      "--comm-min-fraction", "0.7", "--straggler-factor", "2",
                                      "--straggler-min-ms", "25", "--max-clock-skew", "0.5"])
    opts = check_options(args)
    assert opts["comm_max_bytes"] == 1 << 20 and opts["comm_min_bytes"] == 8192 and opts["comm_iters"] == 4
    assert opts["instance_type"] == "ml.p4d.24xlarge" and opts["comm_min_fraction"] == 0.7
    assert opts["straggler_factor"] == 2.0 and opts["straggler_min_s"] == 0.025
    assert opts["max_clock_skew_s"] == 0.5
    assert "comm_max_bytes" not in check_options(build_parser().parse_args(["preflight"]))


# ---------------------------------------------------------------- node layout
def test_node_groups_from_layout():
    lay = [(0, 0), (0, 1), (1, 0), (1, 1)]
    intra, inter = layout.node_groups(lay)
    assert intra == [[0, 1], [2, 3]] and inter == [[0, 2], [1, 3]]
    assert layout.node_groups([(5, 0), (5, 1)]) == ([[0, 1]], [[0], [1]])


# ---------------------------------------------------------------- expected bandwidth (DDP403)
def _sweep(busbw: float, nbytes: int = 256 * arithmetic.MIB) -> list[dict]:
    return [{"bytes": 4096, "busbw_gbps": 0.1}, {"bytes": nbytes, "busbw_gbps": busbw}]


def test_known_type_far_below_is_a_warning_with_causes():
    p = cc.judge_bandwidth(_sweep(12.0), "inter-node", "ml.p4d.24xlarge", "nccl", "cuda:0",
                           {"FI_PROVIDER": "sockets", "NCCL_SOCKET_IFNAME": "eth0"})
    assert p is not None and p.severity is None  # the check's own severity: warning
    assert "12.00 GB/s" in p.message and "ml.p4d.24xlarge" in p.message
    assert "FI_PROVIDER=sockets" in p.message and "NCCL_SOCKET_IFNAME=eth0" in p.message
    intra = cc.judge_bandwidth(_sweep(30.0), "intra-node", "p4d.24xlarge", "nccl", "cuda:0",
                               {"NCCL_P2P_DISABLE": "1"})
    assert intra is not None and "NCCL_P2P_DISABLE=1" in intra.message and "PCIe" in intra.message


def test_known_type_healthy_passes():
    assert cc.judge_bandwidth(_sweep(200.0), "intra-node", "ml.p4d.24xlarge", "nccl", "cuda:0", {}) is None
    assert cc.judge_bandwidth(_sweep(35.0), "inter-node", "ml.p4d.24xlarge", "nccl", "cuda:0", {}) is None
    # the threshold is configurable
    assert cc.judge_bandwidth(_sweep(35.0), "inter-node", "ml.p4d.24xlarge", "nccl", "cuda:0", {},
                              min_fraction=1.2) is not None


def test_one_rank_crosses_no_link_and_is_not_judged():
    """A 1-GPU job's sweep: busbw 0 as nccl-tests counts it, which is no slow link; its algbw is a
    local no-op's speed (on an H200, 256 MiB in 24 us: 11 TB/s), which no link bounds."""
    one = [{**e, "nranks": 1} for e in _sweep(0.0)]
    p = cc.judge_bandwidth(one, "intra-node", "ml.p4d.24xlarge", "nccl", "cuda:0", {})
    assert p is not None and p.severity == "info" and "no link crossed" in p.message
    assert arithmetic.bandwidth(256 * arithmetic.MIB, 24e-6, 1) == (pytest.approx(11184.8, rel=1e-3), 0.0)
    # two ranks on the same type and figure are judged (the warning's own severity)
    two = [{**e, "nranks": 2} for e in _sweep(0.0)]
    assert cc.judge_bandwidth(two, "intra-node", "ml.p4d.24xlarge", "nccl", "cuda:0", {}).severity is None


def test_unknown_type_and_cpu_are_not_judged():
    p = cc.judge_bandwidth(_sweep(0.5), "intra-node", "ml.c5.xlarge", "nccl", "cuda:0", {})
    assert p is not None and p.severity == "info" and "not judged" in p.message
    assert cc.judge_bandwidth(_sweep(0.5), "intra-node", None, "nccl", "cuda:0", {}).severity == "info"
    assert cc.judge_bandwidth(_sweep(0.5), "intra-node", "ml.p4d.24xlarge", "gloo", "cpu", {}) is None
    small = cc.judge_bandwidth(_sweep(0.5, nbytes=1 << 20), "intra-node", "ml.p4d.24xlarge", "nccl", "cuda:0", {})
    assert small is not None and small.severity == "info"


def test_bandwidth_check_reads_instance_type_option():
    ctx = make_ctx(torchrun_env(world_size=2), options={"instance_type": "ml.p5.48xlarge"})
    group = Group(rank=0, world_size=2, backend="nccl", device="cuda:0", timeout=5.0)
    group.measurements["all_reduce"] = _sweep(50.0)
    found = list(cc.bandwidth_expected(ctx, group))
    assert len(found) == 1 and "ml.p5.48xlarge" in found[0].message and "intra-node" in found[0].message
    group.measurements["all_reduce"] = _sweep(400.0)
    assert list(cc.bandwidth_expected(ctx, group)) == []


# ---------------------------------------------------------------- DDP404
def test_split_unavailable_on_smddp_multi_node():
    ctx = make_ctx(torchrun_env(rank=0, world_size=4, local_world_size=2), backend="smddp")
    found = list(cc.split_unavailable(ctx))
    assert len(found) == 1 and "new_group" in found[0].message


def test_split_available_otherwise():
    assert list(cc.split_unavailable(make_ctx(torchrun_env(world_size=4, local_world_size=2)))) == []
    assert list(cc.split_unavailable(make_ctx(torchrun_env(world_size=2), backend="smddp"))) == []


# ---------------------------------------------------------------- stragglers (DDP405, DDP406)
def _rounds(**medians_ms: float) -> dict[int, list[float]]:
    """12 rounds a rank, each about its median (+-2%, the same small jitter on every rank)."""
    jitter = [0.98, 1.01, 1.0, 0.99, 1.02, 1.0, 0.985, 1.015, 1.0, 0.995, 1.005, 1.0]
    return {int(k[1:]): [m / 1e3 * j for j in jitter] for k, m in medians_ms.items()}


def _quiet(ranks, per_node=2, own=1.0, cores=8):
    """Windows of a quiet host: the job's `per_node` ranks a node are all its CPU use."""
    from ddp_doctor.facts.host_load import LoadWindow
    return {r: LoadWindow(busy_mine=own * per_node, own=own, busy_host=own * per_node, steal=0.0, load1=0.5,
                          cores=cores, cpus_key=1.0, seconds=0.5) for r in ranks}


def test_a_rank_slower_in_every_round_is_named_with_its_test():
    rounds = _rounds(r0=20, r1=21, r2=60, r3=19)
    slow = stragglers.slow_ranks(rounds)
    assert set(slow) == {2} and slow[2].slower == 12 and slow[2].p < 0.01 / 4
    problems = cc.straggler_problems(rounds, _quiet(range(4)), {0: 0, 1: 0, 2: 1, 3: 1}, "fixed compute", 1.5, 0.01)
    assert problems and problems[0].ranks == (2,) and problems[0].severity is None
    assert "rank 2 60.0 ms" in problems[0].message and "slower in 12 of 12 rounds" in problems[0].message


def test_noise_and_bursts_name_no_rank():
    assert stragglers.slow_ranks(_rounds(r0=1, r1=4)) == {}          # 4x, but 3 ms
    assert stragglers.slow_ranks(_rounds(r0=20, r1=22, r2=25)) == {}  # within 1.5x
    assert stragglers.slow_ranks({0: [0.02] * 12}) == {}
    # one burst: rank 1 far slower in 3 rounds of 12, the same as rank 0 in the rest
    burst = {0: [0.020] * 12, 1: [0.020] * 9 + [0.090] * 3}
    assert stragglers.slow_ranks(burst) == {}
    # slower in most rounds, but not in so many that chance could not do it (8 of 12: p = 0.19)
    mixed = {0: [0.020] * 12, 1: [0.070] * 8 + [0.019] * 4}
    assert stragglers.slow_ranks(mixed) == {}
    # a rank's own spread from round to round hides a difference of its size
    noisy = {0: [0.010, 0.060] * 6, 1: [0.045, 0.070] * 6}
    assert stragglers.slow_ranks(noisy) == {}
    assert stragglers.slow_ranks(_rounds(r0=20, r1=60) | {1: [0.06] * 5}) == {}  # too few rounds


def test_the_sign_test_and_the_rounds_it_needs():
    assert stragglers.sign_test_p(12, 12) == 1 / 4096 and stragglers.sign_test_p(0, 12) == 1.0
    assert stragglers.sign_test_p(11, 12) == 13 / 4096
    assert stragglers.rounds_for(2) == 12 and stragglers.rounds_for(1000) > stragglers.rounds_for(8) >= 12
    for world in (2, 8, 1000):  # enough to name a rank slower in all but one round
        n = stragglers.rounds_for(world)
        assert stragglers.sign_test_p(n - 1, n) <= 0.01 / world


def test_the_rounds_stop_once_no_rank_can_be_named():
    assert [stragglers.wins_needed(n, 2) for n in (12, 8, 4)] == [11, 8, 5]  # 5: four rounds can name nobody
    alike = {0: [1.0, 3.0, 1.0, 3.0], 1: [2.0, 2.0, 2.0, 2.0]}  # each no slower than the other in 2 rounds
    assert stragglers.nobody_can_be_named(alike, 12)
    assert not stragglers.nobody_can_be_named({r: v[:3] for r, v in alike.items()}, 12)  # rank 1: one round
    slow = {0: [3.0] * 12, 1: [1.0] * 11 + [4.0]}  # rank 0 slower in 11 of 12: still nameable
    assert not stragglers.nobody_can_be_named(slow, 12)
    assert stragglers.nobody_can_be_named({0: [1.0, 3.0, 1.0, 3.0]}, 12) is False  # one rank: nothing to compare


class PeerPaced(SimulatedComm):
    """Rank 0 of two whose peer's round times are `pace(i, mine)`; the barrier is a no-op."""

    def __init__(self, pace):
        super().__init__(2)
        self.pace, self.round = pace, 0

    def wait(self, work):
        pass

    def gather_floats(self, values):
        self.round += 1
        return [list(values), [self.pace(self.round - 1, values[0])]]


def test_fixed_work_measures_every_round_only_while_a_straggler_is_possible(monkeypatch):
    monkeypatch.setattr(stragglers, "barrier", lambda comm: None)
    monkeypatch.setattr(stragglers, "fixed_work", lambda device, reps=1: [0.02] * reps)
    alike = PeerPaced(lambda i, mine: mine * (2 if i % 2 else 0.5))  # slower every other round
    assert len(stragglers.fixed_work_rounds(alike, 12)) == 4 == alike.round
    behind = PeerPaced(lambda i, mine: mine / 2)  # rank 0 slower in every round: measured to the end
    assert len(stragglers.fixed_work_rounds(behind, 12)) == 12


def test_on_a_busy_host_a_slow_rank_is_at_most_info_and_says_why():
    from ddp_doctor.facts.host_load import LoadWindow
    rounds = _rounds(r0=16, r1=40)
    busy = {r: LoadWindow(busy_mine=2.0, own=0.5, busy_host=2.0, steal=0.0, load1=3.9, cores=2, cpus_key=1.0,
                          seconds=0.5) for r in (0, 1)}
    [p] = cc.straggler_problems(rounds, busy, {0: 0, 1: 0}, "fixed compute", 1.5, 0.01)
    assert p.severity == "info" and p.ranks == (1,)
    assert "the host was busy" in p.message and "other processes used 1.0 of its 2 cores" in p.message
    assert "load average 3.9 on 2 cores" in p.message and p.evidence["busy_nodes"]


def test_a_rank_whose_cpus_other_work_takes_stays_a_warning_that_says_so():
    from ddp_doctor.facts.host_load import LoadWindow
    rounds = _rounds(r0=16, r1=60)
    # rank 0 pinned to CPU 0 alone, rank 1 to CPU 1 beside other work: the host is busy too
    loads = {0: LoadWindow(1.0, 1.0, 2.0, 0.0, 2.5, 2, 11.0, 0.5),
             1: LoadWindow(1.0, 0.25, 2.0, 0.0, 2.5, 2, 12.0, 0.5)}
    [p] = cc.straggler_problems(rounds, loads, {0: 0, 1: 0}, "fixed compute", 1.5, 0.01)
    assert p.severity is None and p.ranks == (1,)
    assert "other processes used 0.75 cores of rank 1's CPUs" in p.message, p.message


def test_slow_node():
    rounds = _rounds(r0=20, r1=20, r2=50, r3=50, r4=20, r5=21)
    node_of = {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2}
    medians = {r: stragglers.median(v) for r, v in rounds.items()}
    assert set(stragglers.slow_nodes(medians, node_of)) == {1}
    problems = cc.straggler_problems(rounds, _quiet(range(6)), node_of, "fixed compute", 1.5, 0.01)
    assert any("node(s) 1" in p.message and p.ranks == (2, 3) for p in problems)
    assert stragglers.slow_nodes(medians, {r: 0 for r in medians}) == {}


def test_a_slow_moment_is_measured_again_and_forgiven():
    loads = _quiet((0, 1))
    seq = iter([(_rounds(r0=20, r1=60), loads), (_rounds(r0=21, r1=22), loads)])
    _, _, slow = cc.confirmed_slow(lambda: next(seq), 1.5, 0.01)
    assert slow == {}
    seq = iter([(_rounds(r0=20, r1=60), loads), (_rounds(r0=21, r1=70), loads)])
    rounds, _, slow = cc.confirmed_slow(lambda: next(seq), 1.5, 0.01)
    assert set(slow) == {1} and stragglers.median(rounds[1]) == pytest.approx(0.070)
    calls = []
    cc.confirmed_slow(lambda: calls.append(1) or (_rounds(r0=20, r1=21), loads), 1.5, 0.01)
    assert len(calls) == 1  # nothing suspicious: measured once


def test_host_load_windows_read_proc_and_travel_as_floats():
    from ddp_doctor.facts import host_load
    start = host_load.read_cpu_times()
    sum(i * i for i in range(200_000))  # some CPU of this process's own
    w = host_load.window(start)
    assert w.cores >= 1 and w.own >= 0 and w.seconds > 0
    if start.per_cpu:  # Linux
        assert w.busy_host is not None and 0 <= w.busy_host <= w.cores + 0.01
    assert host_load.LoadWindow.from_floats(w.as_floats()) == w
    assert len(w.as_floats()) == host_load.FLOATS
    none = host_load.window(host_load.read_cpu_times("/nonexistent/stat"))
    assert none.busy_mine is None and none.busy_host is None and none.steal is None


# ---------------------------------------------------------------- clock skew (DDP407)
def test_clock_offsets_use_the_tightest_barrier():
    samples = {0: [(100.0, 0.5), (101.0, 0.002)], 1: [(102.9, 0.4), (103.5, 0.003)]}
    off = stragglers.clock_offsets(samples)
    assert off[0] == (0.0, 0.002)
    assert off[1][0] == pytest.approx(2.5) and off[1][1] == 0.003
    assert set(stragglers.skewed(off, 1.0)) == {1}
    assert stragglers.skewed(off, 3.0) == {}


def test_clock_skew_within_uncertainty_is_not_reported():
    samples = {0: [(100.0, 2.0)], 1: [(101.5, 2.0)]}  # 1.5 s apart, but either may be 2 s late
    assert stragglers.skewed(stragglers.clock_offsets(samples), 1.0) == {}
    assert stragglers.skewed(stragglers.clock_offsets({0: [(5.0, 0.01)], 1: [(5.3, 0.01)]}), 1.0) == {}


# ---------------------------------------------------------------- table and plot
def test_table_rows_like_nccl_tests():
    entries = [{"bytes": 4096, "count": 1024, "type": "float", "redop": "sum", "time_us": 12.5,
                "algbw_gbps": 0.33, "busbw_gbps": 0.33, "correct": True, "wrong": 0, "nranks": 2}]
    text = table.render_table({"all_reduce": entries})
    assert "time(us)" in table.TABLE_HEADER and "#wrong" in table.TABLE_HEADER
    assert "4096" in text and "1024" in text and "float" in text and "OK" in text


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    entries = [{"bytes": b, "time_us": 1.0, "algbw_gbps": b / 1e6, "busbw_gbps": b / 1e6, "correct": True}
               for b in arithmetic.sizes(4096, 1 << 20)]
    path = tmp_path / "bw.png"
    table.plot({"all_reduce": entries}, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(RuntimeError):
        table.plot({}, str(tmp_path / "none.png"))


def test_plot_is_log_log_and_algbw_stays_visible_where_it_equals_busbw():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    entries = [{"bytes": b, "time_us": 1.0, "algbw_gbps": b / 1e6, "busbw_gbps": b / 1e6, "correct": True}
               for b in arithmetic.sizes(4096, 1 << 20)]  # 2 ranks: busbw == algbw
    fig = table.figure({"all_reduce": entries})
    try:
        ax = fig.axes[0]
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        busbw, algbw = ax.get_lines()[:2]
        assert algbw.get_label().startswith("algbw") and algbw.get_zorder() > busbw.get_zorder()
        assert algbw.get_markerfacecolor() == "none"  # hollow: busbw's markers show through
    finally:
        plt.close(fig)




def test_host_load_reaches_the_report_from_the_preflight_and_from_the_ledgers():
    from ddp_doctor.checks import host_busy
    from ddp_doctor.facts.host_load import LoadWindow
    from ddp_doctor.preflight_ranks.one_rank import merge_measurements
    busy = host_busy.read({r: LoadWindow(2.0, 0.5, 2.0, 0.0, 3.0, 2, 1.0, 0.5) for r in (0, 1)}, {0: 0, 1: 0})
    got: dict = {}
    for _rank in (0, 1):  # every rank holds the same reading: merged, it stays whole
        merge_measurements(got, {"host_load": busy.summary()})
    assert got["host_load"]["busy"] is True and got["host_load"]["busy_nodes"] == {"0": busy.busy[0]}
    quiet = LoadWindow(1.0, 1.0, 2.0, 0.0, 1.0, 2, 1.0, 9.0).to_dict()
    ledgers = {0: {"host": "a", "host_load": quiet}, 1: {"host": "a", "host_load": quiet}, 2: {"host": "b"}}
    assert host_busy.of_ledgers(ledgers).summary()["busy"] is False
    assert host_busy.of_ledgers({0: {"host": "a"}}) is None
