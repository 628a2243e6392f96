"""facts/launchers.py multi_node: the one rule for whether a job spans more than one node, as the
EFA checks ask it (SageMaker's hosts, the launcher's node count, the sizes), as DDP302 asks it (one
node must be sure: unknown=True) and as a rank asks it before its exchange across nodes (WORLD_SIZE
and LOCAL_WORLD_SIZE, world_sizes)."""
from __future__ import annotations

import pytest

from ddp_doctor.facts.launchers import multi_node, world_sizes


@pytest.mark.parametrize("ws, lws, nnodes, hosts, several", [
    (16, 8, None, None, True),  # a world larger than this node's ranks
    (8, 8, None, None, False),  # a world of exactly this node's ranks
    (8, None, 2, None, True),  # the launcher's node count
    (None, None, None, 2, True),  # SageMaker's distribution hosts
    (8, 8, 1, 1, False),
    (16, 8, 1, None, True),  # a layout that says both is not one node's
    (None, None, None, None, False),  # nothing known
    (4, 0, None, None, False),  # a local world of 0 says nothing (DDP102 names it)
])
def test_the_rule(ws: int | None, lws: int | None, nnodes: int | None, hosts: int | None, several: bool) -> None:
    assert multi_node(ws, lws, nnodes=nnodes, hosts=hosts) is several


def test_unknown_is_the_answer_only_when_nothing_says() -> None:
    assert multi_node(None, None, unknown=True)
    assert multi_node(4, None, unknown=True)  # a world, but how many ranks are on this node?
    assert not multi_node(1, None, unknown=True)
    assert not multi_node(None, None, nnodes=1, unknown=True)
    assert not multi_node(8, 8, unknown=True)
    assert multi_node(16, 8, unknown=False)


def test_the_environment_as_torch_reads_it() -> None:
    assert world_sizes({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}) == (4, 2)
    assert world_sizes({"WORLD_SIZE": " 4 ", "LOCAL_WORLD_SIZE": "two"}) == (4, None)
    assert world_sizes({}) == (None, None)
    assert multi_node(*world_sizes({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}))
    assert not multi_node(*world_sizes({"WORLD_SIZE": "4"}))  # no local size: not sure of other nodes
    assert not multi_node(*world_sizes({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}))
    assert not multi_node(*world_sizes({"WORLD_SIZE": "x", "LOCAL_WORLD_SIZE": "1"}))
