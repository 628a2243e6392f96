"""A node that never arrives: `ddp-doctor run --nnodes 2` on node 0 alone must
name the missing node within the --timeout bound, not wait in the launcher's rendezvous for
torch's 900 s."""
from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.procs import DDP, assert_clean_output, clean_env, free_port, load_json, run

from ddp_doctor.training.run import stall_watch

SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"


@pytest.mark.slow
def test_node_0_alone_names_node_1_missing_within_the_bound(tmp_path):
    report = tmp_path / "r.json"
    res = run([*DDP, "run", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--timeout", "10",
               "--report", str(report), str(SCRIPTS / "ok_allreduce.py")], clean_env(), str(tmp_path),
              timeout=90.0)  # run() fails the test if anything of the tree is left behind
    print(f"node 0 alone, --nnodes 2 --timeout 10: exit {res.rc} after {res.seconds:.1f} s")
    assert res.rc == 3, res.output
    assert_clean_output(res)
    rep = load_json(str(report))
    assert rep["status"] == "fail" and rep["root_cause"]["id"] == "DDP320"
    cause = rep["root_cause"]
    assert "node 1 never joined" in cause["message"] and cause["ranks"] == [1]
    # the rendezvous ended by the --timeout bound (torch's own wait: 900 s; run() above fails the test
    # past 90 s): the bound that was applied, as the finding gives it
    assert cause["evidence"]["bound_s"] == 10.0 and "within 10 s" in cause["message"], cause
    assert "security group" in cause["hint"] and "--nnodes" in cause["hint"]
    assert rep["world"]["nnodes"] == 2


def test_the_parent_ends_a_launcher_that_outwaits_the_bound(tmp_path):
    """The parent's own watch (the launcher ignores its bound, e.g. an old torch): past the
    bound + grace with no rank started, it leaves the finding and says the launcher must end."""
    run_dir = str(tmp_path)
    torchrun = ["--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "--master-port", "29999"]
    opts = SimpleNamespace(timeout=10.0)
    assert not stall_watch.nodes_never_met(run_dir, torchrun, opts, time.monotonic())
    assert stall_watch.nodes_never_met(run_dir, torchrun, opts, time.monotonic() - 10.0 - stall_watch.NODES_GRACE - 1)
    with open(tmp_path / "preflight" / "report.json", encoding="utf-8") as f:
        rep = json.load(f)
    assert rep["root_cause"]["id"] == "DDP320" and rep["root_cause"]["ranks"] == [2, 3]
    assert "node 1 never joined" in rep["root_cause"]["message"] and "29999" in rep["root_cause"]["message"]
    assert not stall_watch.nodes_never_met(str(tmp_path / "one"), ["--nnodes", "1"], opts, time.monotonic() - 999)
