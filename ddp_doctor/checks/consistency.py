"""Cross-rank consistency: every rank's view (ddp_doctor.preflight_ranks.rank_view.collect_view) compared on the
reporting rank. Versions, GPUs, rank layout, code and communication settings must agree.

IDs DDP700-DDP799, stage "cross_rank": each check takes (ctx, views), views mapping rank -> view
for every rank that arrived.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Iterable, Iterator, Mapping, TypeVar

from ddp_doctor.context import RankContext
from ddp_doctor.facts.env_values import visible_devices
from ddp_doctor.findings import (
    Problem,
    brief_ranks,  # "0-7, 9", at most 6 runs and how many more
)
from ddp_doctor.findings import (
    format_ranks as format_ranks,  # "0-7, 9"; importable from here as before
)
from ddp_doctor.registry import check

Views = Mapping[int, Mapping[str, Any]]
K = TypeVar("K", bound=Hashable)  # the value ranks are grouped by

# Libraries that must match; a mismatch in the last four is a warning, not an error.
VERSION_KEYS = ("torch", "cuda", "nccl", "python", "transformers", "accelerate", "numpy", "ddp_doctor")
SOFT_VERSION_KEYS = frozenset({"transformers", "accelerate", "numpy", "ddp_doctor"})
# Variables that legitimately differ per rank on some launchers (one GPU per task, thread pinning).
INFO_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"})
MAX_GROUPS_SHOWN = 5
MAX_HOSTS_SHOWN = 3
# Evidence at 4,096 ranks stays a few KB a finding: the largest groups (the reference and the odd
# ones most ranks share) and a few ranks' devices are kept, with a count of the rest; the finding's
# `ranks` still names every odd rank.
MAX_GROUPS_KEPT = 16
MAX_DEVICES_KEPT = 16
MAX_DEVICES_SHOWN = 8


# ---------------------------------------------------------------------------------------------
# Formatting helpers

def ranks_phrase(ranks: Iterable[int]) -> str:
    """"rank 3" or "ranks 0-7, 9"; scattered ranks at most 6 runs ("ranks 0, 8, 16, 24, 32, 40 and
    506 more rank(s) in 506 runs"), so a message stays a line long at any world size."""
    rs = sorted(set(ranks))
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {brief_ranks(rs)}"


def host_label(view: Mapping[str, Any]) -> str:
    """The name users know the host by: SageMaker's (algo-1) when there is one."""
    return str(view.get("sm_host") or view.get("hostname") or "?")


def host_key(view: Mapping[str, Any]) -> tuple[Any, Any]:
    # Both names: containers on different hosts may share a socket host name.
    return (view.get("hostname"), view.get("sm_host"))


def hosts_phrase(views: Views, ranks: Iterable[int]) -> str:
    """"(algo-1)" / "(algo-1, algo-2, algo-3 +2 more)" for the hosts of `ranks`."""
    names = sorted({host_label(views[r]) for r in ranks if r in views})
    shown = ", ".join(names[:MAX_HOSTS_SHOWN])
    more = f" +{len(names) - MAX_HOSTS_SHOWN} more" if len(names) > MAX_HOSTS_SHOWN else ""
    return f"({shown}{more})"


def group_ranks(views: Views, key: Callable[[Mapping[str, Any]], K]) -> list[tuple[K, list[int]]]:
    """(value, ranks) groups, the largest first (ties: the group holding the lowest rank), so the
    first group is the reference and the others are the odd ones out."""
    groups: dict[K, list[int]] = {}
    for r in sorted(views):
        groups.setdefault(key(views[r]), []).append(r)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))


def _read(*path: str) -> Callable[[Mapping[str, Any]], Any]:
    """A group_ranks key: the value at `path` in a view ("versions", "torch"), None where a step is missing."""
    def key(view: Mapping[str, Any]) -> Any:
        value: Any = view
        for step in path:
            value = (value or {}).get(step)
        return value
    return key


def describe_groups(views: Views, groups: list[tuple[K, list[int]]], label: Callable[[K], str]) -> str:
    """"2.13.0 on ranks 0-7 (algo-1), 2.12.1 on ranks 8-15 (algo-2)"."""
    parts = [f"{label(v)} on {ranks_phrase(rs)} {hosts_phrase(views, rs)}" for v, rs in groups[:MAX_GROUPS_SHOWN]]
    if len(groups) > MAX_GROUPS_SHOWN:
        parts.append(f"{len(groups) - MAX_GROUPS_SHOWN} more values")
    return ", ".join(parts)


