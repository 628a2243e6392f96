"""A preflight's world at scale, simulated: every rank's view and final findings as the reporting
rank reads them from the store, with the problems a big job has, for the report's scale test
(tests/report/test_report_at_scale.py) and its timing (bench/report_scale.py).

- :func:`build_world`: `nodes` x `per_node` ranks (512 x 8 = 4,096 by default), each view made
  by the real view builder (rank_view.collect_view) and set to its rank, host and GPU; each rank's
  final findings made by the real checks' entries (Check.finding) and passed through JSON, as they
  travel;
- :func:`reporting_rank`: what rank 0 does with them (one_rank.py's _report): the cross_rank stage,
  build_report, render_text, each timed.

The problems (Problems, placed by problems_for) scale with the world: one node on other library
builds, a forgotten set_device on three nodes, a few ranks on another script, an NCCL variable
with a value of its own on each node, a warning every rank gives alike, one every node gives with
its own evidence, one with its own message (a leftover process's pid) on 200 of 512 nodes, a few
ranks lost after they checked in.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from ddp_doctor import check_runner
from ddp_doctor import checks as catalogue
from ddp_doctor.checks import internal as events
from ddp_doctor.findings import Finding, Problem
from ddp_doctor.preflight_ranks.rank_view import collect_view
from ddp_doctor.report import build as reportlib
from ddp_doctor.report.render import render_text
from helpers.context import make_ctx, torchrun_env

GIB, MIB = 1 << 30, 1 << 20
VERSIONS = {"python": "3.11.7", "torch": "2.13.0+cu128", "cuda": "12.8", "nccl": "2.27.3",
            "transformers": "5.0.0", "accelerate": "1.10.0", "numpy": "2.4.6", "ddp_doctor": "0.1.0"}
OLD_IMAGE = {"torch": "2.12.1+cu126", "cuda": "12.6", "nccl": "2.26.2"}  # one node's other image
SCRIPT = {"path": "/fsx/code/train.py", "sha256": "5e" * 32}
STALE_SCRIPT = {"path": "/fsx/code/train.py", "sha256": "a7" * 32}


@dataclass
class Problems:
    """Where each problem is, for a world of `nodes` nodes (scaled down for a small world)."""

    old_image_node: int
    no_set_device_nodes: tuple[int, ...]  # local rank 5 left on cuda:0 (DDP701)
    stale_script_ranks: tuple[int, ...]  # DDP705
    lost_ranks: tuple[int, ...]  # DDP003: checked in, sent no final findings
    leftover_nodes: range  # a leftover process on GPU 0, its own pid per node (DDP505)


def problems_for(nodes: int, per_node: int) -> Problems:
    n = nodes * per_node
    return Problems(
        old_image_node=min(137, nodes - 1),
        no_set_device_nodes=tuple(sorted({min(x, nodes - 1) for x in (21, 300, 411)})),
        stale_script_ranks=tuple(sorted({min(x, n - 1) for x in (77, 1500, 2222, 3001, n - 1)})),
        lost_ranks=tuple(sorted({min(x, n - 1) for x in (5, 900, 2001)})),
        leftover_nodes=range(nodes // 5, nodes // 5 + max(1, nodes * 200 // 512)),
    )


@dataclass
class World:
    ctx: Any  # the reporting rank's RankContext
    views: dict[int, dict[str, Any]]  # rank -> its view, every rank that checked in
    finals: dict[int, list[dict[str, Any]]]  # rank -> its final findings, as JSON dicts
    lost: tuple[int, ...]  # ranks that checked in but sent no final findings
    problems: Problems


def host_name(node: int) -> str:
    return f"ip-10-1-{node // 250}-{node % 250 + 4}"


def gpu_uuid(node: int, gpu: int) -> str:
    return f"GPU-{node:08x}-{gpu:04x}-4e1a-9c3b-{node * 8 + gpu:012x}"


def _finding(check_id: str, rank: int, problem: Problem, t: float) -> dict[str, Any]:
    """A rank's finding as the runner makes it and the store carries it (JSON)."""
    f = catalogue.get(check_id).finding(problem, rank)
    f.time = t
    return json.loads(json.dumps(f.to_dict()))


