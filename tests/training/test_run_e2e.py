"""`ddp-doctor run` on real processes: handover, passthrough, failures, hangs, spawn scripts.

The runs are started together by one module fixture (they mostly wait: interpreters importing
torch, rendezvous, bounds), then each test reads its own run's result and report. A rank that
raises under torchrun is read from a launch shared with test_two_jobs_one_host_e2e.py
(helpers/launches.py, two_torchrun_jobs).
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Callable

import pytest
from helpers.procs import (
    DDP,
    NO_SWEEP,
    TIMING_WARNINGS,
    Launch,
    assert_clean_output,
    clean_env,
    ddp_with_bounds,
    finish,
    free_port,
    last_stall_lines,
    load_json,
    outputs,
    result_of,
    run,
    run_ranks,
    start,
)

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
SCRIPTS_OK = str(SCRIPTS / "ok_allreduce.py")
AT_ONCE = 3  # runs at a time on 2 cores
# the runs whose subject is not the preflight leave out its communication checks (NO_SWEEP); "raises"
# keeps them (its trace shows DDP401)


def script(name: str) -> str:
    return str(SCRIPTS / name)


def own_launches(base: Path) -> dict[str, Launch]:
    """One command each, for run_all; in each its own directory base/<name> (its cwd), longest first."""
    def at(name: str) -> str:
        (base / name).mkdir()
        return str(base / name)

    def report(name: str) -> str:
        return str(base / name / "r.json")

    out = {
        "hang": Launch([*DDP, "run", *NO_SWEEP, "--nproc-per-node", "2", "--hang-timeout", "3", "--progress",
                        "--report", report("hang"), script("rank1_sleeps.py")], clean_env(), at("hang"), timeout=90),
    }
    if importlib.util.find_spec("transformers"):  # else its test skips
        hf = at("hf_trainer")
        out["hf_trainer"] = Launch([*DDP, "run", *NO_SWEEP, "--nproc-per-node", "2", "--report", report("hf_trainer"),
                                    "-m", "ddp_doctor.training.hf_trainer", "--max-steps", "0", "--epochs", "2",
                                    "--num-samples", "64", "--eval-strategy", "epoch"],
                                   clean_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", SM_MODEL_DIR=f"{hf}/model",
                                             SM_OUTPUT_DATA_DIR=f"{hf}/out"), hf, timeout=300)
    out |= {
        "raises": Launch([*DDP, "run", "--nproc-per-node", "2", "--report", report("raises"), "--timeout", "20",
                          "--trace", str(base / "raises" / "trace.json"), script("rank1_raises.py")],
                         clean_env(TMPDIR=at("raises_tmp")), at("raises"), timeout=120),
        "segfault": Launch([*DDP, "run", *NO_SWEEP, "--nproc-per-node", "2", "--timeout", "20", "--report",
                            report("segfault"), script("rank1_segfaults.py")], clean_env(), at("segfault"),
                            timeout=120),
        "passthrough": Launch([*DDP, "run", *NO_SWEEP, "--nproc-per-node", "2", "--report", report("passthrough"),
                               script("ok_allreduce.py"), "a", "--flag"], clean_env(EXIT="7"), at("passthrough"),
                              timeout=120),
        "stuck_at_exit": Launch([*ddp_with_bounds(TEARDOWN_BOUND=2.0), "run", "--nproc-per-node", "2",
            *NO_SWEEP, "--report", report("stuck_at_exit"), script("stuck_at_exit.py")], clean_env(),
            at("stuck_at_exit"), timeout=120),
        "abort_at_exit": Launch([*DDP, "run", *NO_SWEEP, "--nproc-per-node", "2", "--report", report("abort_at_exit"),
                                 script("abort_at_exit.py")], clean_env(), at("abort_at_exit"), timeout=120),
        "api_torchrun": Launch([*TORCHRUN, "--standalone", "--nproc-per-node", "2", script("api_one_line.py")],
                               clean_env(PYTHONPATH=str(ROOT)), at("api_torchrun"), timeout=120),
        "api_fails": Launch([*TORCHRUN, "--standalone", "--nproc-per-node", "2", script("api_one_line.py")],
                            clean_env(PYTHONPATH=str(ROOT), SM_HOSTS="algo-1,algo-2", SM_CURRENT_HOST="algo-1",
                                      DDP_DOCTOR_SM_ROOT=str(base / "api_fails" / "opt_ml")),
                            at("api_fails"), timeout=120),
        "module_form": Launch([*DDP, "run", *NO_SWEEP, "-m", "tests.run_scripts.as_module", "--x", "1"],
                              clean_env(PYTHONPATH=str(ROOT)), at("module_form"), timeout=120),
        "ranks_filter": Launch([*DDP, "run", *NO_SWEEP, "--nproc-per-node", "2", "--local-ranks-filter", "0",
                                "--report", report("ranks_filter"), script("rank0_raises_both_print.py")], clean_env(),
                               at("ranks_filter"), timeout=120),
    }
    return out


def by_hand(base: Path) -> dict[str, Callable[[], object]]:
    """Runs that start several processes by hand, or pick a port: each picks its port as it starts."""
    d = {name: base / name for name in ("failed_preflight", "env_handover", "spawn_child_fails", "api_env",
                                        "api_spawn")}
    for path in d.values():
        path.mkdir()

    def api_env() -> list:
        port = free_port()
        procs = [start([sys.executable, script("api_one_line.py")],
                       clean_env(PYTHONPATH=str(ROOT), RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                                 LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
                       str(d["api_env"])) for r in range(2)]
        return [finish(p, 120) for p in procs]

    return {
        "failed_preflight": lambda: run_ranks(
            2, ["run", "--timeout", "6", "--report", str(d["failed_preflight"] / "r.json"),
                script("writes_marker.py")], clean_env(MARKER_DIR=str(d["failed_preflight"])),
            str(d["failed_preflight"]), world_size=3),
        "env_handover": lambda: run_ranks(2, ["run", *NO_SWEEP, "--timeout", "20", script("ok_allreduce_job.py"), "x"],
                                          clean_env(), str(d["env_handover"])),
        "spawn_child_fails": lambda: run([*DDP, "run", "--report", str(d["spawn_child_fails"] / "r.json"),
                                          script("spawn_child_fails.py")], clean_env(TEST_PORT=str(free_port())),
                                         str(d["spawn_child_fails"])),
        "api_env": api_env,
        "api_spawn": lambda: run([sys.executable, script("api_spawn.py"), str(free_port())],
                                 clean_env(PYTHONPATH=str(ROOT)), str(d["api_spawn"])),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory, launches):
    """Every run of this module, AT_ONCE at a time: the launches, the runs started by hand, and the
    shared launches read here (helpers/launches.py) that no module launched before."""
    base = tmp_path_factory.mktemp("run")
    results = launches.get("two_torchrun_jobs", own={**by_hand(base), **own_launches(base)}, at_once=AT_ONCE)
    return {"base": base, "results": results}


def ran(runs: dict, name: str):
    """One run's result; a run that overran fails only the test that reads it."""
    return result_of(runs["results"], name)


