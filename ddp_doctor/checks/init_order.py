"""Rules over the in-training probe records about the order a script sets up DDP in (DDP860-DDP866):
a Trainer given a DDP model, DDP before init_process_group, the NCCL device not following
LOCAL_RANK or set_device never called, ranks sharing a GPU, the process group initialised twice,
a fork after CUDA was initialised.

Pure functions: records in, findings out (`init_order` per rank, `shared_gpu` across the ranks).
"""
from __future__ import annotations

import re
from typing import Any

from ddp_doctor.checks.probe_records import finding_at, where
from ddp_doctor.findings import Finding, format_ranks
from ddp_doctor.registry import declare

TRAINER_GOT_DDP = declare(
    "DDP860", category="init_order", severity="error", title="Trainer was given a model already wrapped in DDP",
    doc="""
    What: transformers.Trainer was constructed with a model that is already a
    DistributedDataParallel.
    Why: Trainer (through accelerate) wraps the model in DDP itself; a model wrapped by hand is
    wrapped twice or not unwrapped for saving and loss computation, and recipes that do this fail
    with empty batches or gradients synchronised twice.
    Fix: Pass the plain model to Trainer; it initialises the process group and wraps the model when
    launched with torchrun or on SageMaker.
    """)

DDP_BEFORE_PG = declare(
    "DDP861", category="init_order", severity="error", title="DDP built before the process group",
    doc="""
    What: DistributedDataParallel was constructed while no default process group existed.
    Why: DDP broadcasts the parameters of rank 0 and registers gradient hooks on the process group
    at construction; without one it cannot, and the constructor fails.
    Fix: Call dist.init_process_group(...) (after torch.cuda.set_device(local_rank) on GPUs) before
    wrapping the model.
    """)

WRONG_DEVICE = declare(
    "DDP862", category="init_order", severity="error", title="DDP device does not match LOCAL_RANK",
    doc="""
    What: With the NCCL backend, the device DDP runs the model on (device_ids or the module's
    device) is not the GPU that LOCAL_RANK selects.
    Why: Ranks on one host then share a GPU or use a GPU another rank owns: NCCL fails ("Duplicate
    GPU detected") or the job runs out of memory on one device while others idle.
    Fix: torch.cuda.set_device(int(os.environ["LOCAL_RANK"])) before init_process_group, move the
    model to that device and pass device_ids=[local_rank].
    """)

SHARED_GPU = declare(
    "DDP863", category="init_order", severity="error", title="Several ranks on the same GPU",
    doc="""
    What: Two or more ranks on one host run their model on the same CUDA device, typically cuda:0
    because torch.cuda.set_device was never called.
    Why: Every rank lands on cuda:0: NCCL reports duplicate GPUs or hangs, and memory runs out.
    Fix: Call torch.cuda.set_device(local_rank) first thing after reading LOCAL_RANK, and use
    torch.device("cuda", local_rank) for the model and data.
    """)

NO_SET_DEVICE = declare(
    "DDP866", category="init_order", severity="warning", title="NCCL without torch.cuda.set_device",
    doc="""
    What: With the NCCL backend and several GPUs, a rank with LOCAL_RANK > 0 built DDP while its
    current CUDA device was still cuda:0 (torch.cuda.set_device was never called).
    Why: DDP itself uses device_ids, but everything else that uses "the current device" (barrier,
    all_reduce on new tensors, NCCL's communicator setup, torch.cuda.* calls) lands on cuda:0 on every
    rank: a hang, "Duplicate GPU detected" or memory used on GPU 0 by all ranks.
    Fix: torch.cuda.set_device(int(os.environ["LOCAL_RANK"])) first thing, before init_process_group.
    """)

INIT_TWICE = declare(
    "DDP864", category="init_order", severity="error", title="Default process group initialised twice",
    doc="""
    What: init_process_group was called while a default process group already existed; the finding
    names both call sites.
    Why: Typically both the script and a library (Trainer, accelerate, Lightning) initialise the
    group; torch refuses the second call.
    Fix: Initialise once: guard with `if not dist.is_initialized():`, or leave it to the library.
    """)

