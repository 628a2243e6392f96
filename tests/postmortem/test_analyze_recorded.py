"""`ddp-doctor analyze` over what plain torchrun left (not under ddp-doctor) names the same root
cause as `ddp-doctor run` does for the same failure. Both sides were recorded from real launches
of helpers/analyze_scenarios.py by tests/record_corpus.py (tests/corpus/analyze/NAME/): the job's
console (`--tee 3`, the agent's summary, one stream as a terminal or a job's log shows them), its
`--log-dir` tree and its ranks' flight-recorder dumps, analyzed here as the job left them; and
the run's evidence, judged again for the verdict the analysis must give. test_analyze_e2e.py
analyzes freshly launched jobs.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import corpus
from helpers.analyze_scenarios import FAILED, INIT_SHAPES, LEDGER_SHAPES, NAMES, TREE_ALONE
from helpers.procs import DDP, clean_env, run
from helpers.scenarios import line_of

from ddp_doctor.postmortem.analyze import analyze
from ddp_doctor.report.build import exit_code
from ddp_doctor.report.schema import validate_report
from ddp_doctor.training.evidence_file import verdict

# the user's line the cause names, for the ledger shapes whose source the analysis reads (the
# branches around a call): a run script edited since it was recorded fails here until re-recorded
LEDGER_LINES = {
    "uneven": ("uneven_inputs.py", "model(torch.randn(8, 4)).sum().backward()"),
    "sizes": ("size_mismatch.py", "dist.all_reduce(t)"),
    "barrier_in_block": ("barrier_in_rank0_block.py", "dist.barrier()  # meant for every rank"),
    "rank0_only": ("rank0_only_allreduce.py", "dist.all_reduce("),
    "nan_break": ("leaves_loop_on_nan.py", "dist.barrier()"),
    "eval_rank0": ("rank0_evaluates_after_training.py", "dist.all_reduce(loss)"),
    "blocked_on_queue": ("rank1_blocks_on_queue.py", "dist.all_reduce(t)"),
}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, dict[str, Path]]:
    """Each recorded job's artifacts, where it left them under a scratch directory of its own."""
    base = tmp_path_factory.mktemp("analyze-recorded")
    return {name: corpus.materialized(name, base) for name in corpus.analyzed_names()}


def analyzed(*paths: Path) -> tuple[int, dict]:
    """(the exit status, the report) of `ddp-doctor analyze PATHS`, in this process."""
    rep, _ = analyze([str(p) for p in paths])
    errors = validate_report(rep)
    assert not errors, errors
    return exit_code(rep), rep


def live(name: str) -> dict:
    """The report of the same failure under `ddp-doctor run`, judged again from its evidence."""
    code, rep, _ = corpus.live(name)
    assert code != 0, rep["findings"]
    return rep


def exited(name: str) -> dict[str, int]:
    return corpus.launch_of(name)["exit_codes"]


def cause(rep: dict) -> tuple | None:
    c = rep["root_cause"]
    return (c["id"], c["ranks"]) if c else None


def test_every_job_is_recorded_and_its_run_replays_to_the_verdict_it_recorded():
    assert set(corpus.analyzed_names()) >= {n for n in NAMES if n != "raises_mpirun"}
    assert set(corpus.analyzed_names()) <= set(NAMES)
    for name in corpus.analyzed_names():
        if (corpus.ANALYZED / name / "run.evidence.json").is_file():
            code, rep, was = corpus.live(name)
            assert verdict(rep, code) == was, name


