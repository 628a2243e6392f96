"""In-training probes on real ranks: each rule with a bad script and the correct one, 2 gloo ranks.

tests/probe_scripts/loop.py is one DDP loop with switches, each introducing one mistake; without
switches it is the correct recipe and nothing may be reported about it.

What the probes' reports say of each planted mistake is judged from its recorded evidence
(tests/corpus/probes/, helpers/scenarios.py's group "probes"). What only a launch shows is launched,
together, by one module fixture: a mistake's report with --fail-on error (its exit status and the
script's own output), the same under torchrun with the environment's DDP_DOCTOR_FAIL_ON, ranks
that a script spawns itself, and two simulated nodes without a shared directory.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import corpus
from helpers.procs import (
    DDP,
    NO_SWEEP,
    Launch,
    assert_healthy,
    clean_env,
    free_port,
    ids,
    load_json,
    outputs,
    result_of,
    run,
    run_all,
)
from helpers.scenarios import GROUPS

from ddp_doctor.exit_codes import FAIL_LEFT_AT_0

SCRIPTS = Path(__file__).resolve().parents[1] / "probe_scripts"
ROOT = Path(__file__).resolve().parents[2]
# Not DDP872 (a data-loading straggler): a busy 2-core machine can cause it (helpers.procs.TIMING_WARNINGS);
# the test that plants a straggler asserts it by name.
PROBE_IDS = {"DDP850", "DDP852", "DDP853", "DDP860", "DDP861", "DDP862", "DDP863", "DDP864", "DDP865",
             "DDP870", "DDP871", "DDP880"}
AT_ONCE = 3  # runs at a time on 2 cores


# --fail-on error, asked for by two of the jobs that end well with DDP850 in their report: on the
# command line (no_sampler_no_destroy), and in the environment under torchrun (whose `-m ddp_doctor
# run` command line a SageMaker entrypoint cannot change). The jobs that end well with an error in
# their report without it (spawn, two_nodes) show the exit 0 it changes.
def launches(base: Path) -> dict[str, Launch]:
    """One command each, for run_all, each in its own directory base/<name> (its cwd). The probes are
    the subject: every launch of this module skips the sweep (NO_SWEEP)."""
    (base / "no_sampler_no_destroy").mkdir()
    out = {"no_sampler_no_destroy": Launch(
        [*DDP, "run", "--nproc-per-node", "2", *NO_SWEEP, "--fail-on", "error",
         "--report", str(base / "no_sampler_no_destroy" / "r.json"), str(SCRIPTS / "loop.py"), "--no-sampler",
         "--no-destroy"], clean_env(), str(base / "no_sampler_no_destroy"), timeout=180)}
    (base / "torchrun").mkdir()
    out["torchrun"] = Launch(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "0",
         "-m", "ddp_doctor", "run", *NO_SWEEP, "--report", str(base / "torchrun" / "r.json"),
         str(SCRIPTS / "loop.py"), "--no-sampler"], clean_env(DDP_DOCTOR_FAIL_ON="error"), str(base / "torchrun"),
        timeout=180)
    return out


def spawned(d: Path):
    """The script spawns its ranks on a port picked as the run starts."""
    tmp = d / "tmp"
    tmp.mkdir(parents=True)
    return run([*DDP, "run", *NO_SWEEP, "--report", str(d / "r.json"), str(SCRIPTS / "spawn_loop.py")],
               clean_env(PORT=str(free_port()), TMPDIR=str(tmp)), str(d), timeout=180)


def two_nodes(d: Path) -> list:
    """One torchrun per simulated node, each with a run directory of its own, as on real hosts."""
    from helpers.nodes import run_nodes

    d.mkdir()

    def env_for(host: str) -> dict[str, str]:
        tmp = d / f"tmp-{host}"
        tmp.mkdir(exist_ok=True)
        return clean_env(TMPDIR=str(tmp))

    return run_nodes(d, ["algo-1", "algo-2"], ["run", *NO_SWEEP, "--report", str(d / "r.json"),
                                               str(SCRIPTS / "loop.py"), "--no-sampler"], env_for=env_for, timeout=180)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run of this module, AT_ONCE at a time (a skip, such as two_nodes' without namespaces,
    is raised in the test that reads it)."""
    base = tmp_path_factory.mktemp("probes")
    jobs: dict = {"spawn": lambda: spawned(base / "spawn"), "two_nodes": lambda: two_nodes(base / "two_nodes"),
                  **launches(base)}
    results = run_all(jobs, at_once=AT_ONCE)
    return {"base": base, "results": results}


def replayed(name: str, expect_rc: int = 0) -> dict:
    """The report of one recorded run of loop.py, judged again now, and its exit status."""
    code, rep, _ = corpus.replayed("probes", name)
    assert code == expect_rc, rep.get("root_cause")
    assert rep["phase"] == "training"
    return rep


