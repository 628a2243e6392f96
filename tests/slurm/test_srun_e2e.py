"""`ddp-doctor run` as the task srun starts, on a real one-node SLURM cluster (scripts/slurm-local.sh,
which .ci/run starts): the preflight reads srun's variables as the launcher's, the script's own
init_process_group finds RANK / WORLD_SIZE / MASTER_ADDR, a job that ended well gets PASS, and a
rank that raises is named with its line. Without srun here the tests skip, unless
DDP_DOCTOR_REQUIRE_SLURM says the cluster was started (then its absence fails)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from helpers.procs import DDP, NO_SWEEP, clean_env

pytestmark = pytest.mark.slow

TRAIN = """\
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == int(os.environ.get("FAIL_RANK", "-1")):
    raise ValueError(f"bad batch on rank {rank}")
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {rank} of {dist.get_world_size()} sum {t.item():.0f} task {os.environ['SLURM_PROCID']}", flush=True)
dist.destroy_process_group()
"""


def _srun_ready() -> bool:
    if shutil.which("srun") is None:
        return False
    probe = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    return probe.returncode == 0 and any(s in probe.stdout for s in ("idle", "mixed", "allocated"))


@pytest.fixture(scope="module")
def srun(tmp_path_factory):
    if not _srun_ready():
        if os.environ.get("DDP_DOCTOR_REQUIRE_SLURM"):
            pytest.fail("DDP_DOCTOR_REQUIRE_SLURM is set but srun has no idle node (scripts/slurm-local.sh start)")
        pytest.skip("no SLURM cluster here: `bash scripts/slurm-local.sh start` starts one")
    base = tmp_path_factory.mktemp("srun")
    (base / "train.py").write_text(TRAIN)

    def launch(name: str, **env: str) -> tuple[subprocess.CompletedProcess[str], dict]:
        report = base / f"{name}.json"
        # --immediate: a node still busy with the last step is waited for, within a bound
        cmd = ["srun", "--immediate=60", "-N1", "-n2", "--overcommit", "--kill-on-bad-exit=0", *DDP, "run",
               *NO_SWEEP, "--report", str(report), str(base / "train.py")]
        res = subprocess.run(cmd, env=clean_env(**env), cwd=base, capture_output=True, text=True, timeout=240)
        return res, (json.loads(report.read_text()) if report.exists() else {})
    return launch


def test_a_job_srun_starts_passes_with_srun_as_its_launcher(srun):
    res, rep = srun("ok")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert sorted(ln.split(" task ")[0] for ln in res.stdout.splitlines() if ln.startswith("rank")) == [
        "rank 0 of 2 sum 2", "rank 1 of 2 sum 2"]
    assert rep["status"] == "pass" and rep["world"]["launcher"] == "slurm", rep.get("findings")
    assert rep["world"]["world_size"] == 2


def test_a_rank_that_raises_under_srun_is_named_with_its_line(srun):
    res, rep = srun("fail", FAIL_RANK="1")
    assert res.returncode != 0
    cause = rep["root_cause"]
    assert cause["id"] == "DDP800" and cause["ranks"] == [1], rep["findings"]
    assert "train.py:7" in cause["evidence"].get("raised_at", "") or "train.py:7" in cause["message"], cause
    assert (cause["cause_class"], cause["action"]) == ("code", "fix_code")
    assert "bad batch on rank 1" in res.stderr
