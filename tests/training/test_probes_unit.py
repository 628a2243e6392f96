"""Parts of the probes that need no ranks: batch fingerprints, check sums, and the sitecustomize
that carries the probes into interpreters a script starts (run in fresh interpreters, so that this
test process is never patched)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from helpers.procs import clean_env

from ddp_doctor.training.probes import children, fingerprints


def test_sample_fingerprints_follow_contents_not_batch_position():
    x = torch.arange(12.0).reshape(4, 3)
    a = fingerprints.sample_hashes({"x": x, "y": torch.tensor([0, 1, 0, 1])}, 4)
    b = fingerprints.sample_hashes({"y": torch.tensor([1, 0, 1, 0]), "x": x.flip(0)}, 4)
    assert a is not None and len(set(a)) == 4 and a == b[::-1]  # same samples, reversed order
    c = fingerprints.sample_hashes({"x": x + 1, "y": torch.tensor([0, 1, 0, 1])}, 4)
    assert not set(a) & set(c)
    assert fingerprints.sample_hashes(["text", 3], None) is None  # nothing to fingerprint
    assert fingerprints.sample_hashes((x, torch.tensor(2.0)), None) == fingerprints.sample_hashes((x,), None)


def test_tensor_sums_one_value_pair_per_tensor():
    entries = [("w", torch.tensor([1.0, -2.0]), "param"), ("n", torch.tensor(3), "buffer"),
               ("flag", torch.tensor([True, False, True]), "buffer"), ("empty", torch.zeros(0), "param")]
    s = fingerprints.tensor_sums(entries)
    assert s["names"] == ["w", "n", "flag"] and s["kinds"] == ["param", "buffer", "buffer"]
    assert s["sum"] == [-1.0, 3.0, 2.0] and s["abs"] == [3.0, 3.0, 2.0]


@pytest.mark.slow
def test_child_interpreters_record_once_they_import_torch_and_chain_sitecustomize(tmp_path):
    other = tmp_path / "other_site"
    other.mkdir()
    marker = tmp_path / "marker"
    (other / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    env = clean_env()
    env["PYTHONPATH"] = str(other)
    children.child_env(env, str(tmp_path / "records"))
    (tmp_path / "records").mkdir()
    assert env["PYTHONPATH"].split(":")[0] == children.SITE_DIR
    # A child that never imports torch is not slowed down by it.
    out = subprocess.run([sys.executable, "-c", "import sys; print('torch' in sys.modules)"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
    assert marker.read_text() == "ran"  # the shadowed sitecustomize still ran
    code = ("import torch, torch.distributed as dist\n"
            "from ddp_doctor.training.probes.recorder import current_recorder\n"
            "assert current_recorder() is not None\n"
            "store = dist.HashStore()\n"
            "dist.init_process_group('gloo', store=store, rank=0, world_size=1)\n"
            "s = torch.utils.data.DistributedSampler(range(8))\n"
            "s.set_epoch(3)\n"
            "dist.destroy_process_group()\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    [rec_file] = list((tmp_path / "records").glob("probe-*.json"))
    rec = json.loads(rec_file.read_text())
    kinds = [e["kind"] for e in rec["events"]]
    assert kinds == ["init_process_group", "set_epoch", "destroy_process_group"] and rec["rank"] == 0
    assert rec["events"][0]["backend"] == "gloo" and rec["events"][1]["epoch"] == 3
    assert rec["pg"]["world_size"] == 1
    assert rec["ended"]["how"] == "exit" and rec["ended"]["pg_initialized"] is False


@pytest.mark.slow
def test_fork_after_cuda_is_recorded_but_not_for_dataloader_workers(tmp_path):
    # No GPU here: torch.cuda.is_initialized is replaced by a fake that says CUDA is up; the forks
    # are real (a multiprocessing fork Process, then DataLoader workers, which fork by design).
    code = ("import json, multiprocessing as mp, os, sys, torch\n"
            "from ddp_doctor.training.probes.install import install\n"
            "rec = install(sys.argv[1])\n"
            "torch.cuda.is_initialized = lambda: True  # FAKE: CUDA 'initialised' in this parent\n"
            "ds = torch.utils.data.TensorDataset(torch.zeros(4, 1))\n"
            "list(torch.utils.data.DataLoader(ds, num_workers=1))\n"
            "assert not [e for e in rec.events if e['kind'] == 'fork_after_cuda'], rec.events\n"
            "p = mp.get_context('fork').Process(target=os._exit, args=(0,))\n"
            "p.start(); p.join()\n"
            "print(json.dumps([e['kind'] for e in rec.events]))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=clean_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]).count("fork_after_cuda") == 1


@pytest.mark.slow
def test_a_probe_that_fails_never_changes_the_users_call(tmp_path):
    # DDP(None) must fail with torch's own error, set_epoch must take what torch takes, and the
    # post-import hook must find modules through every finder (here: one only a custom finder knows).
    code = ("import sys, importlib.abc, importlib.util, torch, torch.distributed as dist\n"
            "from torch.nn.parallel import DistributedDataParallel as DDP\n"
            "from ddp_doctor.training.probes import import_hooks\n"
            "from ddp_doctor.training.probes.install import install\n"
            "rec = install(sys.argv[1])\n"
            "try:\n"
            "    DDP(None)\n"
            "except Exception as e:\n"
            "    print('ddp-error', type(e).__name__, str(e).split(',')[0])\n"
            "s = torch.utils.data.DistributedSampler(range(4), num_replicas=1, rank=0)\n"
            "s.set_epoch(2.5)\n"
            "print('epoch', s.epoch)\n"
            "class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        return importlib.util.spec_from_loader(name, self) if name == 'only_here' else None\n"
            "    def create_module(self, spec):\n"
            "        return None\n"
            "    def exec_module(self, module):\n"
            "        module.value = 7\n"
            "sys.meta_path.append(Finder())\n"
            "seen = []\n"
            "import_hooks.when_imported('only_here', lambda m: seen.append(m.value))\n"
            "import only_here\n"
            "print('hook', seen, only_here.value)\n"
            "print('errors', len(rec.extra.get('probe_errors', [])))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=clean_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "ddp-error ValueError Default process group has not been initialized", lines  # torch's own
    assert lines[1:3] == ["epoch 2.5", "hook [7] 7"], lines
