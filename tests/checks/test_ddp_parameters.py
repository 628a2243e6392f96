"""DDP's errors about single parameters, named (ddp_doctor/checks/ddp_parameters.py): the indices of
"Expected to have finished reduction" (DDP823) and "marked as ready twice" (DDP847) mapped to the
names the probes recorded; the texts are torch 2.13's, captured from tests/run_scripts/ddp_unused_parameters.py."""
from __future__ import annotations

from ddp_doctor.checks.ddp_parameters import (
    Named,
    name_indices,
    ready_twice,
    unused_indices,
    with_parameter_names,
)
from ddp_doctor.checks.rank_endings import training_findings
from ddp_doctor.checks.signatures import classify
from ddp_doctor.training.job_report import job_report

REDUCTION = ("Expected to have finished reduction in the prior iteration before starting a new one. This error "
             "indicates that your module has parameters that were not used in producing loss. You can enable "
             "unused parameter detection by passing the keyword argument `find_unused_parameters=True` to "
             "`torch.nn.parallel.DistributedDataParallel`, and by \nmaking sure all `forward` function outputs "
             "participate in calculating loss. \nIf you already have done the above, then the distributed data "
             "parallel module wasn't able to locate the output tensors in the return value of your module's "
             "`forward` function. Please include the loss function and the structure of the return value of "
             "`forward` of your module when reporting this issue (e.g. list, dict, iterable).\n")
DEBUG_HINT = ("\n In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or "
              "DETAIL to print out information about which particular parameters did not receive gradient on "
              "this rank as part of this error")
TWICE = ("Expected to mark a variable ready only once. This error is caused by one of the following reasons: 1) "
         "Use of a module parameter outside the `forward` function. Please make sure model parameters are not "
         "shared across multiple concurrent forward-backward passes. or try to use _set_static_graph() as a "
         "workaround if this module graph does not change during training loop.2) Reused parameters in "
         "multiple reentrant backward passes. For example, if you use multiple `checkpoint` functions to wrap "
         "the same part of your model, it would result in the same set of parameters been used by different "
         "reentrant backward passes multiple times, and hence marking a variable ready multiple times. DDP does "
         "not support such use cases in default. You can try to use _set_static_graph() as a workaround if "
         "your module graph does not change over iterations.\n")
GLOO_CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
               "[127.0.0.1]:22240. This is typically caused by a remote worker crashing.")

HEAD = ["trunk.weight", "trunk.bias", "tied.bias", "shared.weight", "shared.bias", "unused_head.weight",
        "unused_head.bias"]
BRANCHY = ["trunk.weight", "trunk.bias", "extra.0.weight", "extra.0.bias", "extra.2.weight", "extra.2.bias",
           "out.weight", "out.bias"]


def unused(rank: int, indices: str) -> str:
    return REDUCTION + f"Parameter indices which did not receive grad for rank {rank}: {indices}" + DEBUG_HINT


def outcome(message: str, t: float) -> dict:
    return {"exit_code": 1, "time": t, "exception": {
        "type": "RuntimeError", "message": message, "time": t,
        "traceback": 'Traceback (most recent call last):\n  File "/job/train.py", line 21, in <module>\n'
                     "    model(x).sum().backward()\nRuntimeError: " + message + "\n"}}


def probe(rank: int, *models: tuple[str, list[str]], count: int | None = None) -> dict:
    return {"rank": rank, "pid": 100 + rank, "pg": {"rank": rank, "world_size": 2}, "ended": {"how": "script"},
            "ddp_parameters": [{"model": m, "count": count or len(names), "names": names} for m, names in models]}


def judged(outcomes: dict, probes: list, ranks: tuple[int, ...] = (0, 1)):
    findings, _ = training_findings(outcomes, {r: 1 for r in outcomes}, list(ranks))
    return with_parameter_names(findings, outcomes, probes)


# ------------------------------------------------------------------------------ reading torch's text

def test_indices_and_debug_names_are_read_from_the_message():
    assert unused_indices(unused(1, "4 5")) == ([4, 5], [])
    info = (REDUCTION + "Parameters which did not receive grad for rank 0: unused_head.bias, unused_head.weight\n"
            "Parameter indices which did not receive grad for rank 0: 5 6")
    assert unused_indices(info) == ([5, 6], ["unused_head.bias", "unused_head.weight"])
    assert unused_indices(REDUCTION) is None  # the text cut before the indices
    assert ready_twice(TWICE + "Parameter at index 3 with name block.lin.bias has been marked as ready twice.") == (
        3, "block.lin.bias")
    assert ready_twice(TWICE + "Parameter at index 7 has been marked as ready twice.") == (7, None)
    assert classify("RuntimeError: " + TWICE).entry.id == "DDP847"


