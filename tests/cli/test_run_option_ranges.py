"""`ddp-doctor run` with a torchrun option out of range (--nnodes 0, --master-port 99999, ...) is a
usage error naming the option (exit 2), never "read the launcher's error" (exit 1)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.procs import DDP, clean_env

from ddp_doctor.cli.run_argv import RunUsageError, check_torchrun_ranges

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv, option", [
    (["--nnodes", "0"], "--nnodes"),
    (["--nnodes=3:2"], "--nnodes"),
    (["--nnodes", "0:2"], "--nnodes"),
    (["--nnodes", "two"], "--nnodes"),
    (["--master-port", "99999"], "--master-port"),
    (["--master_port=0"], "--master-port"),
    (["--master-port", "http"], "--master-port"),
    (["--nnodes", "2", "--node-rank", "2"], "--node-rank"),
    (["--node-rank", "-1"], "--node-rank"),
    (["--node_rank=1"], "--node-rank"),
])
def test_out_of_range_options_are_usage_errors(argv, option):
    with pytest.raises(RunUsageError, match=option):
        check_torchrun_ranges(argv)


@pytest.mark.parametrize("argv", [
    [], ["--nnodes", "1"], ["--nnodes", "1:4", "--node-rank", "3"], ["--master-port", "29500"],
    ["--master_port=1"], ["--master-port", "65535"], ["--nnodes=2", "--node_rank", "1"],
])
def test_values_in_range_pass(argv):
    check_torchrun_ranges(argv)


@pytest.mark.slow
@pytest.mark.parametrize("argv, option", [
    (["--nnodes", "0"], "--nnodes"),
    (["--master-port", "99999"], "--master-port"),
    (["--nproc-per-node", "0"], "--nproc-per-node"),
])
def test_the_command_exits_2_naming_the_option(tmp_path, argv, option):
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    res = subprocess.run([*DDP, "run", *argv, "--report", str(tmp_path / "r.json"), str(script)],
                         env=clean_env(), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert option in res.stderr and "trained" not in res.stdout
    assert not (tmp_path / "r.json").exists()


def test_a_device_word_torch_cannot_take_is_refused_without_importing_torch():
    # no torch device extension here: "gpux" is no device, said at once (torch's import takes seconds)
    script = (
        "import sys\n"
        "from ddp_doctor.cli.run_argv import RunUsageError, check_nproc_per_node\n"
        "try:\n"
        "    check_nproc_per_node(['--nproc-per-node', 'gpux'])\n"
        "except RunUsageError as e:\n"
        "    print(e)\n"
        "print('torch' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env=clean_env(PYTHONPATH=str(ROOT)))
    said, imported = res.stdout.strip().splitlines()
    assert "--nproc-per-node 'gpux': no such device type" in said and imported == "False", res.stdout + res.stderr
