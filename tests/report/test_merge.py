"""One finding per (ID, message modulo the rank): the same problem on several ranks is listed once
with every rank; messages that differ in anything else stay apart."""
from __future__ import annotations

from ddp_doctor.findings import Finding
from ddp_doctor.report.build import build_report, merge_findings
from ddp_doctor.report.render import render_text


def F(ranks, message, *, id="DDP840", evidence=None, t=1.0, hint="Use gloo on CPU.", severity="error"):
    return Finding(id=id, category="training_failure", severity=severity, title="NCCL backend not available",
                   message=message, hint=hint, ranks=[ranks] if isinstance(ranks, int) else list(ranks),
                   evidence=evidence or {}, time=t, phase="training")


def test_same_error_on_two_ranks_is_one_finding_listing_both():
    # what `ddp-doctor run --nproc-per-node 2` of pytorch/examples' multigpu_torchrun.py gives on CPU
    out = merge_findings([
        F(0, "rank 0 raised RuntimeError: Distributed package doesn't have NCCL built in", t=2.0,
          evidence={"exception": "RuntimeError", "traceback": "tb of rank 0"}),
        F(1, "rank 1 raised RuntimeError: Distributed package doesn't have NCCL built in", t=1.5,
          evidence={"exception": "RuntimeError", "traceback": "tb of rank 1"})])
    (f,) = out
    assert f.ranks == [0, 1] and f.time == 1.5
    assert f.message == "ranks 0-1 raised RuntimeError: Distributed package doesn't have NCCL built in"
    assert f.evidence["per_rank"] == {"0": {"exception": "RuntimeError", "traceback": "tb of rank 0"},
                                      "1": {"exception": "RuntimeError", "traceback": "tb of rank 1"}}
    assert f.evidence["traceback"] == "tb of rank 1"  # the earliest one's, at the top level as before


def test_identical_evidence_is_not_repeated_per_rank():
    (f,) = merge_findings([F(r, f"rank {r} raised X", evidence={"exception": "X"}) for r in (0, 1, 2, 3, 7)])
    assert f.message == "ranks 0-3, 7 raised X" and "per_rank" not in f.evidence


def test_forms_of_a_rank_mention():
    cases = [("rank(s) {r} cannot reach the master", "rank(s) 0-1 cannot reach the master"),
             ("local rank {r} sees no GPU", "local ranks 0-1 sees no GPU"),
             ("Rank {r} is on cuda:0", "Ranks 0-1 is on cuda:0"),
             ("[rank{r}]: RuntimeError: boom", "[ranks 0-1]: RuntimeError: boom")]
    for template, want in cases:
        (f,) = merge_findings([F(r, template.format(r=r)) for r in (0, 1)])
        assert f.message == want, (template, f.message)


def test_messages_that_differ_in_more_than_the_rank_stay_apart():
    out = merge_findings([F(0, "rank 0: WORLD_SIZE=2"), F(1, "rank 1: WORLD_SIZE=3")])
    assert sorted(f.message for f in out) == ["rank 0: WORLD_SIZE=2", "rank 1: WORLD_SIZE=3"]
    # rank numbers that are not the finding's own rank are part of what it says
    mismatch = [F(0, "rank 0 raised RuntimeError: Rank 0 is running [4], but Rank 1 is running [5]", id="DDP842"),
                F(1, "rank 1 raised RuntimeError: Rank 1 is running [5], but Rank 0 is running [4]", id="DDP842")]
    assert len(merge_findings(mismatch)) == 2
    # a different number that only looks like a rank
    assert len(merge_findings([F(1, "rank 1 sees rank 10"), F(2, "rank 2 sees rank 20")])) == 2
    # another ID, another severity or another hint
    assert len(merge_findings([F(0, "rank 0 raised X"), F(1, "rank 1 raised X", id="DDP831")])) == 2
    assert len(merge_findings([F(0, "rank 0 raised X"), F(1, "rank 1 raised X", severity="warning")])) == 2
    assert len(merge_findings([F(0, "rank 0 raised X"), F(1, "rank 1 raised X", hint="other")])) == 2


def test_a_peer_named_in_the_message_stays_and_the_own_ranks_merge():
    out = merge_findings([F(r, f"rank {r} failed after rank 1 failed: Connection closed by peer", id="DDP802")
                          for r in (0, 2, 3)])
    (f,) = out
    assert f.message == "ranks 0, 2-3 failed after rank 1 failed: Connection closed by peer"


def test_hint_naming_the_rank_merges_too():
    out = merge_findings([F(r, f"rank {r}: RANK unset", hint=f"export RANK on rank {r}") for r in (0, 1)])
    (f,) = out
    assert f.hint == "export RANK on ranks 0-1"


def test_a_cross_rank_finding_keeps_its_own_words():
    msg = "ranks 0, 1 drew the same samples; Rank 1 is behind Rank 0"
    (f,) = merge_findings([F([0, 1], msg, id="DDP850")])
    assert f.message == msg and f.ranks == [0, 1]


def test_merging_a_merged_report_again_adds_the_late_rank():
    first = merge_findings([F(r, f"rank {r} raised X", evidence={"tb": str(r)}) for r in (0, 1)])
    (f,) = merge_findings(first + [F(3, "rank 3 raised X", evidence={"tb": "3"})])
    assert f.message == "ranks 0-1, 3 raised X" and f.ranks == [0, 1, 3]
    assert sorted(f.evidence["per_rank"]) == ["0", "1", "3"]


def test_report_and_text_show_one_finding_and_the_root_cause_names_every_rank():
    rep = build_report(world={"launcher": "torchrun", "backend": "gloo", "world_size": 2}, ranks=[],
                       findings=[F(r, f"rank {r} raised RuntimeError: No module named 'smdistributed'", id="DDP831")
                                 for r in (0, 1)], phase="training")
    assert [f["id"] for f in rep["findings"]] == ["DDP831"] and rep["root_cause"]["ranks"] == [0, 1]
    text = render_text(rep)
    assert text.count("DDP831") == 1  # the root cause, said once (never again under Errors)
    assert "ranks 0-1 raised RuntimeError: No module named 'smdistributed'" in text


def test_headline_names_the_command_when_given():
    rep = build_report(world={"world_size": 2}, ranks=[], findings=[])
    assert render_text(rep).startswith("ddp-doctor preflight: PASS")
    assert render_text(rep, command="bench-comm").startswith("ddp-doctor bench-comm: PASS")


def test_identical_texts_naming_rank_0_merge_first():
    # every rank's hint names "the host of rank 0": rank 0's own copy must not become a placeholder
    hint = "mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500 ..."
    out = merge_findings([F(r, "MASTER_ADDR is not set under mpirun", hint=hint, id="DDP104") for r in (0, 1, 2)])
    (f,) = out
    assert f.ranks == [0, 1, 2] and f.hint == hint and f.message == "MASTER_ADDR is not set under mpirun"
