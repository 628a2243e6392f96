"""A launcher environment no real job has: bounded in memory and time, and a finding naming the value."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest
from helpers.procs import free_port

from ddp_doctor.facts.launchers import MAX_RANKS, _slurm_tasks_per_node, address_problem, detect

LIMIT = 1536 * 1024 * 1024  # 1.5 GiB of address space


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _preflight(tmp_path, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "report.json"
    full = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_",
                                                                        "TORCHELASTIC", "OMPI_", "PMI_", "SLURM_"))}
    full.update(DDP_DOCTOR_HISTORY="off", **env)
    p = subprocess.run([sys.executable, "-m", "ddp_doctor", "preflight", "--timeout", "20", "--report", str(report)],
                       env=full, cwd=tmp_path, preexec_fn=_limited, capture_output=True, text=True, timeout=90)
    return p, json.loads(report.read_text())


def test_world_size_beyond_any_job_is_invalid_not_allocated():
    info = detect({"RANK": "0", "WORLD_SIZE": str(10**20)})
    assert info.world_size is None and "beyond any real job" in info.invalid["WORLD_SIZE"].why
    assert detect({"RANK": "0", "WORLD_SIZE": str(MAX_RANKS)}).world_size == MAX_RANKS
    info = detect({"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "2", "GROUP_WORLD_SIZE": str(10**30)})
    assert info.nnodes is None and "GROUP_WORLD_SIZE" in info.invalid


def test_slurm_tasks_per_node_is_not_expanded():
    assert _slurm_tasks_per_node("8(x100000000)", 99_999_999) == "8"  # walked, not built
    assert _slurm_tasks_per_node("8(x2),4", 2) == "4"
    assert _slurm_tasks_per_node("8(x2),4", 5) == "8"


@pytest.mark.slow
def test_preflight_with_world_size_1e20_is_a_finding(tmp_path):
    p, rep = _preflight(tmp_path, RANK="0", WORLD_SIZE=str(10**20), MASTER_PORT=str(free_port()))
    assert p.returncode == 3, p.stdout + p.stderr
    f = [f for f in rep["findings"] if f["id"] == "DDP101" and "WORLD_SIZE" in f["message"]]
    assert f and str(10**20) in f[0]["message"] and "beyond any real job" in f[0]["message"]


@pytest.mark.parametrize("addr", ["127.0.0.1/../../EVIL", "http://10.0.0.1", "10.0.0.1:29500", "a b", "[zz::1]",
                                  "x" * 300, "-bad-.host"])
def test_address_problem_refuses(addr):
    assert address_problem(addr)


@pytest.mark.parametrize("addr", ["127.0.0.1", "algo-1", "node_7.cluster.local", "::1", "[::1]", "fe80::1%eth0",
                                  "host.example.com."])
def test_address_problem_accepts(addr):
    assert address_problem(addr) is None


@pytest.mark.slow
def test_preflight_with_a_path_for_master_addr_fails_at_once(tmp_path):
    p, rep = _preflight(tmp_path, MASTER_ADDR="127.0.0.1/../../EVIL", RANK="0", WORLD_SIZE="2",
                        MASTER_PORT=str(free_port()))
    assert p.returncode == 3, p.stdout + p.stderr
    f = [f for f in rep["findings"] if f["id"] == "DDP111"]
    assert f and "127.0.0.1/../../EVIL" in f[0]["message"]
    assert rep["root_cause"]["id"] == "DDP111" if isinstance(rep.get("root_cause"), dict) else True