def odd_ranks(groups: list[tuple[Hashable, list[int]]]) -> tuple[int, ...]:
    """Every rank outside the reference (largest) group."""
    return tuple(sorted(r for _, rs in groups[1:] for r in rs))


def _evidence(groups: list[tuple[Hashable, list[int]]]) -> dict[str, Any]:
    """{"groups": [{"value", "ranks"}, ...]}: the MAX_GROUPS_KEPT largest groups, and
    "groups_left_out" (how many smaller groups were not listed) when there were more."""
    out: dict[str, Any] = {"groups": [{"value": v, "ranks": rs} for v, rs in groups[:MAX_GROUPS_KEPT]]}
    if len(groups) > MAX_GROUPS_KEPT:
        out["groups_left_out"] = len(groups) - MAX_GROUPS_KEPT
    return out


def _devices(views: Views, ranks: list[int]) -> tuple[str, dict[str, Any]]:
    """"168: cuda:0, 173: cuda:0" for a message (MAX_DEVICES_SHOWN, then how many more) and
    {"devices": {rank: device}} for the evidence (MAX_DEVICES_KEPT, then "devices_left_out")."""
    shown = ", ".join(f"{r}: {views[r].get('device')}" for r in ranks[:MAX_DEVICES_SHOWN])
    if len(ranks) > MAX_DEVICES_SHOWN:
        shown += f" and {len(ranks) - MAX_DEVICES_SHOWN} more"
    evidence: dict[str, Any] = {"devices": {str(r): views[r].get("device") for r in ranks[:MAX_DEVICES_KEPT]}}
    if len(ranks) > MAX_DEVICES_KEPT:
        evidence["devices_left_out"] = len(ranks) - MAX_DEVICES_KEPT
    return shown, evidence


# ---------------------------------------------------------------------------------------------
# Checks

@check("DDP700", category="consistency", severity="error", title="Library versions differ between ranks",
       stage="cross_rank", severities=("warning",))
def versions_agree(ctx: RankContext, views: Views) -> Iterator[Problem]:
    """
    What: Python, torch, its CUDA and NCCL, transformers, accelerate, numpy and ddp-doctor have
    the same version on every rank.
    Why: Ranks with different torch or NCCL builds exchange messages they do not agree on: the
    job hangs or crashes in the first collective, or silently computes with different kernels.
    Nodes built from different images (or a `pip install` that ran on one node only) cause it.
    Fix: Pin the versions in requirements.txt or the container image and use the same image on
    every node.
    Severity: error for libraries whose versions must agree (torch, CUDA, NCCL, Python); a warning for
    transformers, accelerate, numpy and ddp_doctor, where a difference rarely breaks the job.
    """
    for lib in VERSION_KEYS:
        groups = group_ranks(views, _read("versions", lib))
        if len(groups) < 2:
            continue
        yield Problem(
            message=f"{lib} differs between ranks: "
                    + describe_groups(views, groups, lambda x: "not installed" if x is None else str(x)),
            severity="warning" if lib in SOFT_VERSION_KEYS else None,
            ranks=odd_ranks(groups),
            evidence={"library": lib, **_evidence(groups)},
        )


