"""init_process_group's arguments against the launcher (DDP867-DDP869), on hand-made records shaped
like training/probes/init_calls.py writes them."""
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


# ---------------------------------------------------------------- processes the script started itself

def child(i: int, *, rank=None, world=2, port="29600", method="tcp", nprocs=2, parent=50, texts=None,
          done=False, ok=None, t=None, pid=None) -> dict:
    """A child of torch.multiprocessing.spawn (nprocs=None: started some other way), as the probe
    records it: the values as passed, their source text, the spawn that started it."""
    rec = {"pid": pid or 200 + i, "ppid": parent, "time": t if t is not None else 1.0 + i, "done": done,
           "site": "spawn.py:9", "rank_arg": None, "world_size_arg": None,
           "rank_passed": i if rank is None else rank, "world_size_passed": world, "arg_text": texts or {},
           "init_method": f"tcp://127.0.0.1:{port}" if method == "tcp" else None, "store_given": False,
           "env": {"RANK": None, "WORLD_SIZE": None, "LOCAL_RANK": None, "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": port},
           "launched_rank": False}
    if ok is not None:
        rec["ok"] = ok
    if nprocs is not None:
        rec["spawn"] = {"parent": parent, "nprocs": nprocs, "site": "spawn.py:14", "index": i}
    return rec


def test_a_world_size_of_zero_names_the_argument_its_text_and_the_line():
    kids = [child(i, world=0, texts={"world_size": "training_args.n_gpu", "rank": "r"}) for i in range(2)]
    found = by_id(init_argument_findings(kids))
    assert set(found) == {"DDP874"}  # not also "rank out of range" or "duplicate" for a world of 0
    f = found["DDP874"]
    assert f.severity == "error" and f.ranks == [0, 1]
    assert f.message == ("spawned processes 0-1 called init_process_group with world_size=0 "
                         "(world_size=training_args.n_gpu passed at spawn.py:9): a process group needs at "
                         "least one process")
    assert f.evidence["world_size"] == 0


def test_a_negative_world_size_and_one_from_the_environment_are_named_too():
    f = by_id(init_argument_findings([child(0, world=-3)]))["DDP874"]
    assert "world_size=-3 (world_size=-3 passed at spawn.py:9)" in f.message
    # launched ranks whose script set WORLD_SIZE=0 before a plain init_process_group()
    f = by_id(init_argument_findings([call(0, env_world="0"), call(1, env_world="0")]))["DDP874"]
    assert f.ranks == [0, 1] and "WORLD_SIZE='0' in the environment (the launcher set '2'" in f.message
    assert "DDP868" not in by_id(init_argument_findings([call(0, env_world="0")]))


def test_torchs_default_world_size_is_not_a_world_of_minus_one():
    # world_size=-1 (torch's default) with env://: WORLD_SIZE is read
    rec = {**call(0), "world_size_passed": -1, "rank_passed": -1}
    assert init_argument_findings([rec, {**call(1), "world_size_passed": -1, "rank_passed": -1}]) == []


def test_a_rank_outside_the_world_is_named_with_both_values():
    kids = [child(0, rank=1, texts={"rank": "i + 1"}), child(1, rank=2, texts={"rank": "i + 1"})]
    found = by_id(init_argument_findings(kids))
    assert set(found) == {"DDP875"}
    f = found["DDP875"]
    assert f.ranks == [1] and f.severity == "error"
    assert f.message == ("spawned process 1 called init_process_group with rank=2 (rank=i + 1 passed at "
                         "spawn.py:9), outside 0-1 for world_size=2 (world_size=2 passed)")
    neg = by_id(init_argument_findings([child(0, rank=-2), child(1)]))["DDP875"]
    assert "rank=-2" in neg.message and neg.ranks == [0]


def test_a_launched_rank_outside_the_world_is_not_also_a_renumbering():
    found = by_id(init_argument_findings([call(0), call(1, rank_arg=5)]))
    assert set(found) == {"DDP875"} and found["DDP875"].ranks == [1]


def test_ranks_and_world_sizes_in_the_init_methods_query_are_read():
    rec = {**child(0, rank=-1, world=-1), "init_method": "tcp://127.0.0.1:29600?rank=0&world_size=0"}
    f = by_id(init_argument_findings([rec]))["DDP874"]
    assert "world_size=0 in init_method 'tcp://127.0.0.1:29600?rank=0&world_size=0'" in f.message


def test_duplicate_ranks_among_spawned_children_name_the_children():
    f = by_id(init_argument_findings([child(0, rank=0), child(1, rank=0)]))["DDP867"]
    assert f.message.startswith("spawned processes 0-1 all joined with rank 0 (rank=0 passed at spawn.py:9)")


