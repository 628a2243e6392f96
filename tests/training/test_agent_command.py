"""The launcher's command line `ddp-doctor run` starts (training/run/agent.agent_command): the
rendezvous of several nodes bounded by --timeout where the user's --rdzv-conf leaves it open, as
the preflight of a Kubeflow pod bounds it (preflight_ranks/local_launch.bounded_rdzv_conf)."""
from __future__ import annotations

from ddp_doctor.preflight_ranks.local_launch import bounded_rdzv_conf
from ddp_doctor.training.run.agent import agent_command
from ddp_doctor.training.run.target import Target


def conf_of(cmd: list[str]) -> list[str]:
    return [a for a in cmd if a.startswith("--rdzv-conf")]


def test_several_nodes_wait_for_each_other_at_most_the_timeout() -> None:
    two = ["--nnodes", "2", "--master-addr", "a", "--master-port", "1"]
    cmd = agent_command(two, ["--timeout", "7.5"], Target("t.py", None))
    assert conf_of(cmd) == ["--rdzv-conf=timeout=8,join_timeout=8"] and "--standalone" not in cmd
    own = agent_command([*two, "--rdzv-conf", "timeout=99"], ["--timeout", "7"], Target("t.py", None))
    assert conf_of(own) == ["--rdzv-conf=timeout=99,join_timeout=7"] and "timeout=99" not in own
    both = agent_command([*two, "--rdzv-conf=timeout=1,join_timeout=2"], [], Target("t.py", None))
    assert conf_of(both) == ["--rdzv-conf=timeout=1,join_timeout=2"]
    one = agent_command(["--nnodes", "1"], ["--timeout", "7"], Target("t.py", None))
    assert conf_of(one) == [] and "--standalone" in one


def test_the_bound_is_added_only_where_the_conf_leaves_it_open() -> None:
    assert bounded_rdzv_conf(None, 0.2) == "timeout=1,join_timeout=1"
    assert bounded_rdzv_conf("read_timeout=5", 30) == "read_timeout=5,timeout=30,join_timeout=30"
    assert bounded_rdzv_conf("timeout=5,join_timeout=6", 30) is None
