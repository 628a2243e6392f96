"""`ddp-doctor analyze` over what plain torchrun left (not under ddp-doctor) names the same root
cause as `ddp-doctor run` does for the same failure: each shape is run both ways, side by
side, by one module fixture; torchrun's artifacts are its console (`--tee 3`, the agent's summary,
one stream as a terminal or a job's log shows them) and its `--log-dir` tree."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from helpers.procs import DDP, Launch, clean_env, free_port, load_json, result_of, run, run_all

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
FR_DUMPING = Path(__file__).resolve().parent / "scripts" / "fr_dumping.py"
RECORDED = Path(__file__).resolve().parent / "scripts" / "recorded.py"
MPI_ENV = Path(__file__).resolve().parent / "scripts" / "mpi_env.py"

# name -> (script, extra environment, `run`'s extra options)
SHAPES = {
    "raises": ("rank1_raises.py", {}, []),
    "segfault": ("rank1_segfaults.py", {}, []),
    "killed": ("rank_oom_killed.py", {"OOM_RANK": "0"}, []),
    "worker": ("rank1_worker_raises.py", {}, []),  # raised in a DataLoader worker, wrapped by the loop
    "after_group": ("rank1_fails_after_the_group.py", {}, []),  # raised after destroy_process_group
    "exited": ("rank1_sys_exit.py", {}, []),  # rank 1's sys.exit(3): no Python error, only a status
    "ok": ("ok_allreduce.py", {}, []),
}
# what the --log-dir tree alone shows: the traceback (the same root cause), or nothing of the
# ending (a kill, a crash without faulthandler, an exit status: only the launcher's summary says)
TREE_ALONE = {"raises": "same", "worker": "same", "after_group": "same", "segfault": "DDP950", "killed": "DDP950",
              "exited": "DDP953"}
# the shapes only a ledger tells apart: under plain torchrun each rank writes its flight recorder
# with torch's own dump call when it raises, ends or is stopped (scripts/fr_dumping.py), and the
# process group's timeout (the script's own init_process_group(timeout=...)) ends a hang
LEDGER_SHAPES = {
    "uneven": ("uneven_inputs.py", {}, []),
    "sizes": ("size_mismatch.py", {}, []),
    "barrier_in_block": ("barrier_in_rank0_block.py", {}, ["--hang-timeout", "6"]),
    "rank0_only": ("rank0_only_allreduce.py", {}, ["--hang-timeout", "6"]),
    "nan_break": ("leaves_loop_on_nan.py", {}, ["--hang-timeout", "6"]),
    "eval_rank0": ("rank0_evaluates_after_training.py", {}, ["--hang-timeout", "6"]),
    "slow_checkpoint": ("slow_checkpoint.py", {}, []),  # the group's own timeout (5 s) ends the wait
    "blocked_on_queue": ("rank1_blocks_on_queue.py", {}, ["--hang-timeout", "6"]),
}
# init's arguments: run judges the calls it recorded; analyze, what each rank's init waited for
# when the group's timeout (PG_TIMEOUT, as the script's own would) ended it
INIT_SHAPES = {
    "handset_rank": ("handset_rank.py", {}, []),
    "env_world": ("env_world_size.py", {}, []),
}
FAILED = [s for s in SHAPES if s != "ok"]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    base = tmp_path_factory.mktemp("postmortem")
    launches = {}
    for name, (script, extra, run_extra) in {**SHAPES, **LEDGER_SHAPES, **INIT_SHAPES}.items():
        env = clean_env(**extra)
        report = str(base / f"{name}.json")
        launches[f"run-{name}"] = Launch([*DDP, "run", "--nproc-per-node", "2", "--timeout", "30", *run_extra,
                                          "--report", report, str(SCRIPTS / script)], env, str(base))
        target = [str(SCRIPTS / script)]
        if name in LEDGER_SHAPES or name in INIT_SHAPES:
            target = [str(FR_DUMPING), *target]
            env = {**env, "FR_DUMP_DIR": str(_mkdir(base / f"{name}-dumps")), "TORCH_FR_BUFFER_SIZE": "2000",
                   "PG_TIMEOUT": "8"}
        if name in INIT_SHAPES:  # each rank's own timeout printed before torchrun stops the other
            env = {**env, "EXIT_TOGETHER_DIR": str(_mkdir(base / f"{name}-printed"))}
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    "--log-dir", str(base / f"{name}-logs"), "--tee", "3", *target]
        # one stream, as a terminal or a job's log has it: the ranks' lines and the agent's summary interleaved
        launches[f"torchrun-{name}"] = Launch(["sh", "-c", '"$@" > console.log 2>&1', "sh", *torchrun], env,
                                              str(_mkdir(base / name)))
    # "raises" under other launches: torchrun --redirects 3 (no tee: the ranks' output only in the
    # tree) with an entrypoint under torch's @record (each rank's error.json, quoted by the summary);
    # plain mpirun --tag-output, the script's environment set as a team's launch script does
    raises = str(SCRIPTS / SHAPES["raises"][0])
    launches["torchrun-raises_recorded"] = Launch(
        ["sh", "-c", '"$@" > console.log 2>&1', "sh", sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node", "2", "--log-dir", str(base / "raises_recorded-logs"), "--redirects", "3",
         str(RECORDED), raises], clean_env(), str(_mkdir(base / "raises_recorded")))
    if shutil.which("mpirun") is not None:
        launches["torchrun-raises_mpirun"] = Launch(
            ["sh", "-c", '"$@" > console.log 2>&1', "sh", "mpirun", "-np", "2", "--oversubscribe", "--tag-output",
             "-x", "MASTER_PORT", sys.executable, str(MPI_ENV), raises],
            clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", MASTER_PORT=str(free_port())),
            str(_mkdir(base / "raises_mpirun")))
    # a job of torch.multiprocessing.spawn, started as `python script.py`: one process's console
    spawn = str(SCRIPTS / "spawn_child_fails.py")
    launches["run-spawn"] = Launch([*DDP, "run", "--timeout", "30", "--report", str(base / "spawn.json"), spawn],
                                   clean_env(TEST_PORT=str(free_port())), str(base))
    launches["torchrun-spawn"] = Launch(["sh", "-c", '"$@" > console.log 2>&1', "sh", sys.executable, spawn],
                                        clean_env(TEST_PORT=str(free_port())), str(_mkdir(base / "spawn")))
    return {"base": base, "results": run_all(launches, at_once=3)}


def _mkdir(p: Path) -> Path:
    p.mkdir()
    return p


def analyze(base: Path, *paths: Path) -> tuple:
    out = base / f"analyze-{abs(hash(paths))}.json"
    res = run([*DDP, "analyze", *map(str, paths), "--report", str(out)], clean_env(), str(base), timeout=120)
    return res, load_json(str(out))


def cause(rep: dict) -> tuple:
    c = rep["root_cause"]
    return (c["id"], c["ranks"]) if c else None


@pytest.mark.parametrize("what", ["console", "log_dir", "both"])
@pytest.mark.parametrize("shape", FAILED)
def test_analyze_names_the_root_cause_run_names(shapes, shape, what):
    base = shapes["base"]
    ran = result_of(shapes["results"], f"run-{shape}")
    plain = result_of(shapes["results"], f"torchrun-{shape}")
    assert ran.rc != 0 and plain.rc != 0, (ran.output, plain.output)
    live = load_json(str(base / f"{shape}.json"))
    inputs = {"console": [base / shape / "console.log"], "log_dir": [base / f"{shape}-logs"],
              "both": [base / shape / "console.log", base / f"{shape}-logs"]}[what]
    res, rep = analyze(base, *inputs)
    assert "Traceback (most recent call last)" not in res.output, res.output
    if what == "log_dir" and TREE_ALONE[shape] == "DDP950":
        # the tree alone: the rank that died printed nothing, and no summary says how it ended;
        # the verdict then says what it lacks instead of naming a rank it cannot know
        assert res.rc == 3, res.output
        assert "DDP950" in {f["id"] for f in rep["findings"]}, rep["findings"]
        assert rep["root_cause"]["caused_by"] is None or rep["root_cause"]["id"] == "DDP802", rep["root_cause"]
        return
    if what == "log_dir" and TREE_ALONE[shape] == "DDP953":
        # the rank that exited printed no error and the tree has no exit status: the peer's
        # lost-peer error is all that failed, and the rank whose output stops is named with its
        # last line, never passed over
        assert res.rc == 3 and rep["root_cause"]["id"] == "DDP802", rep["findings"]
        (stops,) = [f for f in rep["findings"] if f["id"] == "DDP953"]
        assert stops["ranks"] == cause(live)[1] and "no more data, stopping" in stops["message"], stops
        return
    assert res.rc == 3, res.output
    assert cause(rep) == cause(live), (rep["findings"], live["findings"])
    assert rep["status"] == "fail" and rep["phase"] == "training"


@pytest.mark.parametrize("shape", list(LEDGER_SHAPES))
def test_analyze_of_the_ranks_dumps_names_the_rank_that_went_its_own_way_as_run_does(shapes, shape):
    """The desync, uneven-input and hang shapes of the ledger: the console and each rank's
    flight-recorder dump give the same root cause, rank and call as run's live ledger."""
    base = shapes["base"]
    ran = result_of(shapes["results"], f"run-{shape}")
    plain = result_of(shapes["results"], f"torchrun-{shape}")
    assert ran.rc != 0 and plain.rc != 0, (ran.output, plain.output)
    live = load_json(str(base / f"{shape}.json"))
    res, rep = analyze(base, base / shape / "console.log", base / f"{shape}-dumps")
    assert cause(rep) == cause(live), (rep["findings"], live["findings"])
    assert rep["root_cause"]["id"].startswith("DDP89"), rep["root_cause"]
    assert not [f for f in rep["findings"] if f["id"] == "DDP951"], rep["findings"]  # every dump read