@pytest.mark.parametrize("what", ["console", "log_dir", "both"])
@pytest.mark.parametrize("shape", FAILED)
def test_analyze_names_the_root_cause_run_names(jobs, shape, what):
    assert all(rc != 0 for rc in exited(shape).values()), exited(shape)
    job = jobs[shape]
    ran = live(shape)
    inputs = {"console": [job["console"]], "log_dir": [job["logs"]], "both": [job["console"], job["logs"]]}[what]
    code, rep = analyzed(*inputs)
    if what == "log_dir" and TREE_ALONE[shape] == "DDP950":
        # the tree alone: the rank that died printed nothing, and no summary says how it ended;
        # the verdict then says what it lacks instead of naming a rank it cannot know
        assert code == 3, rep["findings"]
        assert "DDP950" in {f["id"] for f in rep["findings"]}, rep["findings"]
        assert rep["root_cause"]["caused_by"] is None or rep["root_cause"]["id"] == "DDP802", rep["root_cause"]
        return
    if what == "log_dir" and TREE_ALONE[shape] == "DDP953":
        # the rank that exited printed no error and the tree has no exit status: the peer's
        # lost-peer error is all that failed, and the rank whose output stops is named with its
        # last line, never passed over
        assert code == 3 and rep["root_cause"]["id"] == "DDP802", rep["findings"]
        (stops,) = [f for f in rep["findings"] if f["id"] == "DDP953"]
        assert stops["ranks"] == cause(ran)[1] and "no more data, stopping" in stops["message"], stops
        return
    assert code == 3, rep["findings"]
    assert cause(rep) == cause(ran), (rep["findings"], ran["findings"])
    assert rep["status"] == "fail" and rep["phase"] == "training"


@pytest.mark.parametrize("shape", list(LEDGER_SHAPES))
def test_analyze_of_the_ranks_dumps_names_the_rank_that_went_its_own_way_as_run_does(jobs, shape):
    """The desync, uneven-input and hang shapes of the ledger: the console and each rank's
    flight-recorder dump give the same root cause, rank and call as run's live ledger."""
    assert all(rc != 0 for rc in exited(shape).values()), exited(shape)
    ran = live(shape)
    _, rep = analyzed(jobs[shape]["console"], jobs[shape]["dumps"])
    assert cause(rep) == cause(ran), (rep["findings"], ran["findings"])
    assert rep["root_cause"]["id"].startswith("DDP89"), rep["root_cause"]
    assert not [f for f in rep["findings"] if f["id"] == "DDP951"], rep["findings"]  # every dump read
    if shape in LEDGER_LINES:
        assert line_of(*LEDGER_LINES[shape]) in rep["root_cause"]["message"], rep["root_cause"]


@pytest.mark.parametrize("shape", list(INIT_SHAPES))
def test_analyze_names_the_init_argument_run_names_from_what_each_rank_waited_for(jobs, shape):
    assert exited(shape)[f"torchrun-{shape}"] != 0
    ran = live(shape)
    _, rep = analyzed(jobs[shape]["console"], jobs[shape]["logs"])
    assert cause(rep) == cause(ran), (rep["findings"], ran["findings"])
    assert f"{INIT_SHAPES[shape][0]}:" in rep["root_cause"]["message"]  # the user's init line
    assert line_of(INIT_SHAPES[shape][0], "dist.init_process_group(") in rep["root_cause"]["message"]
    timeouts = [f for f in rep["findings"] if f["id"] == "DDP835"]
    assert timeouts and all(f["caused_by"] == ran["root_cause"]["id"] for f in timeouts), rep["findings"]


def test_a_spawned_jobs_console_names_the_spawned_process_as_run_does(jobs):
    assert exited("spawn")["torchrun-spawn"] != 0
    ran = live("spawn")
    _, rep = analyzed(jobs["spawn"]["console"])
    assert cause(rep) == cause(ran) == (ran["root_cause"]["id"], [1]), (rep["findings"], ran["findings"])
    root = rep["root_cause"]
    assert root["evidence"]["spawn_process"] == 1 and "KeyError: 'LOCAL_RANK'" in root["message"]