def build_world(nodes: int = 512, per_node: int = 8, *, problems: bool = True) -> World:
    """Every rank's view and final findings; `problems=False`: a healthy world."""
    n = nodes * per_node
    where = problems_for(nodes, per_node)
    ctx = make_ctx(torchrun_env(rank=0, world_size=n, local_world_size=per_node), backend="nccl",
                   hostname=host_name(0))
    template = collect_view(ctx)
    t0 = 1_790_000_000.0
    views: dict[int, dict[str, Any]] = {}
    finals: dict[int, list[dict[str, Any]]] = {}
    for r in range(n):
        node, lr = divmod(r, per_node)
        gpu = lr
        view = dict(template)
        view.update({
            "rank": r, "local_rank": lr, "node_rank": node, "world_size": n, "local_world_size": per_node,
            "hostname": host_name(node), "pid": 20_000 + lr * 7, "time": t0 + r * 1e-4,
            "versions": dict(VERSIONS), "entry_script": dict(SCRIPT),
            "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"[: 2 * per_node - 1], "FI_EFA_USE_DEVICE_RDMA": "1",
                    "FI_PROVIDER": "efa", "NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "^docker,ens",
                    "OMP_NUM_THREADS": "1"},
        })
        found: list[dict[str, Any]] = []
        if problems:
            if node == where.old_image_node:
                view["versions"].update(OLD_IMAGE)
            if node in where.no_set_device_nodes and lr == min(5, per_node - 1):
                gpu = 0
            if r in where.stale_script_ranks:
                view["entry_script"] = dict(STALE_SCRIPT)
            # a per-node file name (NCCL expands %h itself; this job wrote the host in)
            view["env"]["NCCL_TOPO_DUMP_FILE"] = f"/fsx/topo/{host_name(node)}.xml"
            found += _rank_findings(r, node, lr, per_node, where, t0 + 1.0 + r * 1e-4)
        view["device"], view["device_uuid"] = f"cuda:{gpu}", gpu_uuid(node, gpu)
        views[r] = view
        finals[r] = found
    for r in where.lost_ranks if problems else ():
        del finals[r]
    return World(ctx, views, finals, where.lost_ranks if problems else (), where)


def _rank_findings(r: int, node: int, lr: int, per_node: int, where: Problems, t: float) -> list[dict[str, Any]]:
    """One rank's final findings, as its local and group checks would give them."""
    out = [
        # every rank, alike: the exclusion list leaves NCCL the loopback only (DDP302)
        _finding("DDP302", r, Problem(
            message="NCCL_SOCKET_IFNAME='^docker,ens' leaves only the loopback interface 'lo' of lo, "
                    "docker0, ens5; ranks on other nodes cannot reach this one through it.",
            evidence={"value": "^docker,ens", "interfaces": ["lo", "docker0", "ens5"], "left": ["lo"]}), t),
        # every rank: its GPU at the software power cap (info), the message names the GPU
        _finding("DDP508", r, Problem(
            message=f"GPU {lr}: clocks held at the software power cap", severity="info",
            hint="Normal under full load; if it shows on an idle GPU, check the power limit "
                 "(`nvidia-smi -q -d POWER`).",
            evidence={"gpu": f"GPU {lr}", "mask": 4, "reasons": ["sw_power_cap"]}), t),
    ]
    if lr == 0:  # the host checks run on each node's local rank 0
        # 2 GiB short of the default 1 GiB a rank, the same GiB on every node, its own bytes
        gib = max(per_node - 2, 0.5)
        out.append(_finding("DDP601", r, Problem(
            message=f"{gib:.1f} GiB of 1007.6 GiB RAM available for {per_node} rank(s); expected at least "
                    f"{per_node:.1f} GiB",
            evidence={"available_bytes": int(gib * GIB) + node * 4099, "total_bytes": 1_081_900_000_000,
                      "ranks": per_node, "min_bytes": per_node * GIB}), t))
        if node in where.leftover_nodes:  # a process of an earlier job still on GPU 0: its own pid
            pid = 40_000 + node * 37
            out.append(_finding("DDP505", r, Problem(
                message=f"GPU 0: 2048 MiB of 81559 MiB already in use (limit 1024 MiB): pid {pid} (2048 MiB)",
                evidence={"gpu": "GPU 0", "used_mib": 2048, "total_mib": 81559,
                          "processes": [{"pid": pid, "used_bytes": 2048 * MIB}]}), t))
    return out


@dataclass
class Verdict:
    report: dict[str, Any]
    text: str
    seconds: dict[str, float]  # cross_rank, build_report, render_text


def reporting_rank(world: World) -> Verdict:
    """What the reporting rank does once it has every view and final findings (one_rank.py's
    _report): the lost ranks' DDP003, the cross_rank checks, the merged report, its text."""
    findings = [Finding.from_dict(d) for r in sorted(world.finals) for d in world.finals[r]]
    for r in world.lost:
        lost = events.checked_in_rank_lost(r, 60.0)
        lost.time = 1_790_000_100.0
        findings.append(lost)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    findings += check_runner.run_stage("cross_rank", (world.ctx, world.views), 0)
    seconds["cross_rank"] = time.perf_counter() - start
    start = time.perf_counter()
    report = reportlib.build_report(world=reportlib.world_of(world.ctx),
                                    ranks=[reportlib.rank_entry(v) for v in world.views.values()],
                                    findings=findings)
    seconds["build_report"] = time.perf_counter() - start
    start = time.perf_counter()
    text = render_text(report, report_path="/fsx/runs/ddp-doctor-report.json")
    seconds["render_text"] = time.perf_counter() - start
    return Verdict(report, text, seconds)