FORK_AFTER_CUDA = declare(
    "DDP865", category="init_order", severity="error", title="CUDA initialised before forking ranks",
    doc="""
    What: The process forked new processes (not DataLoader workers) after CUDA was initialised in it.
    Why: A CUDA context does not survive fork: the children fail with "Cannot re-initialize CUDA in
    forked subprocess" or hang.
    Fix: Start ranks with torchrun or torch.multiprocessing.spawn (start method "spawn"), and do not
    touch CUDA in the parent before starting them.
    """)


def _device_index(text: Any) -> int | None:
    m = re.search(r"(\d+)$", str(text)) if text is not None else None
    return int(m.group(1)) if m else None


def init_order(rank: int, rec: dict[str, Any]) -> list[Finding]:
    out = []
    local = rec.get("local_rank")
    for e in rec.get("events", []):
        kind = e.get("kind")
        if kind == "trainer" and e.get("ddp_wrapped"):
            out.append(finding_at(TRAINER_GOT_DDP, (
                f"Trainer was given a DistributedDataParallel-wrapped {e.get('model_class')}{where(e)}"),
                rank=rank, evidence={"site": e.get("site")}, at=e["t"]))
        elif kind == "ddp" and not e.get("pg_initialized"):
            out.append(finding_at(DDP_BEFORE_PG, (
                f"DistributedDataParallel({e.get('module_class')}) was built{where(e)} before "
                f"init_process_group"), rank=rank, evidence={"site": e.get("site")}, at=e["t"]))
        elif kind == "ddp" and e.get("backend") == "nccl" and local is not None:
            count = int(e.get("device_count") or 0)
            want = local if count > 1 else 0
            ids = e.get("device_ids") or []
            got = _device_index(ids[0]) if ids else (
                _device_index(e.get("module_device")) if str(e.get("module_device", "")).startswith("cuda") else None)
            if (count > 1 and local and not e.get("set_device_called") and e.get("current_device") in (0, None)
                    and got == want):
                out.append(finding_at(NO_SET_DEVICE, (
                    f"LOCAL_RANK={local}: DDP built{where(e)} with the current CUDA device cuda:0 "
                    f"(torch.cuda.set_device never called)"), rank=rank,
                    evidence={"local_rank": local, "device_ids": ids}, at=e["t"]))
            if got is not None and count > 1 and got != want:
                what = f"device_ids={ids}" if ids else f"a model on {e.get('module_device')}"
                out.append(finding_at(WRONG_DEVICE, (
                    f"rank {rank} (LOCAL_RANK={local}) built DDP with {what}{where(e)}, not cuda:{want}; "
                    f"torch.cuda.set_device was {'called' if e.get('set_device_called') else 'never called'}"),
                    rank=rank, evidence={"device_ids": ids, "local_rank": local,
                                         "module_device": e.get("module_device")}, at=e["t"]))
        elif kind == "init_process_group" and e.get("already_initialized"):
            first = e.get("previous_site")
            out.append(finding_at(INIT_TWICE, (
                f"init_process_group(backend={e.get('backend')}) called{where(e)} while the "
                f"default process group already existed" + (f" (created at {first})" if first else "")),
                rank=rank, evidence={"site": e.get("site"), "first_site": first}, at=e["t"]))
        elif kind == "fork_after_cuda":
            out.append(finding_at(FORK_AFTER_CUDA, (
                f"the process forked{where(e)} after initialising CUDA"),
                rank=rank, evidence={"site": e.get("site")}, at=e["t"]))
    return out


def shared_gpu(ranks: dict[int, dict[str, Any]]) -> list[Finding]:
    """Ranks of one host whose DDP model sits on the same CUDA device."""
    seen: dict[tuple[str, str], list[int]] = {}
    at: dict[tuple[str, str], float] = {}
    for r, rec in ranks.items():
        for e in rec.get("events", []):
            dev = str(e.get("module_device") or "")
            if e.get("kind") == "ddp" and dev.startswith("cuda"):
                dev = dev if ":" in dev else f"{dev}:{e.get('current_device') or 0}"
                key = (str(rec.get("host")), dev)
                seen.setdefault(key, []).append(r)
                at[key] = min(at.get(key, e["t"]), e["t"])
                break
    out = []
    for (host, dev), rs in sorted(seen.items()):
        if len(rs) > 1:
            out.append(finding_at(SHARED_GPU, (
                f"ranks {format_ranks(rs)} on {host} all run their DDP model on {dev}"),
                rank=None, ranks=sorted(rs), evidence={"host": host, "device": dev}, at=at[(host, dev)]))
    return out
