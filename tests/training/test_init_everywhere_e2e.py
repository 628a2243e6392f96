"""init_process_group's arguments judged wherever `ddp-doctor run` runs, on real processes: in the
one-process mode (`ddp-doctor run script.py`, no launcher) whose script starts its own ranks with
torch.multiprocessing.spawn (a world size of 0 read from an attribute, a world larger than the
spawn started, a rank outside the world, children that each set their own MASTER_PORT: named
with the argument, its value, its source text and the line; the processes that would wait in
init until torch's 30-minute timeout are ended, exit 124); launched ranks of which one overrode
MASTER_PORT; and launched ranks that never formed a process group (a warning, exit 0).

What each run's report says is judged from its recorded evidence (tests/corpus/init_everywhere/,
helpers/scenarios.py's group "init_everywhere"); a world larger than the spawn started is launched
for what only a launch shows (the waiting processes ended, none left behind, the exit status, the
console, the evidence written).
"""
from __future__ import annotations

import pytest
from helpers import corpus
from helpers.procs import load_json, run
from helpers.scenarios import GROUPS, SCRIPTS, launch

from ddp_doctor.report.render import render_text
from ddp_doctor.training.evidence_file import verdict


def line_of(script: str, text: str, recorded: bool = True) -> str:
    """"PATH:N" of the first line of a run script holding `text`; PATH as the corpus names it, or
    (`recorded` false) as a run here says it."""
    lines = (SCRIPTS / script).read_text().splitlines()
    site = f"{SCRIPTS / script}:{next(i for i, ln in enumerate(lines, 1) if text in ln)}"
    return corpus.as_recorded(site) if recorded else site


def ran(name: str) -> tuple[int, dict]:
    code, rep, _ = corpus.replayed("init_everywhere", name)
    return code, rep


def by_id(rep: dict, id_: str) -> list[dict]:
    return [f for f in rep["findings"] if f["id"] == id_]


def _too_large(rep: dict, recorded: bool) -> None:
    """The verdict of a world of 4 where the spawn started 2, recorded or of a run here."""
    cause = rep["root_cause"]
    assert cause["id"] == "DDP868" and cause["ranks"] == [0, 1], rep["findings"]
    assert "spawned processes 0-1 joined a world of 4 (world_size=WORLD_SIZE passed at " in cause["message"]
    assert line_of("spawn_world_too_large.py", "dist.init_process_group(", recorded) in cause["message"]
    spawned = line_of("spawn_world_too_large.py", "mp.spawn(", recorded)
    assert f"torch.multiprocessing.spawn started 2 at {spawned}" in cause["message"]
    assert cause["evidence"]["started"] == 2 and cause["evidence"]["world_size"] == 4


def test_every_run_is_recorded_and_replays_to_the_verdict_it_recorded():
    assert corpus.unreplayed("init_everywhere", list(GROUPS["init_everywhere"])) == []


def test_a_world_size_of_zero_in_spawned_children_names_the_argument_and_its_line():
    code, rep = ran("world_zero")
    assert code == 1, rep["findings"]  # the script's own status: the children failed in init at once
    cause = rep["root_cause"]
    assert cause["id"] == "DDP874" and cause["ranks"] == [0, 1], rep["findings"]
    assert cause["message"].startswith("spawned processes 0-1 called init_process_group with world_size=0 "
                                       "(world_size=training_args.n_gpu passed at ")
    assert line_of("spawn_world_size_zero.py", "dist.init_process_group(") in cause["message"]
    assert "TCPStore world size cannot be 0" not in cause["message"]
    # torch's own words stay in the report, as what followed
    relayed = by_id(rep, "DDP805")
    assert relayed and "TCPStore world size cannot be 0" in relayed[0]["message"]
    assert "Root cause: DDP874" in render_text(rep)


def test_a_world_larger_than_the_spawn_started_is_ended_not_left_waiting():
    code, rep = ran("world_too_large")
    assert code == 124, rep["findings"]
    _too_large(rep, recorded=True)


def test_a_rank_outside_the_world_in_spawned_children_is_ended_and_named():
    code, rep = ran("rank_outside")
    assert code == 124, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP875" and cause["ranks"] == [1], rep["findings"]
    assert cause["message"].startswith("spawned process 1 called init_process_group with rank=2 "
                                       "(rank=i + 1 passed at ")
    assert "outside 0-1 for world_size=2 (world_size=2 passed)" in cause["message"]


def test_ranks_that_never_formed_a_process_group_are_a_warning():
    code, rep = ran("never_inits")
    assert code == 0, rep["findings"]
    [f] = by_id(rep, "DDP876")
    assert f["severity"] == "warning" and f["ranks"] == [0, 1]
    assert f["message"] == ("ranks 0-1 ended without calling init_process_group: each trained alone "
                            "(no gradients were synchronised)")
    assert "LOCAL_RANK" in f["hint"] and "--use_cpu" in f["hint"]
    assert rep["status"] == "warn" and not [x for x in rep["findings"] if x["severity"] == "error"]


def test_ranks_that_formed_a_process_group_are_not_warned():
    code, rep = ran("forms_group")
    assert code == 0, rep["findings"]
    assert not by_id(rep, "DDP876") and not [x for x in rep["findings"] if x["severity"] == "error"]


def test_spawned_children_that_each_pick_a_port_are_ended_and_the_line_that_set_it_named():
    code, rep = ran("port_per_child")
    assert code == 124, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP881" and cause["ranks"] == [0, 1], rep["findings"]
    assert cause["message"].startswith("each went to its own rendezvous, and no group of 2 can form at any of them: "
                                       "spawned process 0 at env://127.0.0.1:")
    set_at = line_of("spawn_port_per_child.py", 'os.environ["MASTER_PORT"]')
    assert f"the script set MASTER_PORT at {set_at} (" in cause["message"]
    ports = sorted(c["env"]["MASTER_PORT"] for c in cause["evidence"]["calls"])
    assert len(set(ports)) == 2 and f"({ports[0]}, {ports[1]})" in cause["message"]
    assert "Root cause: DDP881" in render_text(rep)


def test_a_rank_that_overrides_the_launchers_master_port_is_the_one_named():
    code, rep = ran("rank1_port")
    assert code == 124, rep["findings"]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP881" and cause["ranks"] == [1], rep["findings"]
    assert cause["message"].startswith("rank 1 went to another rendezvous than the others")
    assert "(the launcher's); rank 1 at env://" in cause["message"]
    set_at = line_of("rank1_sets_master_port.py", 'os.environ["MASTER_PORT"]')
    assert f"the script set MASTER_PORT at {set_at} (" in cause["message"]
    assert cause["evidence"]["cohort"] == [0, 1]
    assert not [f for f in rep["findings"] if f["severity"] == "error" and f["id"] != "DDP881"]


@pytest.mark.slow
def test_a_launched_world_larger_than_the_spawn_started_is_ended(tmp_path):
    job = launch("init_everywhere", "world_too_large", tmp_path)
    res = run(job.cmd, job.env, job.cwd, job.timeout)  # fails the test if a process is left behind
    rep = load_json(str(tmp_path / "world_too_large.json"))
    assert res.rc == 124, res.output
    _too_large(rep, recorded=False)
    assert "ending them instead of waiting for torch's timeout" in res.stderr
    code, again, was = corpus.judged_again(tmp_path / "world_too_large.evidence.json")
    assert was == verdict(rep, res.rc) == verdict(again, code)
