"""The training entry points train for real: 2 gloo ranks under torchrun, and as one process.

hf_trainer: a tiny BERT built from a config, Hugging Face Trainer + accelerate, with the hub forced
offline (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) so that a download would fail the run.
plain_loop: DDP + DistributedSampler + set_epoch + rank-0 checkpoint + destroy_process_group.

The four trainings run together in one module fixture, three at a time.

Known teardown abort (docs/facts.md): torch 2.13 CPU sometimes aborts at interpreter exit after a
correct destroy_process_group on gloo ("terminate called without an active exception", SIGABRT). A rank
that dies that way *after* the script printed its final summary is accepted as that abort (under torchrun
the launcher then exits 1 and names signal 6 / exit code -6 for the rank); every other non-zero exit fails.
"""
from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pytest
from helpers.procs import Launch, Result, clean_env, result_of, run_all

pytestmark = pytest.mark.slow

# Like pytest.importorskip, without importing them into the test process (both xdist workers collect
# this module; the ranks import them)
if not all(importlib.util.find_spec(name) for name in ("transformers", "accelerate")):
    pytest.skip("needs transformers and accelerate", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "--max-restarts", "0"]
HF = ["-m", "ddp_doctor.training.hf_trainer"]
PLAIN = ["-m", "ddp_doctor.training.plain_loop"]
TIMEOUT = 150.0

SIGABRT_RC = (-6, 134)
ABORT_TEXT = "terminate called without an active exception"


def env(**extra: str) -> dict[str, str]:
    return clean_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                     TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT), **extra)


def _launcher_reports_sigabrt_at_exit(stderr: str) -> bool:
    """torchrun's ChildFailedError: the root cause is a rank killed by SIGABRT (-6); any other failed rank
    also aborted, or was sent SIGTERM (-15) by the launcher after the first abort."""
    root = re.search(r"Root Cause.*?exitcode\s*:\s*(-?\d+)", stderr, re.S)
    codes = [int(c) for c in re.findall(r"exitcode\s*:\s*(-?\d+)", stderr)]
    return bool(root) and int(root.group(1)) == -6 and all(c in (-6, -15) for c in codes)


def known_teardown_abort(result: Result, summary: str, *, torchrun: bool) -> bool:
    """True when a non-zero exit is the known gloo abort at exit, after the final summary was printed.

    Both scripts print the summary after a last barrier that every rank reaches and after
    destroy_process_group, so a summary on stdout means every rank finished its work."""
    if summary not in result.stdout:
        return False
    if torchrun:
        return result.rc == 1 and _launcher_reports_sigabrt_at_exit(result.stderr)
    return result.rc in SIGABRT_RC


def assert_finished(result: Result, summary: str, *, torchrun: bool) -> None:
    if result.rc == 0:
        return
    assert known_teardown_abort(result, summary, torchrun=torchrun), (
        f"exit {result.rc}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-6000:]}")
    print(f"known gloo teardown abort after the summary (rc={result.rc}, "
          f"{'with' if ABORT_TEXT in result.stderr else 'without'} the terminate message)")


def summary_fields(stdout: str, prefix: str) -> dict[str, str]:
    lines = [ln for ln in stdout.splitlines() if ln.startswith(prefix)]
    assert len(lines) == 1, f"expected one {prefix!r} line (rank 0 only), got {lines}\n{stdout}"
    return dict(kv.split("=", 1) for kv in lines[0][len(prefix):].split())


