"""torchrun takes its options' defaults from PET_* variables (torch's argparse_util `env` and
`check_env` actions; Kubeflow's PyTorchJob and TrainJob configure torchrun in a pod with them):
`ddp-doctor run` reads them the same way, so an environment that configures torchrun configures it."""
from __future__ import annotations

import re
import subprocess

import pytest
from helpers.procs import DDP, NO_SWEEP, clean_env

from ddp_doctor.cli.run_argv import (
    RunUsageError,
    check_nproc_per_node,
    check_torchrun_ranges,
    env_defaults,
    split_argv,
    with_env_defaults,
)
from ddp_doctor.testing import kubeflow_pod_env


def given(argv, env):
    """What main does: the command line split, then the PET_* defaults added where it gives none."""
    defaults = env_defaults(env)
    torchrun, doctor, target = split_argv(argv, defaults)
    torchrun, origin = with_env_defaults(torchrun, defaults)
    return torchrun, doctor, target, origin


def test_no_pet_variable_reads_nothing():
    assert env_defaults({"PATH": "/bin", "NNODES": "2"}) == []


def test_value_options_are_taken_where_the_command_line_gives_none():
    env = {"PET_NPROC_PER_NODE": "2", "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "job-master-0",
           "PET_MASTER_PORT": "23456", "PET_UNKNOWN_THING": "x"}
    torchrun, doctor, target, origin = given(["--nnodes", "1", "-v", "train.py", "--lr", "1"], env)
    # the command line's --nnodes wins, as in torchrun; the others come from their variables
    assert torchrun[:2] == ["--nnodes", "1"] and torchrun.count("--nnodes") == 1
    pairs = dict(zip(torchrun[2::2], torchrun[3::2]))
    assert pairs == {"--nproc-per-node": "2", "--node-rank": "1", "--master-addr": "job-master-0",
                     "--master-port": "23456"}
    assert doctor == ["--verbose"] and target.path == "train.py" and target.args == ["--lr", "1"]
    assert origin["--nproc-per-node"] == origin["--nproc_per_node"] == "PET_NPROC_PER_NODE"
    assert "--nnodes" not in origin


def test_a_command_line_spelling_with_underscores_also_wins():
    torchrun, _, _, origin = given(["--nproc_per_node=4", "--standalone", "train.py"],
                                   {"PET_NPROC_PER_NODE": "2", "PET_STANDALONE": "1"})
    assert torchrun == ["--nproc_per_node=4", "--standalone"] and origin == {}


def test_flags_are_on_for_a_whole_number_other_than_0():
    torchrun, _, target, _ = given(["mypkg.train"], {"PET_MODULE": "1", "PET_STANDALONE": "7"})
    assert target.module == "mypkg.train" and target.path is None
    assert torchrun == ["--standalone"]
    torchrun, _, target, _ = given(["train.py"], {"PET_MODULE": "0", "PET_STANDALONE": "0"})
    assert target.path == "train.py" and torchrun == []


@pytest.mark.parametrize("env, says", [
    ({"PET_STANDALONE": "yes"}, "PET_STANDALONE='yes': torchrun reads it as a whole number"),
    ({"PET_NO_PYTHON": "1"}, "unset PET_NO_PYTHON"),
])
def test_a_flag_variable_torchrun_cannot_take_is_one_line(env, says):
    with pytest.raises(RunUsageError, match=says):
        given(["train.py"], env)


@pytest.mark.parametrize("env, says", [
    ({"PET_NNODES": "0"}, "PET_NNODES='0' (torchrun's default for --nnodes): a job needs at least 1 node"),
    ({"PET_NNODES": "2", "PET_NODE_RANK": "2"}, "PET_NODE_RANK='2' (torchrun's default for --node-rank)"),
    ({"PET_MASTER_PORT": "99999"}, "PET_MASTER_PORT='99999'"),
])
def test_a_variable_out_of_range_is_named_in_the_usage_error(env, says):
    torchrun, _, _, origin = given(["train.py"], env)
    with pytest.raises(RunUsageError) as e:
        check_torchrun_ranges(torchrun, origin)
    assert says in str(e.value)


def test_a_process_count_torchrun_cannot_take_names_the_variable():
    torchrun, _, _, origin = given(["train.py"], {"PET_NPROC_PER_NODE": "0"})
    with pytest.raises(RunUsageError, match=r"PET_NPROC_PER_NODE='0' .*no process would start"):
        check_nproc_per_node(torchrun, origin)
    # given on the command line, the option is named as given (the variable is not used)
    torchrun, _, _, origin = given(["--nproc-per-node", "0", "train.py"], {"PET_NPROC_PER_NODE": "0"})
    with pytest.raises(RunUsageError, match=r"^--nproc-per-node '0'"):
        check_nproc_per_node(torchrun, origin)


@pytest.mark.slow
@pytest.mark.parametrize("pod", [
    {"PET_NPROC_PER_NODE": "2"},
    # a one-pod PyTorchJob: its RANK and WORLD_SIZE are the pod's, for torchrun to replace (the master's
    # service name resolves in a cluster only: here, loopback)
    {**kubeflow_pod_env("pytorchjob", pods=1, nproc_per_node="2"), "MASTER_ADDR": "127.0.0.1",
     "PET_MASTER_ADDR": "127.0.0.1"},
], ids=["pet", "pytorchjob"])
def test_pet_nproc_per_node_starts_that_many_ranks_as_torchrun_does(tmp_path, pod):
    script = tmp_path / "train.py"
    script.write_text("import torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\n"
                      "print(f'rank {dist.get_rank()} of {dist.get_world_size()}', flush=True)\n"
                      # init has no barrier at its end: a rank that destroyed its group at once could
                      # close the connections a slower peer's init was still making (gloo's race)
                      "dist.barrier()\n"
                      "dist.destroy_process_group()\n")
    res = subprocess.run([*DDP, "run", *NO_SWEEP, "--report", str(tmp_path / "r.json"), str(script)],
                         env=clean_env(**pod), cwd=tmp_path, capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    # two processes print to one pipe: their lines may interleave, the phrases do not
    assert sorted(re.findall(r"rank \d+ of \d+", res.stdout)) == ["rank 0 of 2", "rank 1 of 2"], res.stdout
    assert "PASS" in res.stderr and "2 rank(s) on 1 node(s)" in res.stderr, res.stderr