def test_a_world_larger_than_the_spawn_started_is_named_once_every_child_called():
    kids = [child(i, world=4, texts={"world_size": "WORLD"}) for i in range(2)]
    found = by_id(init_argument_findings(kids))
    f = found["DDP868"]
    assert set(found) == {"DDP868"} and f.ranks == [0, 1]
    assert f.message == ("spawned processes 0-1 joined a world of 4 (world_size=WORLD passed at spawn.py:9); "
                         "torch.multiprocessing.spawn started 2 at spawn.py:14, and no other host can join "
                         "tcp://127.0.0.1:29600 (a loopback address)")
    assert f.evidence["started"] == 2 and f.evidence["world_size"] == 4
    assert blocking(list(found.values()), kids)


def test_a_world_the_spawn_started_is_clean_and_a_child_still_to_come_is_waited_for():
    assert init_argument_findings([child(i) for i in range(2)]) == []
    # spawn started 4, world 4, two have called so far: the others may still come
    assert init_argument_findings([child(i, world=4, nprocs=4) for i in range(2)]) == []
    # spawn started 2 and world 4, but only one child called yet: judged once both have
    assert init_argument_findings([child(0, world=4)]) == []
    assert "DDP868" in by_id(init_argument_findings([child(0, world=4)], settled=True))


def test_processes_nobody_counted_are_compared_only_once_settled():
    procs = [child(i, world=3, nprocs=None) for i in range(2)]  # multiprocessing.Process children
    assert init_argument_findings(procs) == []
    f = by_id(init_argument_findings(procs, settled=True))["DDP868"]
    assert "processes 200, 201 joined a world of 3" in f.message
    assert "only 2 processes called init_process_group for it" in f.message


def test_a_rendezvous_other_hosts_can_join_is_not_counted():
    # several nodes each spawning 2 for a world of 4: this node sees 2, the others may be elsewhere
    kids = [{**child(i, world=4), "init_method": "tcp://10.0.0.1:29600"} for i in range(2)]
    assert init_argument_findings(kids, settled=True) == []
    kids = [{**child(i, world=4), "init_method": "file:///shared/rdzv"} for i in range(2)]
    assert init_argument_findings(kids, settled=True) == []


def test_the_verdict_dates_the_cause_first_and_marks_the_childs_error_its_consequence():
    from ddp_doctor.checks.init_arguments import init_verdict
    from ddp_doctor.findings import Finding
    kids = [child(i, world=0, done=True, ok=False, t=10.0 + i) for i in range(2)]
    relayed = Finding(id="DDP805", category="training", severity="error", title="A spawned process failed",
                      message="spawned process 1 failed: ValueError: TCPStore world size cannot be 0", hint="",
                      ranks=[1], phase="training", time=20.0)
    other = Finding(id="DDP800", category="training", severity="error", title="t", message="m", hint="",
                    ranks=[7], phase="training", time=5.0)
    out = by_id(init_verdict([relayed, other], kids))
    assert out["DDP874"].time == 10.0
    assert out["DDP805"].caused_by == "DDP874"
    assert out["DDP800"].caused_by is None  # a process no init finding names
    # an init call that succeeded explains nothing after it
    fine = [child(i, world=0, done=True, ok=True) for i in range(2)]
    relayed.caused_by = None
    assert by_id(init_verdict([relayed], fine))["DDP805"].caused_by is None


# ---------------------------------------------------------------- ranks at different rendezvous

def moved(rec: dict, port: str, site: str | None = None) -> dict:
    """A launched rank's record whose script set MASTER_PORT=port (at `site`) before init."""
    out = {**rec, "env": {**rec["env"], "MASTER_PORT": port}}
    return {**out, "env_set_at": {"MASTER_PORT": site}} if site else out


def test_a_rank_that_set_its_own_master_port_went_elsewhere_and_is_named_with_the_line():
    odd = moved(call(1), "23999", "train.py:4")
    found = by_id(init_argument_findings([call(0), odd]))
    assert set(found) == {"DDP881"}
    f = found["DDP881"]
    assert f.ranks == [1] and f.severity == "error" and f.cause_class == "code"
    assert f.message == ("rank 1 went to another rendezvous than the others, and no group of 2 can form at any of "
                         "them: rank 0 at env://127.0.0.1:29500 (the launcher's); rank 1 at env://127.0.0.1:23999; "
                         "the script set MASTER_PORT at train.py:4 (23999); each would wait at its own until "
                         "torch's timeout")
    assert f.evidence["cohort"] == [0, 1] and f.evidence["launcher_rendezvous"] == "env://127.0.0.1:29500"
    assert blocking([f], [call(0), odd])  # they wait in init for nothing: the job is ended at once


def test_spawned_children_that_each_chose_a_port_are_all_named():
    kids = [{**child(i, method="env", port=str(41000 + i)), "env_set_at": {"MASTER_PORT": "spawn.py:6",
                                                                              "MASTER_ADDR": "spawn.py:5"}}
            for i in range(2)]
    f = by_id(init_argument_findings(kids))["DDP881"]
    assert f.ranks == [0, 1]
    assert f.message.startswith("each went to its own rendezvous, and no group of 2 can form at any of them: "
                                "spawned process 0 at env://127.0.0.1:41000; spawned process 1 at "
                                "env://127.0.0.1:41001; the script set MASTER_PORT at spawn.py:6 (41000, 41001);")
    assert "MASTER_ADDR" not in f.message  # the same on every rank: not what split them


