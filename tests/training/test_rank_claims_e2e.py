"""A rank claimed by processes on two nodes (rank=LOCAL_RANK): `ddp-doctor run --nnodes 2` on each
simulated node names DDP867 with both hosts and the line, and ends the job at init (exit 124)
instead of torch's timeout; the launcher's RANK stays clean."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.procs import load_json

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
SCRIPT = "rank_from_local_rank.py"


def two_nodes(tmp_path: Path, script_args: list[str], script: str = SCRIPT) -> list:
    """`ddp-doctor run --nnodes 2` of `script` on algo-1 and algo-2 (helpers.nodes)."""
    from helpers.nodes import doctor_run_on_two_nodes
    return doctor_run_on_two_nodes(tmp_path, SCRIPTS / script, ["--skip", "communication"], script_args)


def line_of(text: str, script: str = SCRIPT) -> str:
    lines = (SCRIPTS / script).read_text().splitlines()
    return f"{script}:{next(i for i, ln in enumerate(lines, 1) if text in ln)}"


def test_rank_from_local_rank_on_two_nodes_is_named_on_each_node_with_both_hosts(tmp_path):
    results = two_nodes(tmp_path, [])
    site = line_of("dist.init_process_group(")
    for node, res in enumerate(results):
        assert res.rc == 124, (node, res.output)
        rep = load_json(str(tmp_path / f"node{node}.json"))
        dup = [f for f in rep["findings"] if f["id"] == "DDP867"]
        assert dup, (node, rep["findings"])
        msg = dup[0]["message"]
        assert rep["root_cause"]["id"] == "DDP867", rep["root_cause"]
        assert "all joined with rank 0 (rank=rank passed at " in msg and site + ", computed by " in msg, msg
        assert "`rank = int(os.environ[\"RANK\" if \"--right\" in sys.argv else \"LOCAL_RANK\"])` at " in msg, msg
        assert line_of("rank = int(") in msg, msg
        assert "the launcher gave RANK=0, RANK=1" in msg, msg
        assert "rank 0 on algo-1 (pid" in msg and "rank 1 on algo-2 (pid" in msg, msg
        assert dup[0]["evidence"]["hosts"] == ["algo-1", "algo-2"]


def test_the_launchers_rank_on_two_nodes_stays_clean(tmp_path):
    results = two_nodes(tmp_path, ["--right"])
    for node, res in enumerate(results):
        assert res.rc == 0, (node, res.output)
        rep = load_json(str(tmp_path / f"node{node}.json"))
        assert not [f for f in rep["findings"] if f["id"] in ("DDP867", "DDP869")], rep["findings"]


def test_a_node_index_the_launcher_does_not_set_is_named_with_the_line_that_computed_the_rank(tmp_path):
    """rank = NODE_RANK x per node + LOCAL_RANK, NODE_RANK unset under torchrun: both nodes claim
    rank 0; each node's report names both hosts and the computing line."""
    script = "rank_from_node_rank.py"
    results = two_nodes(tmp_path, [], script)
    for node, res in enumerate(results):
        assert res.rc == 124, (node, res.output)
        rep = load_json(str(tmp_path / f"node{node}.json"))
        assert rep["root_cause"]["id"] == "DDP867", rep["findings"]
        msg = rep["root_cause"]["message"]
        assert line_of("dist.init_process_group(", script) in msg, msg
        assert line_of("rank = node *", script) in msg, msg
        assert "rank 0 on algo-1 (pid" in msg and "rank 1 on algo-2 (pid" in msg, msg