def dir_of(runs: dict, name: str) -> Path:
    return runs["base"] / name


def report_of(runs: dict, name: str) -> dict:
    return load_json(str(runs["base"] / name / "r.json"))


def test_self_launched_run_passes_output_argv_and_exit_code_through(runs):
    res = ran(runs, "passthrough")
    assert res.rc == 7, res.output
    lines = sorted(line for line in res.stdout.splitlines() if line.startswith("rank"))
    assert lines == ["rank 0 sum 3.0 argv ['a', '--flag']", "rank 1 sum 3.0 argv ['a', '--flag']"]
    assert "ddp-doctor" not in res.stdout  # stdout is the script's own
    rep = report_of(runs, "passthrough")  # the script said it failed (7): never a pass
    assert rep["phase"] == "training" and rep["status"] == "fail", rep
    assert rep["root_cause"]["id"] == "DDP814" and rep["root_cause"]["ranks"] == [0, 1], rep["findings"]
    assert "ok_allreduce.py:12" in rep["root_cause"]["message"]  # the line that called sys.exit


def test_a_rank_that_raises_is_the_root_cause_and_its_peer_is_labelled(runs):
    """Also the Chrome trace of this failing run (--trace): one launch, both sets of assertions."""
    res = ran(runs, "raises")
    assert res.rc == 1, res.output
    assert "ValueError: bad batch on rank 1" in res.stderr  # the user's traceback, as Python prints it
    rep = report_of(runs, "raises")
    assert rep["status"] == "fail"
    assert rep["root_cause"]["id"] == "DDP800" and rep["root_cause"]["ranks"] == [1]
    peer = [f for f in rep["findings"] if f["id"] == "DDP802"]
    assert peer and peer[0]["ranks"] == [0] and peer[0]["evidence"]["consequence"]
    assert "Root cause: DDP800" in res.stderr
    assert rep["measurements"]["stage_seconds"]["group_checks"] > 0
    # rank 0 ended by the launcher before its probes' record was written (DDP806): the race of RANK0_ENDINGS
    ended = {r for f in rep["findings"] if f["id"] == "DDP806" for r in f["ranks"]}
    assert_failing_run_trace(dir_of(runs, "raises") / "trace.json", res.stderr, without_probes=ended)
    assert verdict_block(res.stderr, str(dir_of(runs, "raises") / "r.json")) == GOLDEN_RAISES, res.stderr
    # its temp directory (TMPDIR) as it was: the run directory removed, and torch's launcher made its
    # log tree (the ranks' error files) in it, not a /tmp/torchelastic_* of its own that would stay
    assert sorted(p.name for p in dir_of(runs, "raises_tmp").iterdir()) == [], "left in TMPDIR"


