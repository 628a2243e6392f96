"""init_process_group's arguments against the launcher (DDP867-DDP869), on hand-made records shaped
like training/probes/init_arguments.py writes them."""
from __future__ import annotations

from ddp_doctor.checks.init_arguments import blocking, init_argument_findings


def call(rank: int, *, rank_arg=None, world_arg=None, env_rank=None, env_world="2", launcher_world=2,
         launched=True, done=False, port="29500", site="train.py:7", pid=None) -> dict:
    env = {"RANK": str(rank if env_rank is None else env_rank), "WORLD_SIZE": env_world, "LOCAL_RANK": str(rank),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    rec = {"pid": pid or 100 + rank, "time": 1.0 + rank, "done": done, "site": site, "rank_arg": rank_arg,
           "world_size_arg": world_arg, "init_method": None, "store_given": False, "env": env,
           "launched_rank": launched}
    if launched:
        rec["launcher"] = {"rank": rank, "world_size": launcher_world,
                           "env": {**env, "RANK": str(rank), "WORLD_SIZE": str(launcher_world)}}
    return rec


def by_id(findings):
    return {f.id: f for f in findings}


def test_the_launchers_values_give_no_finding():
    calls = [call(0), call(1)]
    assert init_argument_findings(calls) == []
    assert not blocking([], calls)


def test_rank_zero_written_by_hand_on_every_rank_is_a_duplicate():
    calls = [call(0, rank_arg=0, world_arg=2), call(1, rank_arg=0, world_arg=2)]
    found = by_id(init_argument_findings(calls))
    assert set(found) == {"DDP867"}  # no separate "rank differs" warning for the duplicate
    f = found["DDP867"]
    assert f.ranks == [0, 1] and f.severity == "error"
    assert f.message == ("ranks 0-1 all joined with rank 0 (rank=0 passed at train.py:7); "
                         "the launcher gave RANK=0, RANK=1")
    assert blocking(list(found.values()), calls)
    assert not blocking(list(found.values()), [{**c, "done": True} for c in calls])


def test_the_duplicate_names_the_launchers_ranks_in_order_whatever_order_the_calls_came_in():
    calls = [call(1, rank_arg=0, world_arg=2), call(0, rank_arg=0, world_arg=2)]
    f = by_id(init_argument_findings(calls))["DDP867"]
    assert f.message.endswith("the launcher gave RANK=0, RANK=1") and f.ranks == [0, 1]


def test_a_world_size_the_script_changed_is_named_with_both_values():
    calls = [call(0, env_world="4"), call(1, env_world="4")]
    found = by_id(init_argument_findings(calls))
    f = found["DDP868"]
    assert f.ranks == [0, 1]
    assert "joined a world of 4 (WORLD_SIZE='4' in the environment (the launcher set '2'; the script changed it)" \
        in f.message and f.message.endswith("the launcher started 2")


def test_a_world_size_passed_by_hand():
    f = by_id(init_argument_findings([call(0, world_arg=8), call(1, world_arg=8)]))["DDP868"]
    assert "world of 8 (world_size=8 passed at train.py:7)" in f.message


def test_a_renumbered_rank_without_a_duplicate_is_a_warning():
    found = by_id(init_argument_findings([call(0, rank_arg=1), call(1, rank_arg=0)]))
    assert set(found) == {"DDP869"}
    assert found["DDP869"].severity == "warning"
    assert not blocking(list(found.values()), [call(0), call(1)])


def test_processes_the_script_started_number_their_own_world():
    # mp.spawn under a one-process launcher: children pass rank=i, world_size=2 on their own port
    kids = [call(0, rank_arg=i, world_arg=2, launched=False, port="29600", pid=200 + i) for i in range(2)]
    assert init_argument_findings(kids) == []
    # ... but two children that take the same rank of the same rendezvous still wait forever
    twins = [call(0, rank_arg=0, world_arg=2, launched=False, port="29600", pid=200 + i) for i in range(2)]
    found = by_id(init_argument_findings(twins))
    assert set(found) == {"DDP867"} and "processes 200, 201" in found["DDP867"].message


def test_separate_rendezvous_and_own_stores_are_not_compared():
    a, b = call(0, rank_arg=0, port="1"), call(1, rank_arg=0, port="2")
    assert "DDP867" not in by_id(init_argument_findings([a, b]))
    s1, s2 = {**call(0, rank_arg=0), "store_given": True}, {**call(1, rank_arg=0), "store_given": True}
    assert "DDP867" not in by_id(init_argument_findings([s1, s2]))