@pytest.mark.parametrize("shape", list(INIT_SHAPES))
def test_analyze_names_the_init_argument_run_names_from_what_each_rank_waited_for(shapes, shape):
    base = shapes["base"]
    plain = result_of(shapes["results"], f"torchrun-{shape}")
    assert plain.rc != 0, plain.output
    live = load_json(str(base / f"{shape}.json"))
    res, rep = analyze(base, base / shape / "console.log", base / f"{shape}-logs")
    assert cause(rep) == cause(live), (rep["findings"], live["findings"])
    assert f"{INIT_SHAPES[shape][0]}:" in rep["root_cause"]["message"]  # the user's init line
    timeouts = [f for f in rep["findings"] if f["id"] == "DDP835"]
    assert timeouts and all(f["caused_by"] == live["root_cause"]["id"] for f in timeouts), rep["findings"]


def test_a_spawned_jobs_console_names_the_spawned_process_as_run_does(shapes):
    base = shapes["base"]
    assert result_of(shapes["results"], "torchrun-spawn").rc != 0
    live = load_json(str(base / "spawn.json"))
    res, rep = analyze(base, base / "spawn" / "console.log")
    assert cause(rep) == cause(live) == (live["root_cause"]["id"], [1]), (rep["findings"], live["findings"])
    root = rep["root_cause"]
    assert root["evidence"]["spawn_process"] == 1 and "KeyError: 'LOCAL_RANK'" in root["message"]


