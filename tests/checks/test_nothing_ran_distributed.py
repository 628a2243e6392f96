"""DDP876 for the shapes in which no rank formed a process group (checks/init_arguments.py): ranks
that returned before doing anything (too few GPUs: nothing ran distributed), ranks that trained
independent models on the shards a DistributedSampler-like split gave them, and the plain case."""
from __future__ import annotations

from ddp_doctor.checks.init_arguments import no_process_group_finding


def ended(rank: int, *, steps: int = 0, loaders=None, pg=None) -> tuple[dict, dict]:
    pid = 500 + rank
    return ({"rank": rank, "pid": pid, "exit_code": 0, "exception": None},
            {"pid": pid, "rank": rank, "pg": pg or {}, "steps": steps, "events": [], "loaders": loaders or [],
             "ended": {"how": "script", "pg_initialized": False}})


def judge(shapes: dict[int, tuple[dict, dict]], ledgers=None):
    return no_process_group_finding(sorted(shapes), {r: s[0] for r, s in shapes.items()}, [],
                                    [s[1] for s in shapes.values()], ledgers or {})


def sharded(site: str = "train.py:20") -> list[dict]:
    return [{"site": site, "distributed": True, "sampler": "DistributedSampler",
             "iterations": [{"training": True, "indices": [[0, 2]]}]}]


def test_ranks_that_returned_before_anything_ran_are_warned_that_nothing_ran_distributed():
    f = judge({0: ended(0), 1: ended(1)})
    assert f is not None and f.id == "DDP876" and f.severity == "warning" and f.ranks == [0, 1]
    assert f.message.startswith("ranks 0-1 ended without calling init_process_group: nothing ran distributed")
    assert f.evidence["nothing_ran"] is True


def test_ranks_that_trained_on_their_shards_without_a_group_trained_independent_models():
    f = judge({0: ended(0, steps=8, loaders=sharded()), 1: ended(1, steps=8, loaders=sharded())})
    assert f is not None and f.ranks == [0, 1]
    assert "the ranks trained independent models on their shards of the data" in f.message
    assert "train.py:20" in f.message and "no gradients were synchronised" in f.message
    assert f.evidence["sharded_loader"] == "train.py:20"


def test_ranks_that_trained_on_all_the_data_keep_the_plain_words():
    f = judge({0: ended(0, steps=3), 1: ended(1, steps=3)})
    assert f is not None and f.message == ("ranks 0-1 ended without calling init_process_group: each trained "
                                           "alone (no gradients were synchronised)")


def test_ranks_that_formed_a_group_or_carried_collectives_are_not_named():
    assert judge({0: ended(0, pg={"rank": 0}), 1: ended(1, pg={"rank": 1})}) is None
    assert judge({0: ended(0), 1: ended(1)}, ledgers={0: {"entries": [{}]}, 1: {"entries": [{}]}}) is None
