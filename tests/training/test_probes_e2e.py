"""In-training probes on real ranks: each rule with a bad script and the correct one, 2 gloo ranks.

tests/probe_scripts/loop.py is one DDP loop with switches, each introducing one mistake; without
switches it is the correct recipe and nothing may be reported about it.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers.procs import DDP, assert_healthy, clean_env, free_port, ids, load_json, run

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "probe_scripts"
ROOT = Path(__file__).resolve().parents[2]
# Not DDP872 (a data-loading straggler): a busy 2-core machine can cause it (helpers.procs.TIMING_WARNINGS);
# the test that plants a straggler asserts it by name.
PROBE_IDS = {"DDP850", "DDP852", "DDP853", "DDP860", "DDP861", "DDP862", "DDP863", "DDP864", "DDP865",
             "DDP870", "DDP871", "DDP880"}


def run_loop(tmp_path: Path, *flags: str, expect_rc: int = 0) -> dict:
    report = tmp_path / "r.json"
    res = run([*DDP, "run", "--nproc-per-node", "2", "--report", str(report), str(SCRIPTS / "loop.py"), *flags],
              clean_env(), str(tmp_path), timeout=180)
    assert res.rc == expect_rc, res.output
    rep = load_json(str(report))
    assert rep["phase"] == "training"
    if expect_rc == 0:  # the script's own exit status and output pass through
        assert sorted(ln.split(" done")[0] for ln in res.stdout.splitlines() if " done" in ln) == ["rank 0", "rank 1"]
    return rep


def find(rep: dict, check_id: str) -> list[dict]:
    return [f for f in rep["findings"] if f["id"] == check_id]


def test_correct_loop_has_no_probe_findings(tmp_path):
    rep = run_loop(tmp_path)
    assert_healthy(rep)
    assert not ids(rep) & PROBE_IDS, rep["findings"]


def test_each_rank_reading_its_own_data_is_not_overlap(tmp_path):
    # Same indices on both ranks but different samples behind them: the data set is sharded by rank.
    rep = run_loop(tmp_path, "--own-shard")
    assert not ids(rep) & PROBE_IDS, rep["findings"]


def test_no_distributed_sampler_and_no_destroy(tmp_path):
    # Two mistakes in one run, each judged on its own: every rank draws the same samples, and the
    # group is left up at exit.
    rep = run_loop(tmp_path, "--no-sampler", "--no-destroy")
    [f] = find(rep, "DDP850")
    assert f["severity"] == "error" and f["ranks"] == [0, 1] and f["phase"] == "training"
    assert "loop.py" in f["message"] and "RandomSampler" in f["message"]
    assert "DDP853" not in ids(rep)  # the proven overlap replaces the static warning
    [left] = find(rep, "DDP880")
    assert left["ranks"] == [0, 1] and left["phase"] == "teardown"
    assert rep["status"] == "fail" and rep["root_cause"]["id"] == "DDP850"
    assert not ids(rep) & (PROBE_IDS - {"DDP850", "DDP880"}), rep["findings"]


def test_unsharded_loader_without_early_overlap_is_a_warning(tmp_path):
    # Each rank shuffles 20000 samples with its own seed: the first batches happen not to overlap,
    # but no rank is given a shard of its own.
    rep = run_loop(tmp_path, "--no-sampler", "--rank-seed", "--samples", "20000", "--max-batches", "10")
    [f] = find(rep, "DDP853")
    assert f["severity"] == "warning" and f["ranks"] == [0, 1] and "RandomSampler" in f["message"]
    assert not ids(rep) & (PROBE_IDS - {"DDP853"}), rep["findings"]


def test_missing_set_epoch_data_straggler_forward_through_module_local_buffer(tmp_path):
    # Ranks draw disjoint shards, so a forward pass that skips DDP (model.module(x): gradients never
    # all-reduced) lets the replicas drift, and a buffer fed from each rank's own batches with
    # broadcast_buffers=False drifts too; one rank is slow to load; set_epoch is never called.
    rep = run_loop(tmp_path, "--no-set-epoch", "--slow-rank", "1", "--bypass-ddp", "--local-buffer")
    [same] = find(rep, "DDP852")
    assert same["ranks"] == [0, 1] and "sampler.epoch stayed 0" in same["message"]
    [slow] = find(rep, "DDP872")
    assert slow["ranks"] == [1] and slow["severity"] == "warning"
    [div] = find(rep, "DDP870")
    assert div["ranks"] == [0, 1] and "after the first optimizer step" in div["message"]
    assert "0.weight" in div["message"] or "0.weight" in str(div["evidence"])
    [buf] = find(rep, "DDP871")
    assert buf["ranks"] == [0, 1] and "input_sum" in buf["message"]
    assert not ids(rep) & (PROBE_IDS - {"DDP852", "DDP870", "DDP871"}), rep["findings"]


@pytest.mark.parametrize("flag,check_id,signature", [("--ddp-first", "DDP861", "DDP833"),
                                                      ("--init-twice", "DDP864", "DDP822")])
def test_init_order_mistakes_are_the_root_cause(tmp_path, flag, check_id, signature):
    rep = run_loop(tmp_path, flag, expect_rc=1)
    [f] = find(rep, check_id)
    assert f["ranks"] == [0, 1] and f["category"] == "init_order" and "loop.py:" in f["message"]
    assert signature in ids(rep)  # the exception it led to, as well
    assert rep["root_cause"]["id"] == check_id


def test_under_torchrun_rank0_reports_what_the_probes_saw(tmp_path):
    report = tmp_path / "r.json"
    res = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", "0", "-m", "ddp_doctor", "run", "--report", str(report),
               str(SCRIPTS / "loop.py"), "--no-sampler"], clean_env(), str(tmp_path), timeout=180)
    assert res.rc == 0, res.output
    rep = load_json(str(report))
    [f] = find(rep, "DDP850")
    assert f["ranks"] == [0, 1]
    assert "DDP850" in res.stderr  # a run that ended well still says what was found


def test_ranks_spawned_by_the_script_are_probed_in_their_own_interpreters(tmp_path):
    report = tmp_path / "r.json"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    res = run([*DDP, "run", "--report", str(report), str(SCRIPTS / "spawn_loop.py")],
              clean_env(PORT=str(free_port()), TMPDIR=str(tmp)), str(tmp_path), timeout=180)
    assert res.rc == 0, res.output
    assert res.stdout.count("done") == 2
    assert not list(tmp.glob("ddp-doctor-run-*"))  # the one-process run's directory is removed
    rep = load_json(str(report))
    [f] = find(rep, "DDP850")
    assert f["ranks"] == [0, 1] and "spawn_loop.py" in f["message"]
    assert not ids(rep) & (PROBE_IDS - {"DDP850"}), rep["findings"]  # they destroyed their group


def test_two_nodes_without_a_shared_directory_are_compared_through_the_store(tmp_path):
    from helpers.nodes import run_nodes

    report = tmp_path / "r.json"

    def env_for(host: str) -> dict[str, str]:
        tmp = tmp_path / f"tmp-{host}"  # each node's run directory is its own, as on real hosts
        tmp.mkdir(exist_ok=True)
        return clean_env(TMPDIR=str(tmp))

    results = run_nodes(tmp_path, ["algo-1", "algo-2"], ["run", "--report", str(report),
                                                         str(SCRIPTS / "loop.py"), "--no-sampler"],
                        env_for=env_for, timeout=180)
    assert all(r.rc == 0 for r in results), [r.output[-3000:] for r in results]
    rep = load_json(str(report))
    [f] = find(rep, "DDP850")
    assert f["ranks"] == [0, 1]
    assert list((tmp_path / "tmp-algo-1").glob("ddp-doctor-run-*/probe-remote-1.json"))
    assert not list((tmp_path / "tmp-algo-1").glob("ddp-doctor-run-*/probe-remote-0.json"))
