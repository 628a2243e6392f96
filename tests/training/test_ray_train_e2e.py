"""A Ray Train script (TorchTrainer, 2 CPU workers, gloo) run unchanged under `ddp-doctor run`, on a
real local Ray cluster: the worker that raised is the root cause by its world rank and line (Ray's
WorkerGroupError in the driver, unwrapped), the driver waiting in trainer.fit() is no hang, and
the cluster ray.init() started is shut down as the interpreter's exit would (no leftovers named,
none left running); a worker that hangs is found by the workers' beats within --hang-timeout, named
with its stack, and the job ends (exit 124) instead of waiting for Ray's 30-minute process-group
timeout. Two launches: Ray's start-up costs about half a minute of both cores each."""
from __future__ import annotations

import json
import subprocess

import pytest
from helpers.procs import DDP, NO_SWEEP, clean_env

pytest.importorskip("ray.train.torch", reason="the ray extra: pip install 'ddp-doctor[ray]'")
pytestmark = pytest.mark.slow

SCRIPT = """\
import ray
import ray.train
import ray.train.torch
import torch
import torch.nn as nn
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def loop(config):
    rank = ray.train.get_context().get_world_rank()
    model = ray.train.torch.prepare_model(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        if rank == 1 and step == 2:
            raise ValueError(f"bad shard on rank {rank} at step {step}")
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ray.train.report({"step": step})


ray.init(num_cpus=2, include_dashboard=False)
TorchTrainer(LOOP, scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
             run_config=RunConfig(storage_path=STORAGE, name="job")).fit()
"""

HANGS = """

def hangs(config):
    import threading
    import torch.distributed as dist
    rank = ray.train.get_context().get_world_rank()
    for step in range(3):
        if rank == 1 and step == 1:
            threading.Event().wait()  # the hang itself: rank 1 never reaches its second all_reduce
        t = torch.ones(1)
        dist.all_reduce(t)
        ray.train.report({"step": step})
"""


def _launch(tmp_path, loop: str, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict, object]:
    script = tmp_path / "ray_train.py"
    body = SCRIPT.replace("STORAGE", repr(str(tmp_path / "results"))).replace("LOOP", loop)
    if loop == "hangs":  # its function before the trainer that runs it
        head, tail = body.split("\n\nray.init(")
        body = head + HANGS + "\n\nray.init(" + tail
    script.write_text(body)
    report = tmp_path / "r.json"
    res = subprocess.run([*DDP, "run", *NO_SWEEP, *extra, "--report", str(report), str(script)],
                         env=clean_env(RAY_USAGE_STATS_ENABLED="0"), cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    return res, (json.loads(report.read_text()) if report.exists() else {}), script


def test_the_ray_worker_that_raised_is_the_root_cause_with_its_line(tmp_path):
    res, rep, script = _launch(tmp_path, "loop", "--hang-timeout", "20")
    assert res.returncode == 1, res.stderr[-4000:]  # the script's own status: fit() raised
    cause = rep["root_cause"]
    assert cause["id"] == "DDP800" and cause["ranks"] == [1], rep["findings"]
    assert cause["evidence"]["raised_at"] == f"{script}:16 in loop", cause["evidence"]
    assert (cause["cause_class"], cause["action"]) == ("code", "fix_code")
    assert "bad shard on rank 1 at step 2" in cause["message"] and "Ray Train worker rank 1" in cause["message"]
    found = {f["id"] for f in rep["findings"]}
    # fit() is where the driver waits for its workers (no DDP801 at 20 s); ray.shutdown ended the cluster
    assert not found & {"DDP801", "DDP816", "DDP817"}, rep["findings"]
    assert "Root cause: DDP800 A rank raised an exception [rank 1]" in res.stderr


def test_a_ray_worker_that_hangs_is_named_with_its_stack_within_the_bound(tmp_path):
    res, rep, script = _launch(tmp_path, "hangs", "--hang-timeout", "15")
    assert res.returncode == 124, res.stderr[-4000:]
    cause = rep["root_cause"]
    assert cause["id"] == "DDP801" and cause["ranks"] == [1], rep["findings"]
    where = cause["evidence"]["where"]
    assert where["1"].startswith(f"{script}:") and where["1"].endswith(" in hangs"), where  # its sleep
    assert cause["evidence"]["in_collective"] == [0]  # rank 0 waits in the all_reduce rank 1 never joins
    assert f"{script}" in cause["evidence"]["stacks"]["1"]
    assert "made no progress for 15 s; their stacks follow" in res.stderr