@pytest.mark.parametrize("how", ["raises_recorded", "raises_mpirun"])
def test_other_launches_of_the_same_failure_give_the_same_cause(jobs, how):
    """torchrun --redirects with @record (analyzed from its console alone: the summary quotes the
    rank's error file; then with its tree), and Open MPI's --tag-output console."""
    if how not in jobs:  # recorded where mpirun is installed (python tests/record_corpus.py analyze)
        pytest.skip(f"{how} is not recorded: mpirun was not installed where the corpus was recorded")
    assert exited(how)[f"torchrun-{how}"] != 0
    ran = live("raises")
    _, rep = analyzed(jobs[how]["console"])
    assert cause(rep) == cause(ran) == ("DDP800", [1]), rep["findings"]
    assert rep["world"]["launcher"] == ("mpirun" if how == "raises_mpirun" else "torchrun")
    if how == "raises_recorded":
        _, rep = analyzed(jobs[how]["console"], jobs[how]["logs"])
        assert cause(rep) == ("DDP800", [1]) and not [f for f in rep["findings"] if f["id"] == "DDP950"], rep


def test_a_removed_log_is_named_and_the_rank_the_launcher_saw_fail_is_still_the_cause(jobs, tmp_path):
    """Rank 1 raised, but its output is gone (its folder of the tree, its lines of the console):
    the launcher's summary still says it failed first; the report says its error is unknown, and
    that its output is missing."""
    console = [ln for ln in jobs["raises"]["console"].read_text().splitlines(keepends=True)
               if not ln.startswith(("[default1]", "[rank1]"))]
    (tmp_path / "console.log").write_text("".join(console))
    tree = tmp_path / "logs"
    shutil.copytree(jobs["raises"]["logs"], tree)
    for d in tree.glob("*/attempt_*/1"):
        shutil.rmtree(d)
    _, rep = analyzed(tmp_path / "console.log", tree)
    assert cause(rep) == ("DDP803", [1]), rep["findings"]
    assert "its output is not among the evidence" in rep["root_cause"]["message"]
    (missing,) = [f for f in rep["findings"] if f["id"] == "DDP950"]
    assert missing["ranks"] == [1] and missing["severity"] == "warning", missing


def test_a_job_that_succeeded_is_no_failure_found_never_a_pass(jobs):
    assert exited("ok") == {"torchrun-ok": 0}
    code, rep = analyzed(jobs["ok"]["console"], jobs["ok"]["logs"])
    assert rep["status"] == "warn" and rep["root_cause"] is None, rep["findings"]
    (none,) = [f for f in rep["findings"] if f["id"] == "DDP952"]
    assert none["ranks"] == [0, 1] and "whether the job ended well the artifacts cannot say" in none["message"]
    assert code == 0


def test_binary_and_half_written_inputs_are_skipped_and_named(jobs, tmp_path):
    (tmp_path / "core.bin").write_bytes(b"\x7fELF\x00\x00\x01" * 100)
    (tmp_path / "nccl_trace_rank_0").write_bytes(b"\x80\x04\x95\x10\x00\x00")  # a pickle cut short
    _, rep = analyzed(jobs["raises"]["console"], tmp_path / "core.bin", tmp_path / "nccl_trace_rank_0")
    assert cause(rep) == ("DDP800", [1]), rep["findings"]
    (skipped,) = [f for f in rep["findings"] if f["id"] == "DDP951"]
    whys = {Path(s["path"]).name: s["why"] for s in skipped["evidence"]["skipped"]}
    assert whys["core.bin"].startswith("binary") and "flight-recorder dump" in whys["nccl_trace_rank_0"], whys


@pytest.mark.slow
def test_the_command_judges_recorded_artifacts_as_the_function_does(jobs, tmp_path):
    """The CLI over one recorded job: its exit status, its report file, no traceback."""
    res = run([*DDP, "analyze", str(jobs["raises"]["console"]), str(jobs["raises"]["logs"]),
               "--report", str(tmp_path / "r.json")], clean_env(), str(tmp_path), timeout=120)
    assert res.rc == 3 and "Traceback (most recent call last)" not in res.output, res.output
    assert cause(json.loads((tmp_path / "r.json").read_text())) == ("DDP800", [1])


@pytest.mark.slow
def test_bad_paths_are_a_usage_error(tmp_path):
    res = run([*DDP, "analyze", str(tmp_path / "nowhere")], clean_env(), str(tmp_path), timeout=60)
    assert res.rc == 2 and "no such file or directory" in res.stderr, res.output