# ------------------------------------------------------------------------------- the pure mapping

def test_indices_are_named_against_the_model_that_holds_them():
    assert name_indices([5, 6], [{"model": "Net", "count": 7, "names": HEAD}]) == [
        Named("Net", ((5, "unused_head.weight"), (6, "unused_head.bias")))]
    assert name_indices([5, 6], []) == []  # no record: nothing named
    # beyond the names kept (the record keeps at most 4096) but within the model: the index stays
    assert name_indices([1, 5000], [{"model": "Big", "count": 6000, "names": ["a", "b"]}]) == [
        Named("Big", ((1, "b"), (5000, None)))]
    # an index past every model's parameters: no model raised it
    assert name_indices([9], [{"model": "Net", "count": 7, "names": HEAD}]) == []
    # two models hold the index (a GAN's two DDP models); the same list noted twice counts once
    two = name_indices([0], [{"model": "G", "count": 2, "names": ["g.w", "g.b"]},
                             {"model": "D", "count": 1, "names": ["d.w"]},
                             {"model": "G", "count": 2, "names": ["g.w", "g.b"]}])
    assert two == [Named("G", ((0, "g.w"),)), Named("D", ((0, "d.w"),))]
    assert name_indices([1], [{"model": "G", "count": 2, "names": ["g.w", "g.b"]},
                              {"model": "D", "count": 1, "names": ["d.w"]}]) == [Named("G", ((1, "g.b"),))]


# ------------------------------------------------------------------------------- the findings

def test_a_head_unused_on_every_rank_is_named_once_for_both_ranks():
    outcomes = {0: outcome(unused(0, "5 6"), 10.0), 1: outcome(unused(1, "5 6"), 10.1)}
    [f] = judged(outcomes, [probe(0, ("Net", HEAD)), probe(1, ("Net", HEAD))])
    assert f.id == "DDP823" and f.ranks == [0, 1]
    assert f.message.startswith("ranks 0-1: parameters unused in each one's iteration (DDP did not receive their "
                                "gradient): unused_head.weight (index 5), unused_head.bias (index 6)"), f.message
    assert "Expected to have finished reduction in the prior iteration" in f.message
    assert f.evidence["unused_parameters"]["1"] == [{"model": "Net", "index": 5, "name": "unused_head.weight"},
                                                    {"model": "Net", "index": 6, "name": "unused_head.bias"}]
    assert "find_unused_parameters=True" in f.hint and "static_graph=True" in f.hint
    assert f.evidence["error"].startswith("ranks 0-1 each raised RuntimeError")  # torch's words, kept


def test_a_branch_skipped_on_one_rank_names_that_rank_only():
    outcomes = {1: outcome(unused(1, "2 3 4 5"), 10.0), 0: outcome(GLOO_CLOSED, 10.2)}
    found = judged(outcomes, [probe(0, ("Branchy", BRANCHY)), probe(1, ("Branchy", BRANCHY))])
    [f] = [f for f in found if f.id == "DDP823"]
    assert f.ranks == [1]
    assert f.message.startswith("rank 1: parameters unused in its iteration (DDP did not receive their gradient): "
                                "extra.0.weight (index 2), extra.0.bias (index 3), extra.2.weight (index 4), "
                                "extra.2.bias (index 5); so its next forward raised"), f.message
    assert [g.id for g in found if g is not f] == ["DDP802"]  # rank 0 failed after it, untouched


def test_ranks_with_different_unused_parameters_are_each_named():
    outcomes = {0: outcome(unused(0, "5 6"), 10.0), 1: outcome(unused(1, "2"), 10.1)}
    found = judged(outcomes, [probe(0, ("Net", HEAD)), probe(1, ("Net", HEAD))])
    by_rank = {tuple(f.ranks): f.message for f in found if f.id == "DDP823"}
    assert by_rank[(0,)].startswith("rank 0: parameters unused in its iteration (DDP did not receive their "
                                    "gradient): unused_head.weight (index 5), unused_head.bias (index 6)")
    assert by_rank[(1,)].startswith("rank 1: parameters unused in its iteration (DDP did not receive their "
                                    "gradient): tied.bias (index 2)")


