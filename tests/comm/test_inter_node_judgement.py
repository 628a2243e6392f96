"""DDP403's inter-node judgement (docs/communication.md, "The inter-node judgement"): the inter-node
groups are swept at once and share each node's network cards, so each group's busbw is judged
against its share of the node's figure E: E / max(groups swept at once, GPUs of the type).

The healthy figures are public nccl-tests all_reduce_perf results (busbw over all GPUs of the
nodes, the node's figure); a group's figure when the 8 groups run at once is that figure / 8 (the
model the judgement rests on). Pure: no process group, no GPU."""
from __future__ import annotations

import pytest
from helpers.context import make_ctx, torchrun_env

from ddp_doctor.checks import communication as cc
from ddp_doctor.comm import arithmetic, layout
from ddp_doctor.comm import expected as expected_bw
from ddp_doctor.context import Group

# NVIDIA/nccl#527 (https://github.com/NVIDIA/nccl/issues/527): all_reduce_perf at 1 GiB on
# p4d.24xlarge over EFA with GPUDirect RDMA, 8 GPUs per node: busbw on 2, 3 and 4 nodes.
P4D_NCCL527 = {2: 57.17, 3: 31.77, 4: 29.61}
# crazyguitar/aws-gpu-communication-benchmark data/nccl_all_reduce.csv: all_reduce_perf at 256 MiB
# on ml.p5.48xlarge (32 EFA devices, 8 GPUs per node): busbw (out of place) on 2, 4, 8, 16 nodes.
P5_256MIB = {2: 364.46, 4: 273.34, 8: 232.09, 16: 148.11}
# Degraded: NCCL on TCP sockets instead of EFA moves a few GB/s per node (NVIDIA/nccl#398: about
# 6 GB/s busbw on two p3dn.24xlarge over sockets, 8 ranks per node).
SOCKETS_NODE_GBPS = 4.0
GPUS = 8


def _inter(node_busbw: float, sharing: int | None = GPUS, nbytes: int = 256 * arithmetic.MIB) -> list[dict]:
    """An inter-node sweep as DDP401 records it: each of `sharing` groups gets its share."""
    per_group = node_busbw / (sharing or 1)
    entries = [{"bytes": 4096, "busbw_gbps": 0.01, "nranks": 2},
               {"bytes": nbytes, "busbw_gbps": per_group, "nranks": 2}]
    if sharing is not None:
        for e in entries:
            e["sharing"] = sharing
    return entries


def _judge(entries: list[dict], itype: str, **kw) -> object:
    return cc.judge_bandwidth(entries, "inter-node", itype, "nccl", "cuda:0", {}, **kw)


@pytest.mark.parametrize("nodes", sorted(P4D_NCCL527))
def test_healthy_p4d_per_group_figures_pass(nodes: int) -> None:
    assert _judge(_inter(P4D_NCCL527[nodes]), "ml.p4d.24xlarge") is None
    # the same figure measured as a whole-world sweep (what nccl-tests reports) passes too
    assert _judge(_inter(P4D_NCCL527[nodes], sharing=None), "ml.p4d.24xlarge") is None


@pytest.mark.parametrize("nodes", sorted(P5_256MIB))
def test_healthy_p5_per_group_figures_pass(nodes: int) -> None:
    assert _judge(_inter(P5_256MIB[nodes]), "ml.p5.48xlarge") is None
    assert _judge(_inter(P5_256MIB[nodes], sharing=None), "ml.p5.48xlarge") is None


def test_healthy_per_group_figure_judged_as_a_node_figure_would_warn() -> None:
    """What DDP403 did before: a group's share compared with the whole node's figure."""
    share = P4D_NCCL527[4] / GPUS
    assert _judge([{"bytes": 256 * arithmetic.MIB, "busbw_gbps": share}], "ml.p4d.24xlarge") is not None


@pytest.mark.parametrize("itype", ["ml.p4d.24xlarge", "ml.p5.48xlarge"])
def test_sockets_instead_of_efa_warns_with_the_share_in_the_message(itype: str) -> None:
    p = cc.judge_bandwidth(_inter(SOCKETS_NODE_GBPS), "inter-node", itype, "nccl", "cuda:0",
                           {"FI_PROVIDER": "sockets"})
    assert p is not None and p.severity is None  # the check's own severity: warning
    node = expected_bw.expected_busbw(itype, "inter-node")
    assert p.evidence["node_expected_gbps"] == node and p.evidence["share_divisor"] == GPUS
    assert p.evidence["expected_gbps"] == pytest.approx(node / GPUS)
    assert "share" in p.message and "7 other group(s)" in p.message and "FI_PROVIDER=sockets" in p.message
    # and as a whole-world figure
    assert _judge(_inter(SOCKETS_NODE_GBPS, sharing=None), itype) is not None


def test_min_fraction_still_overrides() -> None:
    healthy = _inter(P4D_NCCL527[4])          # 3.70 GB/s per group against a 3.75 GB/s share
    assert _judge(healthy, "ml.p4d.24xlarge") is None
    assert _judge(healthy, "ml.p4d.24xlarge", min_fraction=1.0) is not None
    assert _judge(_inter(SOCKETS_NODE_GBPS), "ml.p4d.24xlarge", min_fraction=0.05) is None


def test_share_divisor() -> None:
    assert expected_bw.share_divisor("ml.p4d.24xlarge", 8) == 8
    assert expected_bw.share_divisor("ml.p4d.24xlarge", 1) == 8   # one GPU reaches its own cards only
    assert expected_bw.share_divisor("ml.p4d.24xlarge", None) == 1  # a whole-world sweep: the node's figure
    assert expected_bw.share_divisor("ml.x9.huge", 4) == 4
    assert expected_bw.expected_for("ml.p4d.24xlarge", "intra-node", 8) == (220.0, 220.0, 1)
    assert expected_bw.expected_for("ml.x9.huge", "inter-node", 8) is None


def test_concurrent_inter_groups_counts_the_groups_swept_at_once() -> None:
    two_by_two = [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert layout.concurrent_inter_groups(two_by_two) == 2
    assert layout.concurrent_inter_groups([(0, 0), (0, 1), (1, 0)]) == 1  # local rank 1 has one node
    assert layout.concurrent_inter_groups([(5, 0), (5, 1)]) == 0


def test_bandwidth_check_judges_each_scope_apart() -> None:
    ctx = make_ctx(torchrun_env(world_size=16, local_world_size=8), options={"instance_type": "ml.p4d.24xlarge"})
    group = Group(rank=0, world_size=16, backend="nccl", device="cuda:0", timeout=5.0)
    group.measurements["all_reduce_intra"] = [{"bytes": 256 * arithmetic.MIB, "busbw_gbps": 230.77}]
    group.measurements["all_reduce_inter"] = _inter(P4D_NCCL527[2])
    assert list(cc.bandwidth_expected(ctx, group)) == []
    group.measurements["all_reduce_inter"] = _inter(SOCKETS_NODE_GBPS)
    found = list(cc.bandwidth_expected(ctx, group))
    assert len(found) == 1 and found[0].evidence["scope"] == "inter-node"
