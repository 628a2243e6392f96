"""A Ray Train script (TorchTrainer, 2 CPU workers, gloo) run unchanged under `ddp-doctor run`.

On the local cluster its own ray.init() starts (the workers inherit the probes from the driver's
environment): the worker that raised is the root cause by its world rank and line (Ray's
WorkerGroupError in the driver, unwrapped), the driver waiting in trainer.fit() is no hang, the
job's world is its workers', their probes judge their data (both drew the same samples), and the
cluster is shut down as the interpreter's exit would (no leftovers named, none left running).

On a cluster started before it (`ray start --head`, reached through RAY_ADDRESS: the workers get
the probes through Ray's runtime-environment hook, not from the driver's environment): a worker
that hangs is found by the workers' beats within --hang-timeout, named with its stack, and the job
ends (exit 124) instead of waiting for Ray's 30-minute process-group timeout, its workers' ledgers
lined up as a launched job's (the collective rank 1 never issued); the cluster ends the job's
workers when the driver is gone.

Two launches: Ray's start-up costs about half a minute of both cores each."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from helpers.procs import DDP, NO_SWEEP, clean_env, free_port, kill_tree, start, wait_for, wait_for_line

pytest.importorskip("ray.train.torch", reason="the ray extra: pip install 'ddp-doctor[ray]'")
pytestmark = pytest.mark.slow

SCRIPT = """\
import ray
import ray.train
import ray.train.torch
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def loop(config):
    rank = ray.train.get_context().get_world_rank()
    model = ray.train.torch.prepare_model(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = DataLoader(TensorDataset(torch.arange(256.0).view(64, 4)), batch_size=8)  # not prepared: not sharded
    for step, (x,) in enumerate(data):
        if rank == 1 and step == 2:
            raise ValueError(f"bad shard on rank {rank} at step {step}")
        loss = model(x).pow(2).mean()
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


def _launch(tmp_path, loop: str, *extra: str, **env: str) -> tuple[subprocess.CompletedProcess[str], dict, object]:
    script = tmp_path / "ray_train.py"
    body = SCRIPT.replace("STORAGE", repr(str(tmp_path / "results"))).replace("LOOP", loop)
    if loop == "hangs":  # its function before the trainer that runs it
        head, tail = body.split("\n\nray.init(")
        body = head + HANGS + "\n\nray.init(" + tail
    if env.get("RAY_ADDRESS"):  # a cluster to join: ray.init() takes its address from the variable
        body = body.replace("ray.init(num_cpus=2, include_dashboard=False)", "ray.init()")
    script.write_text(body)
    report = tmp_path / "r.json"
    res = subprocess.run([*DDP, "run", *NO_SWEEP, *extra, "--report", str(report), str(script)],
                         env=clean_env(RAY_USAGE_STATS_ENABLED="0", **env), cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    return res, (json.loads(report.read_text()) if report.exists() else {}), script


CURRENT = Path("/tmp/ray/ray_current_cluster")  # the newest cluster `ray start` made here: ray.init()'s default


@pytest.fixture
def cluster(tmp_path):
    """A one-node Ray cluster started before the job, as `ray start --head --block` keeps it: its
    processes are this one's descendants, all ended after the test. `ray stop` would end every
    cluster on the machine; this one alone is ended, and the pointer to it is taken back (a later
    ray.init() would join the dead cluster)."""
    before = CURRENT.read_text() if CURRENT.exists() else None
    port = free_port()
    head = start([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}",
                  "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"],
                 clean_env(RAY_USAGE_STATS_ENABLED="0"), str(tmp_path))
    try:
        wait_for_line(head.stdout, "Ray runtime started", 120)
        yield head
    finally:
        kill_tree(head.pid)  # after a job, ray start --block sat on SIGTERM past 30 s: every process of it, at once
        head.communicate(timeout=30)
        if CURRENT.exists() and CURRENT.read_text().strip().endswith(f":{port}"):
            if before is None:
                CURRENT.unlink()
            else:
                CURRENT.write_text(before)


def _alive(pids: list[int]) -> list[int]:
    """The pids still running (a zombie is not)."""
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_the_ray_worker_that_raised_is_the_root_cause_with_its_line(tmp_path):
    res, rep, script = _launch(tmp_path, "loop", "--hang-timeout", "20")
    assert res.returncode == 1, res.stderr[-4000:]  # the script's own status: fit() raised
    cause = rep["root_cause"]
    assert cause["id"] == "DDP800" and cause["ranks"] == [1], rep["findings"]
    raises = next(i for i, ln in enumerate(script.read_text().splitlines()) if "raise ValueError" in ln) + 1
    assert cause["evidence"]["raised_at"] == f"{script}:{raises} in loop", cause["evidence"]
    assert (cause["cause_class"], cause["action"]) == ("code", "fix_code")
    assert "bad shard on rank 1 at step 2" in cause["message"] and "Ray Train worker rank 1" in cause["message"]
    found = {f["id"] for f in rep["findings"]}
    # fit() is where the driver waits for its workers (no DDP801 at 20 s); ray.shutdown ended the cluster
    assert not found & {"DDP801", "DDP816", "DDP817"}, rep["findings"]
    assert "Root cause: DDP800 A rank raised an exception [rank 1]" in res.stderr
    # the job's world is its workers' (the driver that ddp-doctor runs has none of its own)
    assert "2 rank(s) on 1 node(s), launcher ray, backend gloo" in res.stderr
    assert (rep["world"]["launcher"], rep["world"]["world_size"], rep["world"]["nnodes"]) == ("ray", 2, 1)
    # the workers' own probes: both drew the same samples from a loader Ray Train did not prepare
    # (their records are written as they train: Ray ends its workers without their exit)
    [same] = [f for f in rep["findings"] if f["id"] == "DDP850"]
    assert same["ranks"] == [0, 1] and "SequentialSampler over TensorDataset of 64" in same["message"], same


def test_a_ray_worker_that_hangs_on_a_cluster_it_joined_is_named_with_its_stack_within_the_bound(tmp_path, cluster):
    res, rep, script = _launch(tmp_path, "hangs", "--hang-timeout", "15", RAY_ADDRESS="auto")
    assert res.returncode == 124, res.stderr[-4000:]
    lines = script.read_text().splitlines()
    wait_line = next(i for i, ln in enumerate(lines) if 'Event().wait()' in ln) + 1
    waits = f"{script}:{wait_line}"
    reduces = f"{script}:{next(i for i, ln in enumerate(lines) if 'dist.all_reduce(t)' in ln) + 1}"
    # the workers' ledgers (asked for at the hang, answered by their beat threads) line them up as a
    # launched job's: rank 0 waits in all_reduce #2, which rank 1, at its wait, never issued
    cause = rep["root_cause"]
    assert cause["id"] == "DDP891" and cause["ranks"] == [1], rep["findings"]
    assert f"rank 0 waits in all_reduce #2 of process group 0 (default_pg) (issued at {reduces})" in cause["message"]
    assert f"rank 1 never issued #2 (its last was #1): it is at {waits} in hangs" in cause["message"]
    assert {r: d["position"] for r, d in cause["evidence"]["ranks"].items()} == {"0": "hung", "1": "hung"}
    [hang] = [f for f in rep["findings"] if f["id"] == "DDP801"]
    assert hang["caused_by"] == "DDP891" and hang["ranks"] == [1]
    assert hang["evidence"]["where"]["1"] == f"{waits} in hangs", hang["evidence"]
    assert hang["evidence"]["in_collective"] == [0]
    assert f'File "{script}", line {wait_line} in hangs' in hang["evidence"]["stacks"]["1"]  # faulthandler's
    assert "made no progress for 15 s; their stacks follow" in res.stderr
    assert (rep["world"]["launcher"], rep["world"]["world_size"]) == ("ray", 2)  # recorded before any step
    # the driver is gone: the cluster, still up, ends the job's workers
    [pids] = re.findall(r"the ranks the script started \(2: pids (\d+), (\d+)\) made no progress", res.stderr)
    workers = [int(p) for p in pids]
    wait_for(lambda: not _alive(workers), 60, lambda: f"the job's workers to end: {_alive(workers)} still run")