def test_without_names_the_finding_keeps_its_wording():
    outcomes = {0: outcome(unused(0, "5 6"), 10.0), 1: outcome(unused(1, "5 6"), 10.1)}
    before, _ = training_findings(outcomes, {0: 1, 1: 1}, [0, 1])
    assert with_parameter_names(before, outcomes, []) == before  # a post-mortem: no probe record
    old = [{"rank": 0, "pg": {"rank": 0}}, {"rank": 1, "pg": {"rank": 1}}]  # a record from before the names
    assert with_parameter_names(before, outcomes, old) == before
    past = [probe(0, ("Tiny", ["w"])), probe(1, ("Tiny", ["w"]))]  # the indices are past its one parameter
    assert with_parameter_names(before, outcomes, past) == before


def test_names_torch_printed_under_debug_are_used_without_a_record():
    info = (REDUCTION + "Parameters which did not receive grad for rank 1: unused_head.bias, unused_head.weight\n"
            "Parameter indices which did not receive grad for rank 1: 5 6")
    [f] = [f for f in judged({1: outcome(info, 10.0)}, [], ranks=(1,)) if f.id == "DDP823"]
    assert f.message.startswith("rank 1: parameters unused in its iteration (DDP did not receive their gradient): "
                                "unused_head.bias, unused_head.weight (indices 5 6)"), f.message


def test_several_models_that_hold_the_indices_are_each_said():
    outcomes = {0: outcome(unused(0, "0"), 10.0)}
    [f] = judged(outcomes, [probe(0, ("Generator", ["g.w", "g.b"]), ("Critic", ["d.w"]))], ranks=(0,))
    assert ("in Generator (DDP model 1): g.w (index 0); or, in Critic (DDP model 2): d.w (index 0) (the rank "
            "built 2 DDP models") in f.message, f.message


def test_a_long_list_is_cut_in_the_message_and_kept_in_the_evidence():
    names = [f"layers.{i}.weight" for i in range(40)]
    outcomes = {0: outcome(unused(0, " ".join(map(str, range(40)))), 10.0)}
    [f] = judged(outcomes, [probe(0, ("Deep", names))], ranks=(0,))
    assert "layers.11.weight (index 11) and 28 more" in f.message and "layers.12.weight" not in f.message
    assert len(f.evidence["unused_parameters"]["0"]) == 40
    long_names = [f"{'x' * 190}.{i}" for i in range(5)]  # the message stays short with long names too
    [g] = judged({0: outcome(unused(0, "0 1 2 3 4"), 10.0)}, [probe(0, ("Long", long_names))], ranks=(0,))
    assert f"{long_names[1]} (index 1) and 3 more" in g.message and long_names[2] not in g.message


def test_a_parameter_marked_ready_twice_is_named_with_its_module():
    named = TWICE + "Parameter at index 3 with name block.lin.bias has been marked as ready twice."
    found = judged({0: outcome(named, 10.0), 1: outcome(named, 10.1)}, [])
    assert {f.id for f in found} == {"DDP847"}
    assert found[0].message.startswith("rank 0: parameter block.lin.bias (index 3, of module block.lin) got its "
                                       "gradient twice in one backward pass"), found[0].message
    assert "use_reentrant=False" in found[0].hint and "static_graph=True" in found[0].hint
    # an older torch gives the index only: the record names it
    bare = TWICE + "Parameter at index 3 has been marked as ready twice."
    [f] = judged({0: outcome(bare, 10.0)}, [probe(0, ("Checkpointed", ["pre.weight", "pre.bias", "block.lin.weight",
                                                                        "block.lin.bias"]))], ranks=(0,))
    assert f.message.startswith("rank 0: parameter block.lin.bias (index 3, of module block.lin)"), f.message
    [g] = judged({0: outcome(bare, 10.0)}, [], ranks=(0,))
    assert g.message.startswith("rank 0 raised RuntimeError: Expected to mark a variable ready only once")


def test_the_job_report_names_them_in_its_root_cause():
    from ddp_doctor.checks.job import JobEvidence
    ev = JobEvidence(ranks=[0, 1], outcomes={1: outcome(unused(1, "2 3 4 5"), 10.0), 0: outcome(GLOO_CLOSED, 10.2)},
                     exits={0: 1, 1: 1}, probes=[probe(0, ("Branchy", BRANCHY)), probe(1, ("Branchy", BRANCHY))])
    rep, code = job_report(ev, world={"launcher": "test"})
    assert code == 1 and rep["root_cause"]["id"] == "DDP823" and rep["root_cause"]["ranks"] == [1]
    assert "extra.0.weight (index 2)" in rep["root_cause"]["message"]
