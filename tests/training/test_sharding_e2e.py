"""Data sharded wrong, and jobs in which no rank formed a process group, on 2 real gloo ranks under
`ddp-doctor run`, decided from what the ranks drew and left (never from the scripts' text):
- sharded twice (tests/run_scripts/sampler_sharding.py): a DistributedSampler's loader handed to
  accelerate's Accelerator.prepare(), and a hand-made indices[rank::world] split around a
  DistributedSampler, leave half of every epoch undrawn: DDP851 names the loader and the cause;
- overlapping shards through a DistributedSampler (a seed per rank, rank= by hand): DDP850 names the
  argument, not "use a DistributedSampler";
- a DistributedSampler alone, the same seed on every rank, is clean: the correct run of
  tests/probe_scripts/loop.py (test_probes_e2e.py) is that shape, and asserts it;
- every rank returning before init (too few GPUs: tests/run_scripts/too_few_gpus.py) and ranks that
  skip DDP on CPU but split the data by rank (tests/run_scripts/cpu_skips_ddp_shards_data.py): DDP876.

One module fixture launches every shape, a few at a time; each test reads its own run's report."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.procs import DDP, Launch, clean_env, ids, load_json, result_of, run_all

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
SHARDING = SCRIPTS / "sampler_sharding.py"
AT_ONCE = 3  # runs at a time on 2 cores: each is a launcher, 2 ranks and the parent

RUNS = {
    "accelerate": [str(SHARDING), "--shape", "accelerate"],
    "wrapped": [str(SHARDING), "--shape", "wrapped"],
    "subset": [str(SHARDING), "--shape", "subset"],
    "seed": [str(SHARDING), "--shape", "seed"],
    "rank": [str(SHARDING), "--shape", "rank"],
    "too_few_gpus": [str(SCRIPTS / "too_few_gpus.py")],
    "cpu_shards": [str(SCRIPTS / "cpu_skips_ddp_shards_data.py")],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("sharding")
    # what the ranks drew is the subject: the preflight's bandwidth sweep (CPU on 2 busy cores) is skipped
    launches = {name: Launch([*DDP, "run", "--nproc-per-node", "2", "--timeout", "60", "--hang-timeout", "120",
                              "--skip", "communication", "--report", str(base / f"{name}.json"), *target],
                             clean_env(), str(base))
                for name, target in RUNS.items()}
    return {"base": base, "results": run_all(launches, at_once=AT_ONCE)}


def ran(runs: dict, name: str) -> tuple:
    res = result_of(runs["results"], name)
    assert res.rc == 0, res.output
    return res, load_json(str(runs["base"] / f"{name}.json"))


def only(rep: dict, fid: str) -> dict:
    [f] = [f for f in rep["findings"] if f["id"] == fid]
    return f


def line_of(text: str) -> str:
    lines = SHARDING.read_text().splitlines()
    return f"sampler_sharding.py:{next(i for i, ln in enumerate(lines, 1) if text in ln)}"


def test_a_distributed_sampler_prepared_by_accelerate_is_sharded_twice(runs):
    _, rep = ran(runs, "accelerate")
    f = only(rep, "DDP851")
    assert f["severity"] == "warning" and f["ranks"] == [0, 1]
    # the DataLoader judged is the one accelerate made for this process, at the prepare() call
    assert line_of("acc.prepare(model, opt, loader)") in f["message"]
    assert "draws 32 of 64 samples, 32 never drawn" in f["message"]
    assert ("each rank draws 1/4 of the data with 2 ranks: sharded twice: a DistributedSampler inside, and "
            "accelerate's per-process split") in f["message"]
    assert "DDP850" not in ids(rep)


def test_a_hand_made_second_split_is_sharded_twice(runs):
    for name, cause in (("wrapped", "a DistributedSampler inside RankSplit"),
                        ("subset", "a DistributedSampler inside, and a per-rank Subset of the data set")):
        _, rep = ran(runs, name)
        f = only(rep, "DDP851")
        assert "each rank draws 1/4 of the data with 2 ranks: sharded twice" in f["message"], name
        assert cause in f["message"] and "sampler_sharding.py:" in f["message"], name
        assert "DDP850" not in ids(rep), name


def test_overlapping_shards_name_the_sampler_argument_behind_them(runs):
    _, rep = ran(runs, "seed")
    f = only(rep, "DDP850")
    assert "a DistributedSampler whose seed differs by rank (seed=0 on rank 0, seed=1 on rank 1)" in f["message"]
    assert "same seed on every rank" in f["hint"]
    _, rep = ran(runs, "rank")
    f = only(rep, "DDP850")
    assert "a DistributedSampler with rank=0 on ranks 0-1 (rank= passed by hand with a wrong value)" in f["message"]
    assert "Leave rank= and num_replicas= out" in f["hint"]


def test_ranks_that_returned_before_init_are_told_nothing_ran_distributed(runs):
    res, rep = ran(runs, "too_few_gpus")
    assert res.stdout.count("Unable to locate sufficient 2 gpus") == 2
    f = only(rep, "DDP876")
    assert f["severity"] == "warning" and f["ranks"] == [0, 1] and rep["status"] == "warn"
    assert "ranks 0-1 ended without calling init_process_group: nothing ran distributed" in f["message"]


def test_ranks_that_skip_ddp_but_shard_the_data_trained_independent_models(runs):
    _, rep = ran(runs, "cpu_shards")
    f = only(rep, "DDP876")
    assert f["ranks"] == [0, 1]
    assert "the ranks trained independent models on their shards of the data" in f["message"]
    assert "cpu_skips_ddp_shards_data.py:20" in f["message"] and "no gradients were synchronised" in f["message"]
    assert not ids(rep, "error")