@pytest.mark.parametrize("how", ["raises_recorded", "raises_mpirun"])
def test_other_launches_of_the_same_failure_give_the_same_cause(shapes, how):
    """torchrun --redirects with @record (analyzed from its console alone: the summary quotes the
    rank's error file; then with its tree), and Open MPI's --tag-output console."""
    base = shapes["base"]
    if f"torchrun-{how}" not in shapes["results"]:
        pytest.skip("mpirun is not installed")
    plain = result_of(shapes["results"], f"torchrun-{how}")
    assert plain.rc != 0, plain.output
    live = load_json(str(base / "raises.json"))
    res, rep = analyze(base, base / how / "console.log")
    assert cause(rep) == cause(live) == ("DDP800", [1]), rep["findings"]
    assert rep["world"]["launcher"] == ("mpirun" if how == "raises_mpirun" else "torchrun")
    if how == "raises_recorded":
        res, rep = analyze(base, base / how / "console.log", base / f"{how}-logs")
        assert cause(rep) == ("DDP800", [1]) and not [f for f in rep["findings"] if f["id"] == "DDP950"], rep


def test_a_removed_log_is_named_and_the_rank_the_launcher_saw_fail_is_still_the_cause(shapes, tmp_path):
    """Rank 1 raised, but its output is gone (its folder of the tree, its lines of the console):
    the launcher's summary still says it failed first; the report says its error is unknown, and
    that its output is missing."""
    base = shapes["base"]
    console = [ln for ln in (base / "raises" / "console.log").read_text().splitlines(keepends=True)
               if not ln.startswith(("[default1]", "[rank1]"))]
    (tmp_path / "console.log").write_text("".join(console))
    tree = tmp_path / "logs"
    shutil.copytree(base / "raises-logs", tree)
    for d in tree.glob("*/attempt_*/1"):
        shutil.rmtree(d)
    res, rep = analyze(tmp_path, tmp_path / "console.log", tree)
    assert cause(rep) == ("DDP803", [1]), rep["findings"]
    assert "its output is not among the evidence" in rep["root_cause"]["message"]
    (missing,) = [f for f in rep["findings"] if f["id"] == "DDP950"]
    assert missing["ranks"] == [1] and missing["severity"] == "warning", missing


