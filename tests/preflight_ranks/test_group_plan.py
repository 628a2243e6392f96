"""The group checks' plan and its digest (DDP326): what every rank compares before the collectives."""
from __future__ import annotations

from ddp_doctor.preflight_ranks.group_plan import group_plan, plan_digest


def test_the_plan_is_the_group_checks_in_their_order_under_select_and_skip():
    every = group_plan(None, None)
    assert every and "DDP407" in every and "DDP402" in every
    assert group_plan(["DDP407"], None) == ["DDP407"]
    assert "DDP407" not in group_plan(None, ["DDP407"])
    assert group_plan(None, ["DDP407"]) == [i for i in every if i != "DDP407"]  # the order kept


def test_the_digest_differs_with_the_version_the_checks_or_their_order():
    plan = ["DDP401", "DDP402"]
    same = plan_digest("1.0", plan)
    assert plan_digest("1.0", list(plan)) == same
    assert plan_digest("1.1", plan) != same
    assert plan_digest("1.0", ["DDP402", "DDP401"]) != same
    assert plan_digest("1.0", ["DDP401"]) != same
    assert 0 <= same < 2 ** 48 and float(same) == same  # carried exactly as a float64


def test_a_failed_exchange_is_a_finding_that_runs_no_group_check():
    # no process group at all: the all_gather fails as it would against a peer in another collective
    from ddp_doctor.context import Group
    from ddp_doctor.preflight_ranks.group_plan import plans_differ
    group = Group(rank=0, world_size=2, backend="gloo", device="cpu", timeout=1.0)
    f = plans_differ(group, ["DDP407"], 0)
    assert f is not None and f.id == "DDP326" and "could not compare" in f.message, f
    assert f.evidence["plan"] == ["DDP407"] and f.evidence["error"], f.evidence
    assert f.caused_by == "root_cause"  # what failed first (a rank's init) stays the root cause


def test_one_plan_in_a_real_group_is_no_finding(tmp_path):
    import torch.distributed as dist

    from ddp_doctor.context import Group
    from ddp_doctor.preflight_ranks.group_plan import plans_differ
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        group = Group(rank=0, world_size=1, backend="gloo", device="cpu", timeout=10.0)
        assert plans_differ(group, group_plan(None, None), 0) is None
    finally:
        dist.destroy_process_group()