# The verdict of rank1_raises.py as printed (golden): the root cause once, with the user's line,
# its consequences under it, no info or measurement lines on a failure. Ports, the checkout's path
# and the report path are placeholders; a DDP806/DDP804 line (rank 0's exit after the failure,
# timing-dependent) is left out before comparing.
GOLDEN_RAISES = """\
ddp-doctor training: FAIL (2 error(s), 0 warning(s)) - 2 rank(s) on 1 node(s), launcher ddp-doctor (2 local rank(s)), \
backend gloo
Root cause: DDP800 A rank raised an exception [rank 1]
  rank 1 raised ValueError: bad batch on rank 1
  at <scripts>/rank1_raises.py:7 in <module>
  Fix: Read the traceback of the rank named as root cause (the others are labelled as peers that failed after it) \
and fix that error first.
  Next: fix the code (cause: code); running the job again fails the same way
  Then, as a consequence:
    DDP802 [rank 0]: <rank 0's ending>
Info: 1 (shown with --verbose or in the JSON report)
Report: <report>"""


def verdict_block(stderr: str, report_path: str) -> str:
    import re
    lines = stderr.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("ddp-doctor training: "))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("Report: "))
    kept, skipping = [], False
    for line in lines[start:end + 1]:
        # only timing can warn here: rank 0's exit after the failure (DDP804/DDP806) and the
        # load-dependent preflight figures (TIMING_WARNINGS) of ranks sharing two cores
        if line == "Warnings:":
            skipping = True
            continue
        if skipping and line.startswith("  "):
            ids_here = "|".join(["DDP80[46]", *sorted(TIMING_WARNINGS)])
            assert line.startswith("    ") or re.match(rf"\s+({ids_here}) ", line), line  # a warning or its details
            continue
        skipping = False
        if not re.match(r"\s+DDP80[46][ \[]", line):  # "  DDP806 title" or, as a consequence, "    DDP806 [rank 0]"
            kept.append(line)
    text = re.sub(r"\(2 error\(s\), \d+ warning\(s\)\)", "(2 error(s), 0 warning(s))", "\n".join(kept))
    text = text.replace(report_path, "<report>").replace(str(SCRIPTS), "<scripts>")
    text = re.sub(r"\[/\S*/gloo/transport/tcp/pair\.cc:\d+\]", "[<gloo>/pair.cc:<line>]", text)
    text = re.sub(r"\]:\d+", "]:<port>", text)
    # rank 0's own ending is a race it loses or wins: its gloo error when rank 1's exit closes the
    # connection, or the launcher's SIGTERM when that comes before rank 0 leaves its collective
    ending = re.search(r"DDP802 \[rank 0\]: (.*)", text)
    assert ending and ending.group(1) in RANK0_ENDINGS, text
    return text.replace(ending.group(1), "<rank 0's ending>")