def write_channel(path: Path, n: int = 96, seq_len: int = 12) -> Path:
    """A SageMaker `train` channel in the documented JSON-lines format, split over two files."""
    path.mkdir(parents=True)
    rows = []
    for i in range(n):
        ids = [(i * 7 + j * 3) % 200 + 1 for j in range(4 + i % (seq_len - 3))]  # ragged, ids up to 200
        rows.append({"input_ids": ids, "label": i % 3})
    for k, part in enumerate((rows[: n // 2], rows[n // 2:])):
        (path / f"part-{k}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
    return path


def check_hf_outputs(model_dir: Path, out_dir: Path, world_size: int) -> dict:
    assert (model_dir / "config.json").is_file(), list(model_dir.glob("*"))
    weights = list(model_dir.glob("*.safetensors")) + list(model_dir.glob("*.bin"))
    assert any(w.name != "training_args.bin" for w in weights), list(model_dir.glob("*"))
    metrics = json.loads((out_dir / "metrics.json").read_text(encoding="utf-8"))
    assert math.isfinite(metrics["train_loss"]) and metrics["train_loss"] > 0, metrics
    assert metrics["world_size"] == world_size and metrics["global_step"] > 0, metrics
    return metrics


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, dict]:
    """The four trainings together, each in its own directory (its cwd): they mostly wait on
    interpreters importing torch and transformers."""
    base = tmp_path_factory.mktemp("entrypoints")
    d = {name: base / name for name in ("hf_two", "hf_one", "plain_two", "plain_one")}
    for path in d.values():
        path.mkdir()
    channel = write_channel(d["hf_two"] / "input" / "data" / "train")
    jobs = {
        # SageMaker conventions: directories from SM_*, hyperparameters as CLI args (underscored, as users write).
        "hf_two": Launch([*TORCHRUN, *HF, "--max_steps", "6", "--per_device_train_batch_size", "4", "--seq-len", "12"],
                         env(SM_CHANNEL_TRAIN=str(channel), SM_MODEL_DIR=str(d["hf_two"] / "model"),
                             SM_OUTPUT_DATA_DIR=str(d["hf_two"] / "output" / "data")), str(d["hf_two"]), TIMEOUT),
        "hf_one": Launch([sys.executable, *HF, "--max-steps", "5", "--model-dir", "m", "--output-data-dir", "o"],
                         env(), str(d["hf_one"]), TIMEOUT),
        "plain_two": Launch([*TORCHRUN, *PLAIN, "--epochs", "3"], env(SM_MODEL_DIR=str(d["plain_two"] / "model")),
                            str(d["plain_two"]), TIMEOUT),
        "plain_one": Launch([sys.executable, *PLAIN, "--epochs", "3", "--model-dir", str(d["plain_one"] / "model")],
                            env(), str(d["plain_one"]), TIMEOUT),
    }
    return base, run_all(jobs)


def test_hf_trainer_two_ranks_reads_sagemaker_channel(runs):
    base, results = runs
    r, here = result_of(results, "hf_two"), base / "hf_two"
    channel = here / "input" / "data" / "train"
    model_dir, out_dir = here / "model", here / "output" / "data"
    assert_finished(r, "hf_trainer: done", torchrun=True)
    fields = summary_fields(r.stdout, "hf_trainer: done")
    assert fields["world_size"] == "2" and fields["steps"] == "6" and fields["data"] == str(channel)
    assert math.isfinite(float(fields["train_loss"]))
    metrics = check_hf_outputs(model_dir, out_dir, world_size=2)
    assert metrics["train_samples"] == 96 and metrics["data"] == str(channel)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    assert config["vocab_size"] >= 201 and len(config["id2label"]) == 3  # grown to fit the channel's data
    # Loss is the per-example mean, not world_size times it (the Trainer's num_items_in_batch scaling).
    assert float(fields["train_loss"]) < 2 * math.log(3), fields
    # DoctorCallback ran on both ranks; rank 0 wrote the report: nothing but the batch-size note.
    # on SageMaker (SM_OUTPUT_DATA_DIR) the report goes with the job's output, not the code's directory
    assert not (here / "ddp-doctor-report.json").exists()
    rep = json.loads((here / "output" / "data" / "ddp-doctor-report.json").read_text(encoding="utf-8"))
    assert [f["id"] for f in rep["findings"]] == ["DDP873"] and rep["status"] == "pass", rep["findings"]


def test_hf_trainer_single_process_synthetic(runs):
    base, results = runs
    r = result_of(results, "hf_one")
    assert_finished(r, "hf_trainer: done", torchrun=False)
    fields = summary_fields(r.stdout, "hf_trainer: done")
    assert fields["world_size"] == "1" and fields["steps"] == "5" and fields["data"] == "synthetic"
    metrics = check_hf_outputs(base / "hf_one" / "m", base / "hf_one" / "o", world_size=1)
    assert metrics["train_samples"] == 256


def check_plain(r: Result, here: Path, world_size: int, torchrun: bool) -> None:
    import torch

    assert_finished(r, "plain_loop: done", torchrun=torchrun)
    fields = summary_fields(r.stdout, "plain_loop: done")
    assert fields["world_size"] == str(world_size)
    loss, first = float(fields["loss"]), float(fields["first_loss"])
    assert math.isfinite(loss) and loss < first, fields  # it learns
    epochs = [ln for ln in r.stdout.splitlines() if ln.startswith("plain_loop: epoch")]
    assert len(epochs) == 3, r.stdout  # rank 0 only, one line an epoch
    ckpt = torch.load(here / "model" / "model.pt", map_location="cpu", weights_only=True)
    assert ckpt["world_size"] == world_size and "0.weight" in ckpt["model"]  # unwrapped: no "module." prefix
    # 512 samples, batch 32: 16 steps an epoch in one process, 8 per rank with two ranks.
    assert int(fields["steps"]) == 3 * 16 // world_size


def test_plain_loop_two_ranks(runs):
    base, results = runs
    check_plain(result_of(results, "plain_two"), base / "plain_two", 2, torchrun=True)


def test_plain_loop_single_process_without_launcher(runs):
    base, results = runs
    check_plain(result_of(results, "plain_one"), base / "plain_one", 1, torchrun=False)


def test_known_abort_classification():
    ok = "plain_loop: done loss=0.1\n"
    # The shape torch 2.13's launcher prints when rank 0 aborts and rank 1 is then sent SIGTERM.
    launcher = ("ChildFailedError\nFailures:\n[1]:\n  exitcode  : -15 (pid: 12)  (SIGTERM)\n"
                "Root Cause (first observed failure):\n[0]:\n  exitcode  : -6 (pid: 11)  (SIGABRT)\n")
    assert known_teardown_abort(Result(1, ok, launcher, 0), "plain_loop: done", torchrun=True)
    assert known_teardown_abort(Result(-6, ok, ABORT_TEXT, 0), "plain_loop: done", torchrun=False)
    assert known_teardown_abort(Result(134, ok, ABORT_TEXT, 0), "plain_loop: done", torchrun=False)
    # Not the known abort: no summary yet, another exit code, another root cause.
    assert not known_teardown_abort(Result(1, "", launcher, 0), "plain_loop: done", torchrun=True)
    assert not known_teardown_abort(Result(-6, "", ABORT_TEXT, 0), "plain_loop: done", torchrun=False)
    assert not known_teardown_abort(Result(1, ok, "Traceback ...", 0), "plain_loop: done", torchrun=False)
    other_root = launcher.replace("-6 (pid: 11)", "1 (pid: 11)")
    assert not known_teardown_abort(Result(1, ok, other_root, 0), "plain_loop: done", torchrun=True)
    rank_failed = launcher.replace("-15 (pid: 12)", "1 (pid: 12)")
    assert not known_teardown_abort(Result(1, ok, rank_failed, 0), "plain_loop: done", torchrun=True)
