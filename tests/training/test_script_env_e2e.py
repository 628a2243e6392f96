"""What the script's own init_process_group() needs, on real launches:
- a real torch.multiprocessing.spawn of 2 workers calling ddp_doctor.preflight(rank=, world_size=)
  with MASTER_ADDR/MASTER_PORT never set: DDP110 (error, ranks 0-1), each worker exits 3 before
  the script's init_process_group;
- a real 2-process `mpirun python -m ddp_doctor run script.py` (plain mpirun: only OMPI_COMM_WORLD_*
  set): ddp-doctor run exports RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and the
  script's default init_process_group() works; DDP110 is info.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from helpers.procs import clean_env, free_port, load_json, run

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "run_scripts"


@pytest.mark.slow
def test_spawn_workers_without_master_addr_stop_with_ddp110(tmp_path):
    report = tmp_path / "r.json"
    res = run([sys.executable, str(SCRIPTS / "api_spawn_no_master.py")],
              clean_env(PYTHONPATH=str(ROOT), DDP_DOCTOR_REPORT=str(report)), str(tmp_path), timeout=180)
    assert res.rc != 0 and "terminated with exit code 3" in res.stderr, res.output[-3000:]
    assert "trained" not in res.stdout  # the script's own init_process_group never ran
    rep = load_json(str(report))
    assert rep["root_cause"]["id"] == "DDP110" and rep["root_cause"]["ranks"] == [0, 1], rep["findings"]
    assert [f["id"] for f in rep["findings"]].count("DDP110") == 1  # one finding, both ranks
    assert "MASTER_ADDR and MASTER_PORT not set" in rep["root_cause"]["message"]


def _mpirun() -> list[str] | None:
    exe = shutil.which("mpirun")
    if exe is None:
        return None
    extra = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [exe, *extra, "--oversubscribe", "-np", "2"]


@pytest.mark.slow
@pytest.mark.skipif(_mpirun() is None, reason="needs Open MPI's mpirun (openmpi-bin)")
def test_plain_mpirun_of_ddp_doctor_run_exports_torch_variables(tmp_path):
    (tmp_path / "train.py").write_text(
        "import os, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT\n"
        "t = torch.ones(1)\n"
        "dist.all_reduce(t)\n"
        "os.write(1, f\"rank {os.environ['RANK']} local {os.environ['LOCAL_RANK']} sum {t.item():g}\\n\".encode())\n"
        "dist.destroy_process_group()\n")
    port = free_port()
    report = tmp_path / "pf.json"
    env = clean_env(PYTHONPATH=str(ROOT))
    # mpirun forwards only what -x names; MASTER_PORT only to keep parallel tests apart
    cmd = [*_mpirun(), "-x", "PATH", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", f"MASTER_PORT={port}",
           sys.executable, "-m", "ddp_doctor", "run", "--timeout", "30", "--skip", "communication",
           "--report", str(report), "train.py"]
    res = run(cmd, env, str(tmp_path), timeout=240)
    assert res.rc == 0, res.output[-4000:]
    assert "rank 0 local 0 sum 2" in res.stdout and "rank 1 local 1 sum 2" in res.stdout, res.output[-4000:]
    assert "RANK expected, but not set" not in res.output


@pytest.mark.slow
@pytest.mark.skipif(_mpirun() is None, reason="needs Open MPI's mpirun (openmpi-bin)")
def test_plain_mpirun_with_the_api_stops_before_the_script(tmp_path):
    """Plain mpirun, the one-line API in the script: nothing exports torch's variables, so the
    preflight fails with DDP110 (exit 3) instead of passing and the script dying on a missing RANK."""
    (tmp_path / "train.py").write_text(
        "import ddp_doctor, torch.distributed as dist\n"
        "ddp_doctor.preflight(timeout=30, skip=['communication'])\n"
        "dist.init_process_group('gloo')\n"
        "print('trained', flush=True)\n")
    report = tmp_path / "pf.json"
    cmd = [*_mpirun(), "-x", "PATH", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", f"MASTER_PORT={free_port()}",
           "-x", f"DDP_DOCTOR_REPORT={report}", sys.executable, "train.py"]
    res = run(cmd, clean_env(PYTHONPATH=str(ROOT)), str(tmp_path), timeout=240)
    assert res.rc == 3, res.output[-4000:]
    assert "trained" not in res.stdout and "RANK expected, but not set" not in res.output
    rep = load_json(str(report))
    (f,) = [f for f in rep["findings"] if f["id"] == "DDP110"]
    assert f["severity"] == "error" and f["ranks"] == [0, 1], rep["findings"]
    assert "OMPI_COMM_WORLD_RANK" in f["hint"]