def loop_report(runs: dict, name: str, expect_rc: int = 0) -> dict:
    """The report of one launched run of loop.py; its own exit status and output pass through."""
    res = result_of(runs["results"], name)
    assert res.rc == expect_rc, res.output
    rep = load_json(str(runs["base"] / name / "r.json"))
    assert rep["phase"] == "training"
    if expect_rc in (0, 3):  # the script ended well (3: --fail-on's): its own output passes through
        assert sorted(ln.split(" done")[0] for ln in res.stdout.splitlines() if " done" in ln) == ["rank 0", "rank 1"]
    return rep


def find(rep: dict, check_id: str) -> list[dict]:
    return [f for f in rep["findings"] if f["id"] == check_id]


def test_every_run_is_recorded_and_replays_to_the_verdict_it_recorded():
    assert corpus.unreplayed("probes", list(GROUPS["probes"])) == []


def test_a_thread_whose_collective_failed_fails_the_verdict_though_the_script_exited_0():
    rep = replayed("thread_fails")  # the script's own exit status: 0
    cause = rep["root_cause"]
    assert cause["id"] == "DDP815" and cause["ranks"] == [0] and cause["severity"] == "error", rep["findings"]
    assert cause["message"].startswith("rank 0: thread 'metrics' died with RuntimeError: ")
    assert "loop.py:" in cause["message"] and "in report_metrics, inside torch.distributed.all_reduce" in \
        cause["message"]
    [thread] = cause["evidence"]["threads"]
    assert thread["call"] == "all_reduce" and "Traceback" in thread["traceback"]
    assert rep["status"] == "fail"


def test_correct_loop_has_no_probe_findings():
    # also the sharding rules' clean case (a DistributedSampler alone, one seed on every rank, set_epoch):
    # nothing undrawn (DDP851), a process group formed (DDP876)
    rep = replayed("correct")
    assert_healthy(rep)
    assert not ids(rep) & (PROBE_IDS | {"DDP851", "DDP876"}), rep["findings"]


def test_each_rank_reading_its_own_data_is_not_overlap():
    # Same indices on both ranks but different samples behind them: the data set is sharded by rank.
    rep = replayed("own_shard")
    assert not ids(rep) & PROBE_IDS, rep["findings"]


@pytest.mark.slow
def test_no_distributed_sampler_and_no_destroy(runs):
    # Two mistakes in one run, each judged on its own: every rank draws the same samples, and the
    # group is left up at exit. (Run with --fail-on error: its exit status is tested below.)
    rep = loop_report(runs, "no_sampler_no_destroy", expect_rc=3)
    [f] = find(rep, "DDP850")
    assert f["severity"] == "error" and f["ranks"] == [0, 1] and f["phase"] == "training"
    assert "loop.py" in f["message"] and "RandomSampler" in f["message"]
    assert "DDP853" not in ids(rep)  # the proven overlap replaces the static warning
    [left] = find(rep, "DDP880")
    assert left["ranks"] == [0, 1] and left["phase"] == "teardown"
    assert rep["status"] == "fail" and rep["root_cause"]["id"] == "DDP850"
    assert not ids(rep) & (PROBE_IDS - {"DDP850", "DDP880"}), rep["findings"]


def test_unsharded_loader_without_early_overlap_is_a_warning():
    # Each rank shuffles 20000 samples with its own seed: the first batches happen not to overlap,
    # but no rank is given a shard of its own.
    rep = replayed("unsharded")
    [f] = find(rep, "DDP853")
    assert f["severity"] == "warning" and f["ranks"] == [0, 1] and "RandomSampler" in f["message"]
    assert not ids(rep) & (PROBE_IDS - {"DDP853"}), rep["findings"]


def test_missing_set_epoch_data_straggler_forward_through_module_local_buffer():
    # Ranks draw disjoint shards, so a forward pass that skips DDP (model.module(x): gradients never
    # all-reduced) lets the replicas drift, and a buffer fed from each rank's own batches with
    # broadcast_buffers=False drifts too; one rank is slow to load; set_epoch is never called.
    rep = replayed("set_epoch_straggler_bypass_buffer")
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


@pytest.mark.parametrize("name,check_id,signature", [("ddp_first", "DDP861", "DDP833"),
                                                      ("init_twice", "DDP864", "DDP822")])
def test_init_order_mistakes_are_the_root_cause(name, check_id, signature):
    rep = replayed(name, expect_rc=1)
    [f] = find(rep, check_id)
    assert f["ranks"] == [0, 1] and f["category"] == "init_order" and "loop.py:" in f["message"]
    assert signature in ids(rep)  # the exception it led to, as well
    assert rep["root_cause"]["id"] == check_id


def fail_on_line(stderr: str) -> str:
    """The one line that says why --fail-on changed the exit status."""
    lines = [ln for ln in stderr.splitlines() if "exit 3 instead of 0" in ln]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.slow
