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

What each run's report says is judged from its recorded evidence (tests/corpus/sharding/,
helpers/scenarios.py's group "sharding"); the accelerate shape is launched for what only a launch
shows (what the ranks drew inside accelerate's loader, gathered and written, the exit status)."""
from __future__ import annotations

import pytest
from helpers import corpus
from helpers.procs import ids, load_json, run
from helpers.scenarios import GROUPS, SCRIPTS, launch

from ddp_doctor.training.evidence_file import verdict

SHARDING = SCRIPTS / "sampler_sharding.py"


def ran(name: str) -> tuple[int, dict]:
    """The exit code and report of one recorded run, judged again now; each of these jobs ends well."""
    code, rep, _ = corpus.replayed("sharding", name)
    assert code == 0, rep.get("root_cause")
    return code, rep


def only(rep: dict, fid: str) -> dict:
    [f] = [f for f in rep["findings"] if f["id"] == fid]
    return f


def line_of(text: str) -> str:
    lines = SHARDING.read_text().splitlines()
    return f"sampler_sharding.py:{next(i for i, ln in enumerate(lines, 1) if text in ln)}"


def test_every_run_is_recorded_and_replays_to_the_verdict_it_recorded():
    assert corpus.unreplayed("sharding", list(GROUPS["sharding"])) == []


def accelerate_twice(rep: dict) -> None:
    f = only(rep, "DDP851")
    assert f["severity"] == "warning" and f["ranks"] == [0, 1]
    # the DataLoader judged is the one accelerate made for this process, at the prepare() call
    assert line_of("acc.prepare(model, opt, loader)") in f["message"]
    assert "draws 32 of 64 samples, 32 never drawn" in f["message"]
    assert ("each rank draws 1/4 of the data with 2 ranks: sharded twice: a DistributedSampler inside, and "
            "accelerate's per-process split") in f["message"]
    assert "DDP850" not in ids(rep)


def test_a_distributed_sampler_prepared_by_accelerate_is_sharded_twice():
    accelerate_twice(ran("accelerate")[1])


@pytest.mark.slow
def test_a_launched_run_gathers_what_the_ranks_drew_inside_accelerates_loader(tmp_path):
    job = launch("sharding", "accelerate", tmp_path)
    res = run(job.cmd, job.env, job.cwd, job.timeout)
    assert res.rc == 0, res.output[-3000:]
    rep = load_json(str(tmp_path / "accelerate.json"))
    accelerate_twice(rep)
    code, again, was = corpus.judged_again(tmp_path / "accelerate.evidence.json")
    assert was == verdict(rep, res.rc) == verdict(again, code)


def test_a_hand_made_second_split_is_sharded_twice():
    for name, cause in (("wrapped", "a DistributedSampler inside RankSplit"),
                        ("subset", "a DistributedSampler inside, and a per-rank Subset of the data set")):
        _, rep = ran(name)
        f = only(rep, "DDP851")
        assert "each rank draws 1/4 of the data with 2 ranks: sharded twice" in f["message"], name
        assert cause in f["message"] and "sampler_sharding.py:" in f["message"], name
        assert "DDP850" not in ids(rep), name


def test_overlapping_shards_name_the_sampler_argument_behind_them():
    _, rep = ran("seed")
    f = only(rep, "DDP850")
    assert "a DistributedSampler whose seed differs by rank (seed=0 on rank 0, seed=1 on rank 1)" in f["message"]
    assert "same seed on every rank" in f["hint"]
    _, rep = ran("rank")
    f = only(rep, "DDP850")
    assert "a DistributedSampler with rank=0 on ranks 0-1 (rank= passed by hand with a wrong value)" in f["message"]
    assert "Leave rank= and num_replicas= out" in f["hint"]


def test_ranks_that_returned_before_init_are_told_nothing_ran_distributed():
    _, rep = ran("too_few_gpus")
    f = only(rep, "DDP876")
    assert f["severity"] == "warning" and f["ranks"] == [0, 1] and rep["status"] == "warn"
    assert "ranks 0-1 ended without calling init_process_group: nothing ran distributed" in f["message"]


def test_ranks_that_skip_ddp_but_shard_the_data_trained_independent_models():
    _, rep = ran("cpu_shards")
    f = only(rep, "DDP876")
    assert f["ranks"] == [0, 1]
    assert "the ranks trained independent models on their shards of the data" in f["message"]
    assert "cpu_skips_ddp_shards_data.py:20" in f["message"] and "no gradients were synchronised" in f["message"]
    assert not ids(rep, "error")