RANK0_ENDINGS = (
    "rank 0 failed after rank 1 failed: RuntimeError: [<gloo>/pair.cc:<line>] Connection closed by peer "
    "[127.0.0.1]:<port>. This is typically caused by a remote worker crashing. Check the logs of the remote worker "
    "before reporting an error. GLHF! 🏖️",
    "rank 0 was stopped by the launcher (SIGTERM) after another rank failed",
)


def assert_failing_run_trace(path: Path, stderr: str, without_probes: set[int]) -> None:
    """The trace shows each rank's lane, its preflight stages, the failure and the collective
    rank 0 was in when rank 1 left."""
    import json

    from ddp_doctor.report import chrome_trace as tracelib

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
        probes = [e["name"] for e in events(trace, rank) if e["name"] == "init_process_group" and e["cat"] == "probe"]
        assert probes == ([] if rank in without_probes and not probes else ["init_process_group"]), rank
    [failed] = events(trace, 1, "failure")
    assert failed["name"] == "failed: ValueError: bad batch on rank 1"
    [cause] = events(trace, 1, "root_cause")
    assert "DDP800" in cause["name"]
    coll = [e for e in events(trace, 0) if e["name"].startswith("#1 all_reduce")]
    assert coll and coll[0]["args"]["seq_id"] == 1 and coll[0]["args"]["input_sizes"] == [[4]]


def test_a_native_crash_is_the_root_cause_with_its_python_line(runs):
    res = ran(runs, "segfault")
    assert res.rc == 128 + 11, res.output  # the crashed rank's status, as a shell reports it
    rep = report_of(runs, "segfault")
    cause = rep["root_cause"]
    crash_line = Path(script("rank1_segfaults.py")).read_text().splitlines().index(
        "    ctypes.string_at(0)  # reads address 0: SIGSEGV inside native code") + 1
    assert cause["id"] == "DDP807" and cause["ranks"] == [1], rep["findings"]
    assert f"rank1_segfaults.py:{crash_line} in <module>" in cause["message"] and "SIGSEGV" in cause["message"]
    assert "string_at" in cause["evidence"]["python_stack"]
    rank0 = [f for f in rep["findings"] if f["ranks"] == [0] and f["severity"] == "error"]
    assert rank0 and all(f["evidence"].get("consequence") for f in rank0), rank0


def test_a_hang_is_reported_with_stacks_within_the_bound(runs):
    res = ran(runs, "hang")
    assert res.rc == 124, res.output
    rep = report_of(runs, "hang")
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
    # --progress: before the verdict, lines on stderr (never stdout) naming the stalled rank and its line
    progress = [ln for ln in res.stderr.splitlines() if "made no progress for" in ln and "ended at 3 s" in ln]
    assert progress and "made no progress" not in res.stdout, res.stderr
    assert any(re.search(rf"rank 1 (has made .*, )?at rank1_sleeps\.py:{sleep_line} ", ln) for ln in progress), progress
    # one line per fifth of the final stall, the verdict at the fifth: its lines are the last run of
    # growing durations (a short stall at start-up, before the ranks first moved, starts its own)
    assert len(last_stall_lines(progress)) <= 4, progress
    assert res.stderr.index(progress[-1]) < res.stderr.index("DDP891"), res.stderr


def test_failed_preflight_does_not_start_the_script(runs):
    res = ran(runs, "failed_preflight")
    assert sorted(res) == [0, 1]
    assert all(r.rc == 3 for r in res.values()), outputs(res)
    assert not list(dir_of(runs, "failed_preflight").glob("ran-*"))
    assert report_of(runs, "failed_preflight")["root_cause"]["id"] == "DDP320"


def test_handover_under_an_env_launch_where_rank_0_hosts_the_store(runs):
    # Preflight's store on MASTER_PORT must be gone before the script's own init_process_group
    # hosts one on the same port.
    res = ran(runs, "env_handover")
    assert sorted(res) == [0, 1]
    jobs = set()
    for r, x in res.items():
        assert x.rc == 0, x.output
        said = [ln for ln in x.stdout.splitlines() if ln.startswith(f"rank {r} sum 3.0 argv ['x'] job ")]
        assert len(said) == 1, x.output
        jobs.add(said[0].rsplit(" ", 1)[1])
    # both ranks' records name one job: the reporting rank's token, read by the other with the verdict
    assert len(jobs) == 1 and "None" not in jobs and len(jobs.pop()) == 32, jobs