def test_a_job_that_succeeded_is_no_failure_found_never_a_pass(shapes):
    base = shapes["base"]
    assert result_of(shapes["results"], "torchrun-ok").rc == 0
    res, rep = analyze(base, base / "ok" / "console.log", base / "ok-logs")
    assert rep["status"] == "warn" and rep["root_cause"] is None, rep["findings"]
    (none,) = [f for f in rep["findings"] if f["id"] == "DDP952"]
    assert none["ranks"] == [0, 1] and "whether the job ended well the artifacts cannot say" in none["message"]
    assert res.rc == 0


def test_binary_and_half_written_inputs_are_skipped_and_named(shapes, tmp_path):
    base = shapes["base"]
    (tmp_path / "core.bin").write_bytes(b"\x7fELF\x00\x00\x01" * 100)
    (tmp_path / "nccl_trace_rank_0").write_bytes(b"\x80\x04\x95\x10\x00\x00")  # a pickle cut short
    res, rep = analyze(tmp_path, base / "raises" / "console.log", tmp_path / "core.bin", tmp_path / "nccl_trace_rank_0")
    assert cause(rep) == ("DDP800", [1]), rep["findings"]
    (skipped,) = [f for f in rep["findings"] if f["id"] == "DDP951"]
    whys = {Path(s["path"]).name: s["why"] for s in skipped["evidence"]["skipped"]}
    assert whys["core.bin"].startswith("binary") and "flight-recorder dump" in whys["nccl_trace_rank_0"], whys


def test_bad_paths_are_a_usage_error(tmp_path):
    res = run([*DDP, "analyze", str(tmp_path / "nowhere")], clean_env(), str(tmp_path), timeout=60)
    assert res.rc == 2 and "no such file or directory" in res.stderr, res.output
