"""Per-test time of trivial 2-rank gloo tests: ddp-doctor's pytest plugin against torch's
MultiProcessTestCase, the same tests, in one run.

    python bench/pytest_overhead.py [--tests 20]

Each side runs in its own `python -m pytest` subprocess with a JUnit file; per-test time is the
JUnit time of each test (setup + call + teardown). The plugin's first test also waits for the
forkserver to import torch, so it is reported apart ("first"), and the per-test figure is the
median of the others ("warm"). Every test does one all_reduce over a fresh process group.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

PLUGIN_TESTS = '''
import pytest
import torch
import torch.distributed as dist


@pytest.mark.parametrize("i", range({n}))
@pytest.mark.distributed(world_size=2, backend="gloo")
def test_trivial(i, rank):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2
'''

MPTC_TESTS = '''
import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase


class Trivial(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _one(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 2
        dist.destroy_process_group()

{methods}
'''


def run(dirpath: str, name: str, text: str, extra: list[str]) -> tuple[list[float], float, str]:
    path = os.path.join(dirpath, f"test_{name}.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    junit = os.path.join(dirpath, f"{name}.xml")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path,
                        f"--junitxml={junit}", *extra], cwd=dirpath, env=env, capture_output=True,
                       text=True, timeout=3600)
    wall = time.monotonic() - t0
    cases = ET.parse(junit).getroot().iter("testcase")
    times = [float(c.get("time", "0")) for c in cases]
    return times, wall, p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr[-500:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", type=int, default=20, help="trivial 2-rank tests per harness (default 20)")
    args = ap.parse_args()
    n = args.tests
    with tempfile.TemporaryDirectory(prefix="ddp-bench-") as d:
        plugin, plugin_wall, plugin_line = run(d, "plugin", PLUGIN_TESTS.format(n=n), ["--no-ddp-doctor"])
        methods = "\n".join(f"    def test_{i}(self):\n        self._one()\n" for i in range(n))
        mptc, mptc_wall, mptc_line = run(d, "mptc", MPTC_TESTS.format(methods=methods), ["--no-ddp-doctor"])
    warm = statistics.median(plugin[1:]) if len(plugin) > 1 else plugin[0]
    mptc_med = statistics.median(mptc)
    print(f"ddp-doctor plugin:      {plugin_line}")
    print(f"  first test {plugin[0]:.2f} s (starts the forkserver), warm median {warm:.3f} s, "
          f"mean {statistics.mean(plugin):.3f} s, max warm {max(plugin[1:] or plugin):.3f} s; "
          f"session wall {plugin_wall:.1f} s")
    print(f"MultiProcessTestCase:   {mptc_line}")
    print(f"  median {mptc_med:.3f} s, mean {statistics.mean(mptc):.3f} s; session wall {mptc_wall:.1f} s")
    print(f"ratio (MultiProcessTestCase median / plugin warm median): {mptc_med / warm:.1f}x")
    print(f"ratio (session wall, {n} tests each): {mptc_wall / plugin_wall:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