def test_handover_under_torchrun_and_its_summary_names_the_root_cause(runs):
    # job B of the shared two_torchrun_jobs: `torchrun -m ddp_doctor run rank1_raises.py`, ended
    # before the job beside it is let go
    res = runs["results"]["two_torchrun_jobs"].result["b"]
    assert res.rc != 0
    # torchrun's own failure summary shows our diagnosis for the first failure
    assert "DDPDoctorTrainingError" in res.stderr and "DDP800" in res.stderr
    assert "rank 1 raised ValueError: bad batch on rank 1" in res.stderr


def test_single_process_spawn_script_names_the_failing_child(runs):
    res = ran(runs, "spawn_child_fails")
    assert res.rc == 1, res.output
    rep = report_of(runs, "spawn_child_fails")
    cause = rep["root_cause"]
    assert cause["ranks"] == [1] and "KeyError: 'LOCAL_RANK'" in cause["message"]
    assert cause["evidence"]["spawn_process"] == 1


def test_module_form_keeps_python_m_semantics(runs):
    res = ran(runs, "module_form")
    assert res.rc == 5
    assert "module main True ['--x', '1']" in res.stdout and "to stderr" in res.stderr


def test_local_ranks_filter_shows_one_rank_labelled_as_torchrun_does(runs):
    """torchrun's own --local-ranks-filter (not in ddp-doctor's old copied list) reaches the
    launcher: rank 1's lines are not shown; rank 0's uncaught traceback carries torch's "[rank0]: "
    on every line (its init_process_group's sys.excepthook), and the preflight's process group
    left no such hook behind before the script's own init."""
    res = ran(runs, "ranks_filter")
    assert res.rc == 1, res.output
    assert res.stdout.splitlines() == ["rank 0 out, excepthook before init: excepthook"], res.output
    assert "rank 0 err" in res.stderr and "rank 1 err" not in res.stderr and "[rank1]" not in res.stderr
    labelled = [ln for ln in res.stderr.splitlines() if ln.startswith("[rank0]: ")]
    assert labelled[0] == "[rank0]: Traceback (most recent call last):", res.stderr
    assert labelled[-1] == "[rank0]: ValueError: rank 0 fails on purpose", res.stderr
    assert 'rank0_raises_both_print.py", line 15, in <module>' in labelled[1]
    assert not [ln for ln in labelled if "ddp_doctor" in ln or "runpy" in ln], labelled
    rep = report_of(runs, "ranks_filter")  # the parent's diagnosis, whatever the filter
    assert rep["root_cause"]["id"] == "DDP800" and rep["root_cause"]["ranks"] == [0], rep["findings"]
    assert "Root cause: DDP800" in res.stderr


@pytest.mark.parametrize("argv,needle", [
    (["run"], "no script"),
    (["run", "--nproc-per-node", "2"], "no script"),
    (["run", "missing_script.py"], "no such script"),
    (["run", "--bogus", "x.py"], "unknown option"),
    (["run", "--no-python", "x.py"], "use torchrun"),
    (["run", "--timeout", "-3", "x.py"], "bad ddp-doctor option"),
    (["run", "--nnodes", "2", "--timeout", "inf", "x.py"], "bad ddp-doctor option"),  # no bound at all
])
def test_usage_errors_exit_2_without_traceback(tmp_path, argv, needle):
    res = run([*DDP, *argv], clean_env(), str(tmp_path), timeout=30)
    assert res.rc == 2 and needle in res.stderr, res.output
    assert_clean_output(res)