def test_fail_on_error_exits_3_where_a_job_without_it_exits_0(runs):
    """`ddp-doctor run --fail-on error` of a job whose ranks train on the same data (DDP850) and that
    ends well: exit 3, said on one line naming the errors; the script's output passes through
    (loop_report). A job without --fail-on that ends well with an error in its report (DDP850, the
    ranks spawned by the script) keeps the training's own exit status (0), and its last line says so
    and how to make CI fail on it."""
    rep = loop_report(runs, "no_sampler_no_destroy", expect_rc=3)
    res = result_of(runs["results"], "no_sampler_no_destroy")
    errors = sorted(ids(rep, "error"))
    assert "DDP850" in errors and rep["status"] == "fail" and rep["root_cause"]["id"] == "DDP850"
    assert fail_on_line(res.stderr) == ("ddp-doctor: exit 3 instead of 0, as --fail-on error asks: the report holds "
                                        + ", ".join(f"{i} (error)" for i in errors))
    without = result_of(runs["results"], "spawn")
    assert without.rc == 0, without.output
    assert "DDP850" in ids(load_json(str(runs["base"] / "spawn" / "r.json")), "error")
    assert "exit 3 instead of 0" not in without.stderr
    assert without.stderr.rstrip().splitlines()[-1] == FAIL_LEFT_AT_0, without.stderr[-2000:]


@pytest.mark.slow
def test_under_torchrun_rank0_reports_what_the_probes_saw_and_fail_on_comes_from_the_environment(runs):
    """torchrun -m ddp_doctor run with DDP_DOCTOR_FAIL_ON=error: rank 0 reports what the probes saw
    (DDP850 on both ranks); the rank that wrote the job's report exits 3, so torchrun fails the job
    and its summary shows the diagnosis (torchelastic's error file); the other rank, stopped by
    torchrun after that exit, lets the verdict stand. (Without it, such a job under torchrun exits
    0 and still says what was found: the two_nodes run.)"""
    res = result_of(runs["results"], "torchrun")
    assert res.rc != 0, res.output
    assert res.stdout.count(" done") == 2, res.output  # both scripts ended well
    assert "exitcode  : 3" in res.stderr and "DDP850" in res.stderr, res.stderr
    # each rank that wrote the verdict (the last to end, and rank 0 when it saw every ending) says it
    lines = {ln for ln in res.stderr.splitlines() if "exit 3 instead of 0" in ln}
    assert len(lines) == 1, res.stderr  # the same line
    [line] = lines
    assert "as DDP_DOCTOR_FAIL_ON=error asks" in line and "DDP850 (error)" in line
    assert "stopped by SIGTERM" not in res.stderr, res.stderr
    rep = load_json(str(runs["base"] / "torchrun" / "r.json"))
    [f] = find(rep, "DDP850")
    assert f["ranks"] == [0, 1]
    assert rep["status"] == "fail" and rep["root_cause"]["id"] == "DDP850", rep["findings"]


@pytest.mark.slow
def test_ranks_spawned_by_the_script_are_probed_in_their_own_interpreters(runs):
    res = result_of(runs["results"], "spawn")
    d = runs["base"] / "spawn"
    assert res.rc == 0, res.output
    assert res.stdout.count("done") == 2
    assert not list((d / "tmp").glob("ddp-doctor-run-*"))  # the one-process run's directory is removed
    rep = load_json(str(d / "r.json"))
    [f] = find(rep, "DDP850")
    assert f["ranks"] == [0, 1] and "spawn_loop.py" in f["message"]
    assert not ids(rep) & (PROBE_IDS - {"DDP850"}), rep["findings"]  # they destroyed their group


@pytest.mark.slow
def test_two_nodes_without_a_shared_directory_are_compared_through_the_store(runs):
    results = result_of(runs["results"], "two_nodes")
    d = runs["base"] / "two_nodes"
    assert all(r.rc == 0 for r in results), outputs(results)
    rep = load_json(str(d / "r.json"))
    [f] = find(rep, "DDP850")
    assert f["ranks"] == [0, 1]
    # under torchrun, without --fail-on: a run that ended well (exit 0) still says what was found
    assert any("DDP850" in r.stderr for r in results), [r.stderr[-3000:] for r in results]
    assert not any("exit 3 instead of 0" in r.stderr for r in results)
    # each node that wrote the verdict (no shared directory: the last rank to end on its node, and rank 0
    # when it saw every ending; which of them depends on the timing) says it once
    said = [r.stderr.count(FAIL_LEFT_AT_0) for r in results]
    assert max(said) == 1 and all(c in (0, 1) for c in said), [r.stderr for r in results]
    assert list((d / "tmp-algo-1").glob("ddp-doctor-run-*/probe-remote-1.json"))
    assert not list((d / "tmp-algo-1").glob("ddp-doctor-run-*/probe-remote-0.json"))
