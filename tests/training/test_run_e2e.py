"""`ddp-doctor run` on real processes: handover, passthrough, failures, hangs, spawn scripts."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers.procs import DDP, TIMING_WARNINGS, assert_clean_output, clean_env, free_port, load_json, run, run_ranks

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
SCRIPTS_OK = str(SCRIPTS / "ok_allreduce.py")


def script(name: str) -> str:
    return str(SCRIPTS / name)


def test_self_launched_run_passes_output_argv_and_exit_code_through(tmp_path):
    report = tmp_path / "r.json"
    res = run([*DDP, "run", "--nproc-per-node", "2", "--report", str(report), script("ok_allreduce.py"),
               "a", "--flag"], clean_env(EXIT="7"), str(tmp_path))
    assert res.rc == 7, res.output
    lines = sorted(line for line in res.stdout.splitlines() if line.startswith("rank"))
    assert lines == ["rank 0 sum 3.0 argv ['a', '--flag']", "rank 1 sum 3.0 argv ['a', '--flag']"]
    assert "ddp-doctor" not in res.stdout  # stdout is the script's own
    rep = load_json(str(report))
    assert rep["phase"] == "training" and rep["status"] in ("pass", "warn")


def test_a_rank_that_raises_is_the_root_cause_and_its_peer_is_labelled(tmp_path):
    """Also the Chrome trace of this failing run (--trace): one launch, both sets of assertions."""
    report, path = tmp_path / "r.json", tmp_path / "trace.json"
    res = run([*DDP, "run", "--nproc-per-node", "2", "--report", str(report), "--timeout", "20",
               "--trace", str(path), script("rank1_raises.py")], clean_env(), str(tmp_path))
    assert res.rc == 1, res.output
    assert "ValueError: bad batch on rank 1" in res.stderr  # the user's traceback, as Python prints it
    rep = load_json(str(report))
    assert rep["status"] == "fail"
    assert rep["root_cause"]["id"] == "DDP800" and rep["root_cause"]["ranks"] == [1]
    peer = [f for f in rep["findings"] if f["id"] == "DDP802"]
    assert peer and peer[0]["ranks"] == [0] and peer[0]["evidence"]["consequence"]
    assert "Root cause: DDP800" in res.stderr
    assert rep["measurements"]["stage_seconds"]["group_checks"] > 0
    assert_failing_run_trace(path, res.stderr)


def assert_failing_run_trace(path: Path, stderr: str) -> None:
    """The trace shows each rank's lane, its preflight stages, the failure and the collective
    rank 0 was in when rank 1 left."""
    import json

    from ddp_doctor.report import trace as tracelib

    def events(trace: dict, pid: int, cat: str | None = None) -> list[dict]:
        return [e for e in trace["traceEvents"] if e["pid"] == pid and e["ph"] != "M"
                and (cat is None or e.get("cat") == cat)]

    assert str(path) in stderr and "ui.perfetto.dev" in stderr
    trace = json.loads(path.read_text())
    assert tracelib.validate(trace) == []
    lanes = tracelib.lanes_named(trace)
    assert sorted(lanes) == [0, 1] and lanes[1].startswith("rank 1 (")
    for rank in (0, 1):
        stages = {"local_checks", "rendezvous", "init_process_group", "group_checks", "teardown"}
        assert stages <= {e["name"] for e in events(trace, rank, "preflight.stage")}, rank
        assert "DDP401" in {e["name"].split()[0] for e in events(trace, rank, "preflight.check")}
        assert [e["name"] for e in events(trace, rank) if e["name"] == "init_process_group"
                and e["cat"] == "probe"] == ["init_process_group"]
    [failed] = events(trace, 1, "failure")
    assert failed["name"] == "failed: ValueError: bad batch on rank 1"
    [cause] = events(trace, 1, "root_cause")
    assert "DDP800" in cause["name"]
    coll = [e for e in events(trace, 0) if e["name"].startswith("#1 all_reduce")]
    assert coll and coll[0]["args"]["seq_id"] == 1 and coll[0]["args"]["input_sizes"] == [[4]]


def test_a_native_crash_is_the_root_cause_with_its_python_line(tmp_path):
    report = tmp_path / "r.json"
    res = run([*DDP, "run", "--nproc-per-node", "2", "--timeout", "20", "--report", str(report),
               script("rank1_segfaults.py")], clean_env(), str(tmp_path), timeout=120)
    assert res.rc == 128 + 11, res.output  # the crashed rank's status, as a shell reports it
    rep = load_json(str(report))
    cause = rep["root_cause"]
    crash_line = Path(script("rank1_segfaults.py")).read_text().splitlines().index(
        "    ctypes.string_at(0)  # reads address 0: SIGSEGV inside native code") + 1
    assert cause["id"] == "DDP807" and cause["ranks"] == [1], rep["findings"]
    assert f"rank1_segfaults.py:{crash_line} in <module>" in cause["message"] and "SIGSEGV" in cause["message"]
    assert "string_at" in cause["evidence"]["python_stack"]
    rank0 = [f for f in rep["findings"] if f["ranks"] == [0] and f["severity"] == "error"]
    assert rank0 and all(f["evidence"].get("consequence") for f in rank0), rank0


def test_a_hang_is_reported_with_stacks_within_the_bound(tmp_path):
    report = tmp_path / "r.json"
    res = run([*DDP, "run", "--nproc-per-node", "2", "--hang-timeout", "3", "--report", str(report),
               script("rank1_sleeps.py")], clean_env(), str(tmp_path), timeout=90)
    assert res.rc == 124, res.output
    rep = load_json(str(report))
    sleep_line = Path(script("rank1_sleeps.py")).read_text().splitlines().index("    time.sleep(600)") + 1
    # the cause from the ledgers: rank 0 waits in the all_reduce rank 1 never issued, and where rank 1 is
    cause = rep["root_cause"]
    assert cause["id"] == "DDP891" and cause["ranks"] == [1], rep["findings"]
    assert "rank 0 waits in all_reduce #1" in cause["message"]
    assert f"rank1_sleeps.py:{sleep_line}" in cause["message"]
    # the hang itself stays in the report, with every rank's stack, as its consequence
    [hang] = [f for f in rep["findings"] if f["id"] == "DDP801"]
    assert hang["ranks"] == [1] and hang["evidence"]["consequence"]
    assert f"rank1_sleeps.py:{sleep_line}" in hang["message"] and "(in a collective)" in hang["message"]
    stacks = hang["evidence"]["stacks"]
    assert "rank1_sleeps.py" in stacks["1"] and "all_reduce" in stacks["0"]
    assert_clean_output(res)


def test_failed_preflight_does_not_start_the_script(tmp_path):
    report = tmp_path / "r.json"
    env = clean_env(MARKER_DIR=str(tmp_path))
    res = run_ranks(2, ["run", "--timeout", "3", "--report", str(report), script("writes_marker.py")],
                    env, str(tmp_path), world_size=3)
    assert sorted(res) == [0, 1]
    assert all(r.rc == 3 for r in res.values()), {r: x.output for r, x in res.items()}
    assert not list(tmp_path.glob("ran-*"))
    assert load_json(str(report))["root_cause"]["id"] == "DDP320"


def test_handover_under_an_env_launch_where_rank_0_hosts_the_store(tmp_path):
    # Preflight's store on MASTER_PORT must be gone before the script's own init_process_group
    # hosts one on the same port.
    res = run_ranks(2, ["run", "--timeout", "20", script("ok_allreduce.py"), "x"], clean_env(), str(tmp_path))
    assert sorted(res) == [0, 1]
    for r, x in res.items():
        assert x.rc == 0, x.output
        assert f"rank {r} sum 3.0 argv ['x']" in x.stdout


def test_handover_under_torchrun_and_its_summary_names_the_root_cause(tmp_path):
    res = run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "ddp_doctor", "run",
               "--timeout", "20", "--report", str(tmp_path / "r.json"), script("rank1_raises.py")],
              clean_env(), str(tmp_path))
    assert res.rc != 0
    # torchrun's own failure summary shows our diagnosis for the first failure
    assert "DDPDoctorTrainingError" in res.stderr and "DDP800" in res.stderr
    assert "rank 1 raised ValueError: bad batch on rank 1" in res.stderr


def test_single_process_spawn_script_names_the_failing_child(tmp_path):
    report = tmp_path / "r.json"
    res = run([*DDP, "run", "--report", str(report), script("spawn_child_fails.py")],
              clean_env(TEST_PORT=str(free_port())), str(tmp_path))
    assert res.rc == 1, res.output
    rep = load_json(str(report))
    cause = rep["root_cause"]
    assert cause["ranks"] == [1] and "KeyError: 'LOCAL_RANK'" in cause["message"]
    assert cause["evidence"]["spawn_process"] == 1


def test_module_form_keeps_python_m_semantics(tmp_path):
    env = clean_env(PYTHONPATH=str(ROOT))
    res = run([*DDP, "run", "-m", "tests.run_scripts.as_module", "--x", "1"], env, str(tmp_path))
    assert res.rc == 5
    assert "module main True ['--x', '1']" in res.stdout and "to stderr" in res.stderr


@pytest.mark.parametrize("argv,needle", [
    (["run"], "no script"),
    (["run", "--nproc-per-node", "2"], "no script"),
    (["run", "missing_script.py"], "no such script"),
    (["run", "--bogus", "x.py"], "unknown option"),
    (["run", "--timeout", "-3", "x.py"], "bad ddp-doctor option"),
    (["run", "--nproc-per-node", "2", "--run-dir", "/proc/no-such-dir", SCRIPTS_OK], "cannot make the run directory"),
])
def test_usage_errors_exit_2_without_traceback(tmp_path, argv, needle):
    res = run([*DDP, *argv], clean_env(), str(tmp_path), timeout=30)
    assert res.rc == 2 and needle in res.stderr, res.output
    assert_clean_output(res)


def test_one_line_api_under_torchrun_then_the_scripts_own_init(tmp_path):
    env = clean_env(PYTHONPATH=str(ROOT))
    res = run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", script("api_one_line.py")], env,
              str(tmp_path))
    assert res.rc == 0, res.output
    assert "after preflight rank 0 [2.0, 2.0]" in res.stdout and "after preflight rank 1" in res.stdout


def test_one_line_api_under_an_env_launch(tmp_path):
    # rank 0 hosts the preflight's store on MASTER_PORT, then the script hosts its own there
    port = free_port()
    from helpers.procs import finish, start
    procs = [start([sys.executable, script("api_one_line.py")],
                   clean_env(PYTHONPATH=str(ROOT), RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                             LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
                   str(tmp_path)) for r in range(2)]
    results = [finish(p, 120) for p in procs]
    assert all(r.rc == 0 for r in results), [r.output for r in results]


def test_one_line_api_inside_spawn_workers(tmp_path):
    res = run([sys.executable, script("api_spawn.py"), str(free_port())], clean_env(PYTHONPATH=str(ROOT)),
              str(tmp_path))
    assert res.rc == 0, res.output
    assert "spawn rank 0 pass" in res.stdout or "spawn rank 0 warn" in res.stdout
    assert "spawn rank 1" in res.stdout


def test_one_line_api_failure_exits_3_before_the_script(tmp_path):
    env = clean_env(PYTHONPATH=str(ROOT), SM_HOSTS="algo-1,algo-2", SM_CURRENT_HOST="algo-1",
                    DDP_DOCTOR_SM_ROOT=str(tmp_path / "opt_ml"))
    res = run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", script("api_one_line.py")], env,
              str(tmp_path))
    assert res.rc != 0 and "after preflight" not in res.stdout
    assert "exitcode  : 3" in res.stderr and "SM_HOSTS" in res.stderr


def test_hf_trainer_entrypoint_trains_under_ddp_doctor_run(tmp_path):
    pytest.importorskip("transformers")
    report = tmp_path / "r.json"
    env = clean_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", SM_MODEL_DIR=str(tmp_path / "model"),
                    SM_OUTPUT_DATA_DIR=str(tmp_path / "out"))
    res = run([*DDP, "run", "--nproc-per-node", "2", "--report", str(report), "-m",
               "ddp_doctor.training.hf_trainer", "--max-steps", "4"], env, str(tmp_path), timeout=300)
    assert res.rc == 0, res.output
    assert "world_size=2" in res.stdout
    assert (tmp_path / "out" / "metrics.json").is_file() and any((tmp_path / "model").iterdir())
    rep = load_json(str(report))
    assert rep["status"] in ("pass", "warn")
    # No false positive from the probes on a correct Trainer run; the callback's note made it in.
    training = {f["id"] for f in rep["findings"] if f["phase"] != "preflight"}
    assert training - TIMING_WARNINGS == {"DDP873"}, rep["findings"]


def test_rank_stuck_at_exit_is_ended_within_the_teardown_bound(tmp_path, monkeypatch):
    # The bound is 60 s in production; this test uses a copy of the run with a short bound.
    report = tmp_path / "r.json"
    code = ("import sys; import ddp_doctor.training.run.command as r; r.TEARDOWN_BOUND = 2.0; "
            "from ddp_doctor.cli import main; sys.exit(main(sys.argv[1:]))")
    res = run([sys.executable, "-c", code, "run", "--nproc-per-node", "2", "--report", str(report),
               script("stuck_at_exit.py")], clean_env(), str(tmp_path), timeout=120)
    assert res.rc == 0, res.output
    rep = load_json(str(report))
    stuck = [f for f in rep["findings"] if f["id"] == "DDP806"]
    assert stuck and sorted(stuck[0]["ranks"] + [r for f in stuck[1:] for r in f["ranks"]]) == [0, 1]


def test_abort_at_exit_after_the_script_ended_is_teardown_info_not_a_failure(tmp_path):
    report = tmp_path / "r.json"
    res = run([*DDP, "run", "--nproc-per-node", "2", "--report", str(report), script("abort_at_exit.py")],
              clean_env(), str(tmp_path))
    assert res.rc == 0, res.output  # the script's own status: it ended well
    assert sorted(ln.split(" done")[0] for ln in res.stdout.splitlines() if " done" in ln) == ["rank 0", "rank 1"]
    rep = load_json(str(report))
    aborts = [f for f in rep["findings"] if f["id"] == "DDP804"]
    assert aborts and all(f["severity"] == "info" and f["phase"] == "teardown" for f in aborts)
    # A rank still shutting down when the launcher saw its peer abort gets SIGTERM from it instead
    # (a race the machine's load decides): then it is DDP806, never a failure.
    termed = [f for f in rep["findings"] if f["id"] == "DDP806" and "SIGTERM" in f["message"]]
    assert sorted(r for f in aborts + termed for r in f["ranks"]) == [0, 1], rep["findings"]
    assert rep["status"] != "fail" and rep["root_cause"] is None
