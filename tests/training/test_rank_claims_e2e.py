"""A rank claimed by processes on two nodes (rank=LOCAL_RANK): `ddp-doctor run --nnodes 2` on each
simulated node names DDP867 with both hosts and the line, and ends the job at init (exit 124)
instead of torch's timeout; the launcher's RANK stays clean."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers.procs import clean_env, finish, load_json, start

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
SCRIPT = "rank_from_local_rank.py"


def two_nodes(tmp_path: Path, script_args: list[str], script: str = SCRIPT) -> list:
    """`ddp-doctor run --nnodes 2` of SCRIPT, one rank a node, on algo-1 and algo-2 (namespaces);
    each node's report in tmp_path/nodeN.json. Their results, waited for with a bound."""
    from helpers.nodes import hosts_file, on_node, require_namespaces
    from helpers.procs import free_port
    require_namespaces()
    hosts = hosts_file(tmp_path, ["algo-1", "algo-2"])
    port = free_port()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "ddp_doctor", "run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--master-addr", "algo-1", "--master-port", str(port),
               "--timeout", "30", "--skip", "communication", "--report", str(tmp_path / f"node{node}.json"),
               str(SCRIPTS / script), *script_args]
        procs.append(start(on_node(f"algo-{node + 1}", hosts, cmd), clean_env(), str(tmp_path)))
    return [finish(p, 150) for p in procs]


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
