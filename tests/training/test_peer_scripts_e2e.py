"""Peer code under `ddp-doctor run` on 2 CPU ranks: accelerate's own distributed test scripts
(test_script, test_sync, test_ops, as installed) must leave no sampler error or warning, although
they train plain reference models on the full data on every rank on purpose next to the prepared
(DDP) model; a job whose ranks never went distributed (a Hugging Face Trainer without use_cpu on a
host without GPUs, a script without any process group) is DDP855, not a DistributedSampler hint;
a plain model whose gradients are all-reduced by hand over an unsharded loader is still DDP850.

accelerate is launched the way `accelerate launch --cpu` and accelerate's own debug_launcher launch
it on CPU (ACCELERATE_USE_CPU=1). Without it accelerate 1.x on a host without GPUs forms a process
group but takes the world to be one process (DistributedType.NO, process_index 0 on every rank, no
DDP wrapper, wait_for_everyone a no-op): every rank trains alone on all the data, which is DDP855,
and test_script's own main_process_first check races on its file (it fails about one run in five,
under plain torchrun too).

The runs start together from one module fixture, then each test reads its own run's report. The
gradients all-reduced by hand (tests/run_scripts/grads_by_hand.py, with and without a process group)
are judged from their recorded evidence (tests/corpus/peer_scripts/, helpers/scenarios.py's group
"peer_scripts").
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from helpers import corpus
from helpers.procs import DDP, TIMING_WARNINGS, Launch, clean_env, ids, load_json, result_of, run_all
from helpers.scenarios import GROUPS

SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
PEERS = ("test_script", "test_sync", "test_ops")
HAVE = {name: importlib.util.find_spec(name) is not None for name in ("accelerate", "transformers")}


def env(**extra: str) -> dict[str, str]:
    return clean_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **extra)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("peers")
    target: dict[str, tuple[list[str], dict[str, str]]] = {}
    if HAVE["accelerate"]:
        target |= {name: (["-m", f"accelerate.test_utils.scripts.{name}"], env(ACCELERATE_USE_CPU="1"))
                   for name in PEERS}
    if HAVE["transformers"] and HAVE["accelerate"]:
        target["trainer"] = ([str(SCRIPTS / "trainer_never_distributed.py")], env())
    launches = {}
    for name, (what, e) in target.items():
        (base / name).mkdir()  # each its own working directory: test_script writes files in it
        launches[name] = Launch([*DDP, "run", "--nproc-per-node", "2", "--skip", "communication",
                                 "--report", str(base / name / "r.json"), *what], e, str(base / name), 240)
    return base, run_all(launches, at_once=2) if launches else {}


def report_of(runs, name: str) -> tuple:
    base, results = runs
    res = result_of(results, name)
    assert res.rc == 0, res.output[-6000:]
    return res, load_json(str(base / name / "r.json"))


@pytest.mark.slow
@pytest.mark.parametrize("name", PEERS)
def test_accelerate_test_scripts_leave_no_sampler_error_or_warning(runs, name):
    if not HAVE["accelerate"]:
        pytest.skip("accelerate is not installed")
    _, rep = report_of(runs, name)
    loud = [f for f in rep["findings"] if f["category"] == "sampler" and f["severity"] in ("error", "warning")]
    assert not loud, loud
    assert not ids(rep, "error"), rep["findings"]
    assert ids(rep, "warning") <= TIMING_WARNINGS, rep["findings"]
    assert rep["status"] in ("pass", "warn")  # warn only from the load-dependent timing warnings


@pytest.mark.slow
def test_trainer_that_never_saw_the_launcher_says_so_not_distributed_sampler(runs):
    if not (HAVE["transformers"] and HAVE["accelerate"]):
        pytest.skip("transformers and accelerate are needed")
    res, rep = report_of(runs, "trainer")
    assert sorted(ln.split(" done")[0] for ln in res.stdout.splitlines() if " done" in ln) == ["rank 0", "rank 1"]
    assert "world 1 model TinyLM" in res.stdout  # what the Trainer itself made of the launch
    [f] = [f for f in rep["findings"] if f["id"] == "DDP855"]
    assert f["severity"] == "error" and f["category"] == "sampler" and f["ranks"] == [0, 1]
    assert "each trained on all the data: no model was wrapped in DistributedDataParallel" in f["message"]
    assert "trainer_never_distributed.py:" in f["message"]  # where the loader (and the group) came from
    assert "did not see the launcher" in f["message"]
    assert "use_cpu=True" in f["hint"] and "LOCAL_RANK" in f["hint"] and "accelerate launch" in f["hint"]
    assert not ids(rep) & {"DDP850", "DDP853"}, rep["findings"]
    assert rep["status"] == "fail"


def ended_well(name: str) -> dict:
    """The report of one recorded run, judged again now; both ranks' scripts ended well."""
    code, rep, _ = corpus.replayed("peer_scripts", name)
    assert code == 0, rep.get("root_cause")
    outcomes = corpus.evidence_of("peer_scripts", name)["outcomes"]
    assert {r: o["exit_code"] for r, o in outcomes.items()} == {"0": 0, "1": 0}
    return rep


def test_every_run_is_recorded_and_replays_to_the_verdict_it_recorded():
    assert corpus.unreplayed("peer_scripts", list(GROUPS["peer_scripts"])) == []


def test_script_without_a_process_group_says_it_formed_none():
    rep = ended_well("no_group")
    [f] = [f for f in rep["findings"] if f["id"] == "DDP855"]
    assert f["ranks"] == [0, 1] and "the script formed no process group" in f["message"]
    assert "grads_by_hand.py:" in f["message"] and "RandomSampler over TensorDataset of 128" in f["message"]
    assert not ids(rep) & {"DDP850", "DDP853"}, rep["findings"]


def test_gradients_all_reduced_by_hand_over_the_same_data_is_still_ddp850():
    # No DDP model, but collectives between the draws synchronise the gradients: a sharding bug.
    rep = ended_well("by_hand")
    [f] = [f for f in rep["findings"] if f["id"] == "DDP850"]
    assert f["severity"] == "error" and f["ranks"] == [0, 1] and "grads_by_hand.py:" in f["message"]
    assert "DDP855" not in ids(rep)
    assert rep["status"] == "fail" and rep["root_cause"]["id"] == "DDP850"