def test_one_line_api_under_torchrun_then_the_scripts_own_init(runs):
    res = ran(runs, "api_torchrun")
    assert res.rc == 0, res.output
    assert "after preflight rank 0 [2.0, 2.0]" in res.stdout and "after preflight rank 1" in res.stdout
    # the reporting rank says the verdict once, with where the report went; the other rank says nothing
    heads = [ln for ln in res.stderr.splitlines() if ln.startswith("ddp-doctor preflight: ")]
    assert len(heads) == 1 and ("- report ddp-doctor-report.json" in heads[0] or "Report: ddp-doctor-report.json"
                                in res.stderr), res.stderr[-3000:]


def test_one_line_api_under_an_env_launch(runs):
    # rank 0 hosts the preflight's store on MASTER_PORT, then the script hosts its own there
    results = ran(runs, "api_env")
    assert all(r.rc == 0 for r in results), outputs(results)


def test_one_line_api_inside_spawn_workers(runs):
    res = ran(runs, "api_spawn")
    assert res.rc == 0, res.output
    assert "TCPStore.cpp" not in res.stderr, res.stderr[-3000:]  # rank 1's wait for rank 0's store: quiet
    assert "spawn rank 0 pass" in res.stdout or "spawn rank 0 warn" in res.stdout
    assert "spawn rank 1" in res.stdout


def test_one_line_api_failure_exits_3_before_the_script(runs):
    res = ran(runs, "api_fails")
    assert res.rc != 0 and "after preflight" not in res.stdout
    assert "exitcode  : 3" in res.stderr and "SM_HOSTS" in res.stderr


def test_hf_trainer_entrypoint_trains_under_ddp_doctor_run(runs):
    pytest.importorskip("transformers")
    res = ran(runs, "hf_trainer")
    assert res.rc == 0, res.output
    assert "world_size=2" in res.stdout
    hf = dir_of(runs, "hf_trainer")
    assert (hf / "out" / "metrics.json").is_file() and any((hf / "model").iterdir())
    # it evaluated at the end of each epoch, on every rank: a correct pattern, no finding
    assert load_json(str(hf / "out" / "metrics.json"))["evaluations"] == 2
    rep = report_of(runs, "hf_trainer")
    assert rep["status"] in ("pass", "warn")
    said = res.stderr.splitlines()  # a pass says so in one line, with the report's path; a warn in full
    path = str(hf / "r.json")
    assert (f"Report: {path}" in said if rep["status"] == "warn"
            else any(line.startswith("ddp-doctor training: PASS (0 error(s), 0 warning(s)) - 2 rank(s) ")
                     and line.endswith(" - report " + path) for line in said)), res.stderr
    # No false positive from the probes on a correct Trainer run; the callback's note made it in.
    training = {f["id"] for f in rep["findings"] if f["phase"] != "preflight"}
    assert training - TIMING_WARNINGS == {"DDP873"}, rep["findings"]


def test_rank_stuck_at_exit_is_ended_within_the_teardown_bound(runs):
    # The bound is 60 s in production; this test uses a copy of the run with a short bound.
    res = ran(runs, "stuck_at_exit")
    assert res.rc == 0, res.output
    rep = report_of(runs, "stuck_at_exit")
    stuck = [f for f in rep["findings"] if f["id"] == "DDP806"]
    assert stuck and sorted(stuck[0]["ranks"] + [r for f in stuck[1:] for r in f["ranks"]]) == [0, 1]


def test_abort_at_exit_after_the_script_ended_is_teardown_info_not_a_failure(runs):
    res = ran(runs, "abort_at_exit")
    assert res.rc == 0, res.output  # the script's own status: it ended well
    assert sorted(ln.split(" done")[0] for ln in res.stdout.splitlines() if " done" in ln) == ["rank 0", "rank 1"]
    rep = report_of(runs, "abort_at_exit")
    aborts = [f for f in rep["findings"] if f["id"] == "DDP804"]
    assert aborts and all(f["severity"] == "info" and f["phase"] == "teardown" for f in aborts)
    # A rank still shutting down when the launcher saw its peer abort gets SIGTERM from it instead
    # (a race the machine's load decides): then it is DDP806, never a failure.
    termed = [f for f in rep["findings"] if f["id"] == "DDP806" and "SIGTERM" in f["message"]]
    assert sorted(r for f in aborts + termed for r in f["ranks"]) == [0, 1], rep["findings"]
    assert rep["status"] != "fail" and rep["root_cause"] is None
