"""Merged findings on real ranks: `ddp-doctor run --nproc-per-node 2` of a script
whose init_process_group("nccl") fails on this CPU host on both ranks gives one DDP840 naming
ranks 0-1 (it was two findings, [0] and [1])."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers.procs import DDP, clean_env, load_json, run

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_same_error_on_two_real_ranks_is_one_finding(tmp_path):
    report = tmp_path / "r.json"
    res = run([*DDP, "run", "--nproc-per-node", "2", "--timeout", "20", "--skip", "communication",
               "--report", str(report), str(ROOT / "tests" / "failure_scripts" / "nccl_unavailable.py")],
              clean_env(PYTHONPATH=str(ROOT)), str(tmp_path), timeout=180)
    rep = load_json(str(report))
    nccl = [f for f in rep["findings"] if f["id"] == "DDP840"]
    assert len(nccl) == 1 and nccl[0]["ranks"] == [0, 1], (rep["findings"], res.output[-3000:])
    assert nccl[0]["message"].startswith("ranks 0-1 raised RuntimeError: Distributed package doesn't have NCCL")
    assert res.stderr.count("DDP840") <= 2  # the root-cause line and the one finding
