"""Cause, not symptom, as gathered: real 2-rank gloo scripts under `ddp-doctor run` leave each
rank's ledger of the script's own collectives (pending ones at a hang), and on two simulated nodes
the reports name the cause on the other node. What the reports of these scenarios say is judged
from their recorded evidence in test_cause.py (tests/corpus/cause/); the evidence these launches
write is replayed after the session (tests/helpers/report_files.py).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.procs import load_json, outputs, run_all
from helpers.scenarios import launch, line_of

pytestmark = pytest.mark.slow
KEPT = ("sizes", "rank0_only")  # the launches whose run directories the ledger tests read


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("cause")


@pytest.fixture(scope="module")
def runs(base):
    return {"base": base, "results": run_all({name: launch("cause", name, base) for name in KEPT})}


def ledgers_of(runs_dir: Path) -> dict[int, dict]:
    """The ledgers a run left in its kept run directory (--run-dir)."""
    from ddp_doctor.training import records
    [run_dir] = [p for p in runs_dir.iterdir() if p.name.startswith("ddp-doctor-run-")]
    return records.read_ledgers(str(run_dir))


def two_nodes(tmp_path: Path, script: str, extra: list[str]) -> list:
    """`ddp-doctor run --nnodes 2` of `script` on algo-1 and algo-2 (helpers.nodes)."""
    from helpers.nodes import doctor_run_on_two_nodes
    from helpers.scenarios import SCRIPTS
    return doctor_run_on_two_nodes(tmp_path, SCRIPTS / script, extra)


def test_each_rank_leaves_its_ledger_of_the_scripts_own_collectives(runs, base):
    ledgers = ledgers_of(base / "sizes-runs")
    assert sorted(ledgers) == [0, 1]
    for rank, led in ledgers.items():
        assert led["rank"] == rank and led["source"] == "flight_recorder" and led["complete"] is True
        # only the script's collective (the preflight's own group is left out), with its line
        [entry] = led["entries"]
        assert entry["profiling_name"] == "gloo:all_reduce" and entry["input_sizes"] == [[3 + rank]]
        assert entry["user_site"].endswith(line_of("size_mismatch.py", "dist.all_reduce(t)"))
    assert ledgers[0]["position"] == "destroyed" and ledgers[1]["position"] == "failed"
    assert ledgers[1]["entries"][0].get("failed_here") is True


def test_a_hang_leaves_ledgers_with_the_pending_collectives(runs, base):
    ledgers = ledgers_of(base / "rank0_only-runs")
    assert {led["position"] for led in ledgers.values()} == {"hung"}
    assert [(e["profiling_name"], e["retired"]) for e in ledgers[0]["entries"]] == [("gloo:all_reduce", False)]
    assert [(e["profiling_name"], e["retired"]) for e in ledgers[1]["entries"]] == [("gloo:barrier", False)]
    assert "rank0_only_allreduce.py" in ledgers[1]["where"]


def test_across_nodes_the_master_nodes_report_names_the_cause_on_the_other_node(tmp_path):
    """Two simulated nodes (`ddp-doctor run --nnodes 2`, one rank each, host names algo-1/algo-2):
    rank 1 on node 1 raises; node 0's report, the one read first, names it (from the job's store)."""
    results = two_nodes(tmp_path, "rank1_raises.py", [])
    for node, res in enumerate(results):
        assert res.rc == 1, res.output
        rep = load_json(str(tmp_path / f"node{node}.json"))
        cause = rep["root_cause"]
        assert cause["id"] == "DDP800" and cause["ranks"] == [1], (node, rep["findings"])
        assert "ValueError: bad batch on rank 1" in cause["message"]
        assert not [f for f in rep["findings"] if f["id"] == "DDP003"], rep["findings"]  # no lost "local rank 0"
    node0 = load_json(str(tmp_path / "node0.json"))
    peer = [f for f in node0["findings"] if f["ranks"] == [0] and f["severity"] == "error"]
    assert peer and all(f["evidence"].get("consequence") for f in peer)


def test_a_hang_on_another_node_is_named_on_every_node_with_its_line(tmp_path):
    """Two simulated nodes, one rank each: rank 1 (node 1) blocks on a queue before its next
    all_reduce while rank 0 (node 0) waits in it. Each node finds the hang on its own; the ranks
    share their ledgers and stacks through the job's store, so both reports name rank 1 and its line."""
    results = two_nodes(tmp_path, "rank1_blocks_on_queue.py", ["--hang-timeout", "8", "--skip", "communication"])
    blocked = line_of("rank1_blocks_on_queue.py", "batches.get()")
    for node, res in enumerate(results):
        assert res.rc == 124, (node, res.output)
        rep = load_json(str(tmp_path / f"node{node}.json"))
        cause = rep["root_cause"]
        assert cause["id"] == "DDP891" and cause["ranks"] == [1], (node, rep["findings"], outputs(results))
        assert blocked in cause["message"] and "rank 0 waits in all_reduce" in cause["message"]
        (hang,) = [f for f in rep["findings"] if f["id"] == "DDP801"]
        assert hang["ranks"] == [1] and hang["evidence"]["consequence"], (node, hang)
        assert blocked in hang["evidence"]["stacks"]["1"].replace('", line ', ":"), (node, hang["evidence"]["stacks"])
