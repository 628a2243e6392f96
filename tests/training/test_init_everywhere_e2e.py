"""init_process_group's arguments judged wherever `ddp-doctor run` runs, on real processes: in the
one-process mode (`ddp-doctor run script.py`, no launcher) whose script starts its own ranks with
torch.multiprocessing.spawn (a world size of 0 read from an attribute, a world larger than the
spawn started, a rank outside the world: named with the argument, its value, its source text and
the line; the processes that would wait in init until torch's 30-minute timeout are ended, exit
124); and launched ranks that never formed a process group (a warning, exit 0).

The runs are started together by one module fixture (they mostly wait: interpreters importing
torch, the preflight, the grace before the init judgement), then each test reads its own.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.procs import DDP, Launch, clean_env, free_port, load_json, result_of, run_all

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
AT_ONCE = 3  # runs at a time on 2 cores

# name -> (script, launcher options); no options: one process, the script spawns its own ranks
RUNS = {
    "world_zero": ("spawn_world_size_zero.py", []),
    "world_too_large": ("spawn_world_too_large.py", []),
    "rank_outside": ("spawn_rank_out_of_range.py", []),
    "never_inits": ("never_inits.py", ["--nproc-per-node", "2"]),
    "forms_group": ("ok_allreduce.py", ["--nproc-per-node", "2"]),
}


def line_of(script: str, text: str) -> str:
    lines = (SCRIPTS / script).read_text().splitlines()
    return f"{SCRIPTS / script}:{next(i for i, ln in enumerate(lines, 1) if text in ln)}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("init_everywhere")
    launches = {
        name: Launch([*DDP, "run", *opts, "--timeout", "30", "--hang-timeout", "120",
                      "--report", str(base / f"{name}.json"), str(SCRIPTS / script)],
                     clean_env(TEST_PORT=str(free_port())), str(base), timeout=240)
        for name, (script, opts) in RUNS.items()}
    return {"base": base, "results": run_all(launches, at_once=AT_ONCE)}


def ran(runs: dict, name: str) -> tuple:
    """One launch's result and report; a launch that overran fails only the test that reads it."""
    return result_of(runs["results"], name), load_json(str(runs["base"] / f"{name}.json"))


def by_id(rep: dict, id_: str) -> list[dict]:
    return [f for f in rep["findings"] if f["id"] == id_]


def test_a_world_size_of_zero_in_spawned_children_names_the_argument_and_its_line(runs):
    res, rep = ran(runs, "world_zero")
    assert res.rc == 1, res.output  # the script's own status: the children failed in init at once
    cause = rep["root_cause"]
    assert cause["id"] == "DDP874" and cause["ranks"] == [0, 1], rep["findings"]
    assert cause["message"].startswith("spawned processes 0-1 called init_process_group with world_size=0 "
                                       "(world_size=training_args.n_gpu passed at ")
    assert line_of("spawn_world_size_zero.py", "dist.init_process_group(") in cause["message"]
    assert "TCPStore world size cannot be 0" not in cause["message"]
    # torch's own words stay in the report, as what followed
    relayed = by_id(rep, "DDP805")
    assert relayed and "TCPStore world size cannot be 0" in relayed[0]["message"]
    assert "Root cause: DDP874" in res.stderr


def test_a_world_larger_than_the_spawn_started_is_ended_not_left_waiting(runs):
    res, rep = ran(runs, "world_too_large")
    assert res.rc == 124, res.output
    cause = rep["root_cause"]
    assert cause["id"] == "DDP868" and cause["ranks"] == [0, 1], rep["findings"]
    assert "spawned processes 0-1 joined a world of 4 (world_size=WORLD_SIZE passed at " in cause["message"]
    assert line_of("spawn_world_too_large.py", "dist.init_process_group(") in cause["message"]
    assert f"torch.multiprocessing.spawn started 2 at {line_of('spawn_world_too_large.py', 'mp.spawn(')}" \
        in cause["message"]
    assert cause["evidence"]["started"] == 2 and cause["evidence"]["world_size"] == 4
    assert "ending them instead of waiting for torch's timeout" in res.stderr


def test_a_rank_outside_the_world_in_spawned_children_is_ended_and_named(runs):
    res, rep = ran(runs, "rank_outside")
    assert res.rc == 124, res.output
    cause = rep["root_cause"]
    assert cause["id"] == "DDP875" and cause["ranks"] == [1], rep["findings"]
    assert cause["message"].startswith("spawned process 1 called init_process_group with rank=2 "
                                       "(rank=i + 1 passed at ")
    assert "outside 0-1 for world_size=2 (world_size=2 passed)" in cause["message"]


def test_ranks_that_never_formed_a_process_group_are_a_warning(runs):
    res, rep = ran(runs, "never_inits")
    assert res.rc == 0, res.output
    [f] = by_id(rep, "DDP876")
    assert f["severity"] == "warning" and f["ranks"] == [0, 1]
    assert f["message"] == ("ranks 0-1 ended without calling init_process_group: each trained alone "
                            "(no gradients were synchronised)")
    assert "LOCAL_RANK" in f["hint"] and "--use_cpu" in f["hint"]
    assert rep["status"] == "warn" and not [x for x in rep["findings"] if x["severity"] == "error"]


def test_ranks_that_formed_a_process_group_are_not_warned(runs):
    res, rep = ran(runs, "forms_group")
    assert res.rc == 0, res.output
    assert not by_id(rep, "DDP876") and not [x for x in rep["findings"] if x["severity"] == "error"]