def _gpu_key(view: Mapping[str, Any]) -> Hashable:
    """Which GPU a rank uses, as comparable across the ranks of its host; None for a CPU rank.
    The device UUID when known; else the physical GPU its cuda:N stands for through its
    CUDA_VISIBLE_DEVICES (cuda:0 under CUDA_VISIBLE_DEVICES=1 is GPU 1), or N when that is unset."""
    device = str(view.get("device") or "cpu")
    if not device.startswith("cuda"):
        return None
    uuid = view.get("device_uuid")
    if uuid:
        return (host_key(view), "uuid", uuid)
    index = device.partition(":")[2] or "0"
    visible = (view.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return (host_key(view), "gpu", index)
    entries = visible_devices(str(visible)) or []
    if index.isdigit() and int(index) < len(entries):
        return (host_key(view), "gpu", entries[int(index)])
    return (host_key(view), "visible", str(visible), index)  # not resolvable: equal only when all is equal


def _gpu_phrase(views: Views, key: Any, ranks: list[int]) -> str:
    """"GPU GPU-1234", "cuda:0", or "GPU 1" when the ranks reach it through CUDA_VISIBLE_DEVICES."""
    first = views[ranks[0]]
    if key[1] == "uuid":
        return f"GPU {first.get('device_uuid')}"
    through_visible = any("CUDA_VISIBLE_DEVICES" in (views[r].get("env") or {}) for r in ranks)
    if key[1] == "gpu" and through_visible:
        return f"GPU {key[2]} (through CUDA_VISIBLE_DEVICES)"
    return str(first.get("device"))


def _one_local_rank(views: Views, ranks: list[int]) -> bool:
    """All of `ranks` have one known LOCAL_RANK."""
    local = {views[r].get("local_rank") for r in ranks}
    return len(local) == 1 and None not in local


@check("DDP701", category="consistency", severity="error", title="Two ranks use the same GPU",
       stage="cross_rank")
def gpus_unique(ctx: RankContext, views: Views) -> Iterator[Problem]:
    """
    What: No two ranks on one host use the same GPU (same device UUID, or, when the UUID is
    unknown, the same cuda:N under the same CUDA_VISIBLE_DEVICES).
    Why: Ranks that share a GPU run out of memory or run at a fraction of the speed, and NCCL
    refuses ("Duplicate GPU detected"). The usual cause is code that never calls
    torch.cuda.set_device, so every rank lands on cuda:0.
    Fix: Call torch.cuda.set_device(int(os.environ["LOCAL_RANK"])) before init_process_group, and
    wrap the model with DistributedDataParallel(model, device_ids=[local_rank]).
    """
    for key, ranks in group_ranks(views, _gpu_key):
        if key is None or len(ranks) < 2 or _one_local_rank(views, ranks):
            continue  # one LOCAL_RANK for all: two launchers on one host, DDP702's finding
        first = views[ranks[0]]
        devices, kept = _devices(views, ranks)
        yield Problem(
            message=f"{ranks_phrase(ranks)} on host {host_label(first)} all use {_gpu_phrase(views, key, ranks)} "
                    f"(rank: device {devices}).",
            ranks=tuple(ranks),
            evidence={"host": host_label(first), "device_uuid": first.get("device_uuid"), **kept})


@check("DDP702", category="consistency", severity="error", title="Two ranks claim one local rank on a host",
       stage="cross_rank", severities=("warning",))
def local_ranks_unique(ctx: RankContext, views: Views) -> Iterator[Problem]:
    """
    What: Ranks on one host that have the same LOCAL_RANK do not use the same GPU, and one
    launcher (one node rank) gives each of its ranks its own LOCAL_RANK. Ranks of two launchers
    on one host that share nothing (gloo ranks on CPU, or GPUs kept apart by CUDA_VISIBLE_DEVICES
    or by their UUIDs) are fine: that is how several nodes are tried on one machine.
    Why: Ranks that share a local rank pick the same GPU (cuda:LOCAL_RANK): they run out of memory
    or NCCL refuses ("Duplicate GPU detected"). It means two launchers started on one host without
    their own GPUs, or the launcher's variables were overwritten; then per-node work guarded by
    LOCAL_RANK == 0 (downloads, caches) also runs twice.
    Fix: Start one launcher per node (torchrun --nnodes N --node-rank K on each), or give each
    launcher on a shared host its own GPUs (CUDA_VISIBLE_DEVICES); do not set LOCAL_RANK in the
    job's environment yourself.
    Severity: error when the ranks use the same GPU; a warning when CPU ranks (or ranks on distinct
    GPUs) of one launcher share a LOCAL_RANK.
    """
    groups = group_ranks(views, lambda v: (host_key(v), v.get("local_rank")))
    for (_hk, local_rank), ranks in groups:
        if local_rank is None or len(ranks) < 2:
            continue
        host = host_label(views[ranks[0]])
        sharing: set[int] = set()  # ranks that share a GPU with another of this local rank
        for key, shared in group_ranks({r: views[r] for r in ranks}, _gpu_key):
            if key is None or len(shared) < 2:
                continue
            sharing.update(shared)
            yield Problem(
                message=f"{ranks_phrase(shared)} on host {host} all have LOCAL_RANK={local_rank} and use "
                        f"{_gpu_phrase(views, key, shared)}.",
                ranks=tuple(shared),
                evidence={"host": host, "local_rank": local_rank, "shared": "gpu",
                          "device_uuid": views[shared[0]].get("device_uuid"), **_devices(views, shared)[1]})
        apart = [r for r in ranks if r not in sharing]
        for node_rank, same_launcher in group_ranks({r: views[r] for r in apart}, lambda v: v.get("node_rank")):
            if node_rank is None or len(same_launcher) < 2:
                continue  # ranks of different launchers (node ranks) that share nothing: fine
            yield Problem(
                message=f"{ranks_phrase(same_launcher)} on host {host} (node rank {node_rank}) all have "
                        f"LOCAL_RANK={local_rank}; they share no GPU, but per-node work guarded by "
                        f"LOCAL_RANK == 0 runs on each of them.",
                severity="warning", ranks=tuple(same_launcher),
                evidence={"host": host, "local_rank": local_rank, "node_rank": node_rank, "shared": None})


def _agreed(views: Views, field: str) -> Any:
    values = {views[r].get(field) for r in views}
    return values.pop() if len(values) == 1 else None


def _complete(views: Views) -> bool:
    """Did every rank of the world arrive? Layout gaps are only meaningful then."""
    ws = _agreed(views, "world_size")
    return isinstance(ws, int) and set(views) == set(range(ws))


def _by_host(views: Views) -> dict[tuple[Any, Any], list[int]]:
    out: dict[tuple[Any, Any], list[int]] = {}
    for r in sorted(views):
        out.setdefault(host_key(views[r]), []).append(r)
    return out


@check("DDP703", category="consistency", severity="error", title="Local ranks on a host are not 0..n-1",
       stage="cross_rank")
def local_ranks_contiguous(ctx: RankContext, views: Views) -> Iterator[Problem]:
    """
    What: Once every rank has arrived, the local ranks on each host are exactly 0..n-1, and n
    equals the LOCAL_WORLD_SIZE those ranks report.
    Why: A gap means ranks were placed on hosts differently from what the launcher told them
    (a wrong --nproc-per-node, or a hostfile with a different slot count): GPUs stay idle or
    ranks index GPUs that do not exist.
    Fix: Make --nproc-per-node (or the hostfile's slots) equal the GPUs each node has, the same
    on every node.
    """
    if not _complete(views):
        return
    for _hk, ranks in _by_host(views).items():
        local = sorted(lr for r in ranks if (lr := views[r].get("local_rank")) is not None)
        if len(local) != len(ranks) or len(set(local)) != len(local):
            continue  # unknown local ranks, or duplicates (DDP702 judges those)
        host = host_label(views[ranks[0]])
        if local != list(range(len(ranks))):
            yield Problem(
                message=f"host {host} has {ranks_phrase(ranks)} with local ranks "
                        f"{', '.join(map(str, local))}; expected 0-{len(ranks) - 1}.",
                ranks=tuple(ranks), evidence={"host": host, "local_ranks": local})
            continue
        lws = {views[r].get("local_world_size") for r in ranks} - {None}
        if len(lws) == 1 and (n := lws.pop()) != len(ranks):
            yield Problem(
                message=f"host {host} runs {len(ranks)} rank(s) ({ranks_phrase(ranks)}) but they report "
                        f"LOCAL_WORLD_SIZE={n}.",
                ranks=tuple(ranks), evidence={"host": host, "ranks": ranks, "local_world_size": n})


LAYOUT_FIELDS = (("world_size", "WORLD_SIZE"), ("backend", "backend"), ("launcher", "launcher"))


@check("DDP704", category="consistency", severity="error", title="Ranks disagree on the job layout",
       stage="cross_rank", severities=("warning",))
def layout_agrees(ctx: RankContext, views: Views) -> Iterator[Problem]:
    """
    What: Every rank reports the same WORLD_SIZE, backend and launcher, and the ranks on one host
    the same LOCAL_WORLD_SIZE (across hosts a different LOCAL_WORLD_SIZE is a warning).
    Why: Ranks started with different world sizes wait for peers that never come; mixing
    launchers or backends means the nodes were started by different commands.
    Fix: Start every node with the same launcher command and options; only --node-rank differs.
    Severity: error when ranks on one host disagree; a warning when whole hosts run different
    numbers of ranks (works with torchrun, but most schedulers assume even nodes).
    """
    for field, name in LAYOUT_FIELDS:
        groups = group_ranks(views, _read(field))
        if len(groups) > 1:
            yield Problem(
                message=f"{name} differs between ranks: " + describe_groups(views, groups, _value_label),
                ranks=odd_ranks(groups), evidence={"field": field, **_evidence(groups)})
    per_host = {hk: group_ranks({r: views[r] for r in rs}, lambda v: v.get("local_world_size"))
                for hk, rs in _by_host(views).items()}
    for _hk, groups in per_host.items():
        if len(groups) > 1:
            yield Problem(
                message="LOCAL_WORLD_SIZE differs between ranks on one host: "
                        + describe_groups(views, groups, _value_label),
                ranks=odd_ranks(groups), evidence={"field": "local_world_size", **_evidence(groups)})
    if all(len(g) == 1 for g in per_host.values()) and len(per_host) > 1:
        groups = group_ranks(views, lambda v: v.get("local_world_size"))
        if len(groups) > 1:
            yield Problem(
                message="LOCAL_WORLD_SIZE differs between hosts: " + describe_groups(views, groups, _value_label),
                severity="warning", ranks=odd_ranks(groups),
                hint="Uneven nodes work with torchrun but SageMaker and most schedules assume the same "
                     "number of processes per node; check --nproc-per-node on each node.",
                evidence={"field": "local_world_size", **_evidence(groups)})


def _value_label(value: Hashable) -> str:
    return "unset" if value is None else repr(value) if isinstance(value, str) else str(value)


def _script_key(view: Mapping[str, Any]) -> Hashable:
    script = view.get("entry_script")
    return script.get("sha256") if isinstance(script, Mapping) else None


@check("DDP705", category="consistency", severity="error", title="Nodes run different code",
       stage="cross_rank")
def same_code(ctx: RankContext, views: Views) -> Iterator[Problem]:
    """
    What: The training script has the same SHA-256 on every rank.
    Why: Nodes that run different code (an edited file synced to one node, a stale checkout) build
    different models or call collectives in a different order: DDP fails at construction or the
    job hangs in a collective that only some ranks reach.
    Fix: Ship the code to every node from one source (the same image, a shared file system, or
    SageMaker's source_dir) and re-launch.
    """
    if not any(_script_key(views[r]) for r in views):
        return
    groups = group_ranks(views, _script_key)
    if len(groups) < 2:
        return

    def label(sha: Hashable) -> str:
        if sha is None:
            return "no readable script"
        path = next(views[r]["entry_script"].get("path") for r in views if _script_key(views[r]) == sha)
        return f"sha256 {str(sha)[:12]} ({path})"

    yield Problem(
        message="The training script differs between ranks: " + describe_groups(views, groups, label),
        ranks=odd_ranks(groups), evidence=_evidence(groups))


@check("DDP706", category="consistency", severity="warning",
       title="Communication settings differ between ranks", stage="cross_rank", severities=("info",))
def comm_env_agrees(ctx: RankContext, views: Views) -> Iterator[Problem]:
    """
    What: The NCCL_*, FI_*, GLOO_*, TORCH_NCCL_*, SMDATAPARALLEL_* variables (and, as information,
    CUDA_VISIBLE_DEVICES and OMP_NUM_THREADS) have the same value on every rank, as the user set
    them: what ddp-doctor sets for its own ranks where the user did not (NCCL's log and flight
    recorder dumps in each node's run directory) is not compared.
    Why: NCCL settings must match across ranks: one node with NCCL_PROTO=simple or
    NCCL_IB_DISABLE=1 and another without negotiate different protocols and may hang or run
    slowly. A variable exported in one node's shell profile but not another's is the usual cause.
    Fix: Set these variables in the launch command or the job's environment, the same for every
    node, not in per-node shell profiles.
    Severity: a warning for most variables; info for CUDA_VISIBLE_DEVICES and OMP_NUM_THREADS, which
    legitimately differ per rank on some launchers.
    """
    names = sorted({k for r in views for k in (views[r].get("env") or {})})
    for name in names:
        if name.endswith("RANK"):
            continue  # per-rank by design (SMDATAPARALLEL_LOCAL_RANK)
        groups = group_ranks(views, _read("env", name))
        if len(groups) < 2:
            continue
        yield Problem(
            message=f"{name} differs between ranks: " + describe_groups(views, groups, _value_label),
            severity="info" if name in INFO_ENV else None, ranks=odd_ranks(groups),
            evidence={"variable": name, **_evidence(groups)})