def test_a_majority_at_one_rendezvous_names_the_ranks_that_left_it():
    kids = [child(i, world=3, nprocs=3, port="41000" if i < 2 else "41002") for i in range(3)]
    f = by_id(init_argument_findings(kids))["DDP881"]
    assert f.ranks == [2] and "spawned process 2 went to another rendezvous" in f.message


def test_one_rendezvous_two_groups_on_purpose_and_a_finished_init_are_not_split():
    assert init_argument_findings([call(0), call(1)]) == []
    # two worlds of 1, each complete on its own port
    solo = [child(i, world=1, port=str(41000 + i)) for i in range(2)]
    assert "DDP881" not in by_id(init_argument_findings(solo))
    # rank 0 already re-initialised on a new port while rank 1's record still shows the first,
    # which returned well: it met its group there
    again = [moved(call(0), "29501"), {**call(1), "done": True, "ok": True}]
    assert "DDP881" not in by_id(init_argument_findings(again))
    # children of two different spawns are not one job's ranks
    a, b = child(0, port="41000", parent=50), {**child(1, port="41001", parent=51)}
    assert "DDP881" not in by_id(init_argument_findings([a, b]))


def test_the_ranks_that_stayed_failed_as_a_consequence_of_the_split():
    from ddp_doctor.checks.init_arguments import init_verdict
    from ddp_doctor.findings import Finding
    odd = {**moved(call(1, done=True), "23999"), "ok": False}
    stayed = {**call(0, done=True), "ok": False}
    timeout = Finding(id="DDP835", category="training", severity="error", title="A store wait timed out",
                      message="rank 0 raised DistStoreError: wait timeout", hint="", ranks=[0], phase="training",
                      time=20.0)
    out = by_id(init_verdict([timeout], [stayed, odd]))
    assert out["DDP881"].ranks == [1] and out["DDP835"].caused_by == "DDP881"


# ---------------------------------------------------------------- ranks that never formed a group

def ended(rank: int, *, code=0, exception=None, pg=None, init_event=False, pg_up=False, steps=3) -> tuple:
    pid = 300 + rank
    outcome = {"rank": rank, "pid": pid, "exit_code": code, "exception": exception}
    probe = {"pid": pid, "rank": rank, "pg": pg or {}, "steps": steps,
             "events": [{"kind": "init_process_group"}] if init_event else [],
             "ended": {"how": "script", "pg_initialized": pg_up}}
    return outcome, probe


def no_group(outcomes_probes: dict, *, calls=(), ledgers=None, launched=None):
    from ddp_doctor.checks.init_arguments import no_process_group_finding
    outcomes = {r: op[0] for r, op in outcomes_probes.items()}
    probes = [op[1] for op in outcomes_probes.values() if op[1] is not None]
    return no_process_group_finding(launched if launched is not None else sorted(outcomes_probes), outcomes,
                                    list(calls), probes, ledgers or {})


def test_ranks_that_ended_well_without_a_process_group_are_a_warning():
    f = no_group({0: ended(0), 1: ended(1)})
    assert f is not None and f.id == "DDP876" and f.severity == "warning" and f.ranks == [0, 1]
    assert f.message == ("ranks 0-1 ended without calling init_process_group: each trained alone "
                         "(no gradients were synchronised)")
    assert "LOCAL_RANK" in f.hint and "--use_cpu" in f.hint and "init_process_group" in f.hint


def test_a_rank_that_formed_a_group_any_way_is_not_named():
    assert no_group({0: ended(0, pg={"rank": 0}), 1: ended(1, pg={"rank": 1})}) is None
    assert no_group({0: ended(0, pg_up=True), 1: ended(1, init_event=True)}) is None
    calls = [{"pid": 300}, {"pid": 301}]  # init records of both processes
    assert no_group({0: ended(0), 1: ended(1)}, calls=calls) is None
    assert no_group({0: ended(0), 1: ended(1)}, ledgers={0: {"entries": [{}]}, 1: {"entries": [{}]}}) is None


def test_only_ranks_that_ended_well_and_more_than_one_launched():
    assert no_group({0: ended(0)}) is None  # one rank: nothing to synchronise with
    f = no_group({0: ended(0, pg={"rank": 0}), 1: ended(1)})
    assert f is not None and f.ranks == [1]
    assert f.message == ("rank 1 ended without calling init_process_group: it trained alone "
                         "(no gradients were synchronised with rank 0)")
    assert no_group({0: ended(0, code=1), 1: ended(1, exception={"type": "ValueError"})}) is None


def test_a_rank_whose_end_the_recorder_did_not_see_is_not_judged():
    outcome, _ = ended(1)
    assert no_group({0: ended(0, pg={"rank": 0}), 1: (outcome, None)}) is None  # probes not installed
