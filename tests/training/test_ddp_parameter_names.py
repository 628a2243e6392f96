"""The names of the parameters each DDP model's reducer holds, as the probes record them
(training/probes/dist_wrappers.py `reduced_parameter_names`, Recorder.note_ddp_parameters): in the
reducer's own order, the order of the indices in DDP's errors. Checked against torch's
`_build_params_for_reducer` in a fresh interpreter (this test process is never patched)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.procs import clean_env

from ddp_doctor.training.probes.recorder import (
    MAX_DDP_MODELS,
    MAX_PARAMETER_NAMES,
    PARAMETER_NAME_CHARS,
    Recorder,
)

SCRIPT = r'''
import json
import torch, torch.distributed as dist
from torch import nn
from ddp_doctor.training.probes.install import install

rec = install(None)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


class Inner(nn.Module):
    def __init__(self, shared):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.shared = shared  # a module held in two places: its parameters are counted once


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(2))  # the root's own parameter
        shared = nn.Linear(2, 2)
        self.a = Inner(shared)
        self.frozen = nn.Linear(2, 2).requires_grad_(False)
        self.b = Inner(shared)
        self.b.lin.weight = self.a.lin.weight  # one parameter under two names
        self.ignored = nn.Linear(2, 2)
        self.head = nn.Linear(2, 1)


net = Net()
nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
    net, ["ignored.weight", "ignored.bias"])
ddp = nn.parallel.DistributedDataParallel(net)
params, _ = ddp._build_params_for_reducer()  # torch's own list: what the indices count in
name_of = {}
for n, p in net.named_parameters():
    name_of.setdefault(id(p), n)
torch_mapping = ddp._build_debug_param_to_name_mapping(params)
nn.parallel.DistributedDataParallel(nn.Linear(2, 2))  # a second model
print(json.dumps({"recorded": rec.to_dict()["ddp_parameters"], "torch": [name_of[id(p)] for p in params],
                  "torch_fqn": [torch_mapping[i] for i in range(len(params))]}))
'''


@pytest.mark.slow
def test_the_names_follow_the_reducers_order():
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=clean_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    [net, lin] = got["recorded"]
    assert net["names"] == got["torch"] and net["count"] == len(got["torch"]) and net["model"] == "Net"
    assert net["names"] == ["scale", "a.lin.weight", "a.lin.bias", "a.shared.weight", "a.shared.bias",
                            "b.lin.bias", "head.weight", "head.bias"]
    # torch's own names (TORCH_DISTRIBUTED_DEBUG) for the same indices: a parameter under two names
    # has its last one there, the root's a leading dot
    assert [n.lstrip(".") for n in got["torch_fqn"]] == [
        "scale", "b.lin.weight", "a.lin.bias", "a.shared.weight", "a.shared.bias", "b.lin.bias", "head.weight",
        "head.bias"]
    assert lin == {"model": "Linear", "count": 2, "names": ["weight", "bias"]}


def test_the_record_is_bounded():
    rec = Recorder(None)
    rec.note_ddp_parameters("Huge", ["x" * 300] * (MAX_PARAMETER_NAMES + 10), MAX_PARAMETER_NAMES + 10)
    [huge] = rec.ddp_parameters
    assert huge["count"] == MAX_PARAMETER_NAMES + 10 and len(huge["names"]) == MAX_PARAMETER_NAMES
    assert {len(n) for n in huge["names"]} == {PARAMETER_NAME_CHARS}
    for i in range(MAX_DDP_MODELS + 2):
        rec.note_ddp_parameters(f"M{i}", [f"p{i}"], 1)
    rec.note_ddp_parameters("M3", ["p3"], 1)  # wrapped anew: moves to the end, once
    assert [m["model"] for m in rec.ddp_parameters] == ["M2", "M4", "M5", "M3"]
    assert rec.to_dict()["ddp_parameters"] == rec.ddp_parameters
