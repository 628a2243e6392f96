"""Rules over the in-training probe records of all ranks (probes.py): init ordering, sampler
sharding and epochs, parameter consistency, data-loading stragglers, teardown.

Pure functions: records (plain dicts, one per process) in, findings out. Cross-rank rules compare
what each rank recorded; nothing here talks to the ranks.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any, Iterable

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.findings import Finding, format_ranks
from ddp_doctor.registry import declare
from ddp_doctor.training.sampler_check import OVERLAP, SAME_ORDER

NOT_SHARDED = declare(
    "DDP853", category="sampler", severity="warning", title="Training DataLoader is not sharded across ranks",
    doc="""
    What: A map-style DataLoader iterated during training in a world of more than one rank uses a
    sampler that is not distributed-aware (not a DistributedSampler, not sharded by accelerate,
    Trainer or Lightning), and no rank-dependent data was seen.
    Why: Each rank then draws from the whole data set: the job runs, but every epoch is N times
    longer than it should be and ranks may train on the same batches.
    Fix: Pass sampler=DistributedSampler(dataset) (and shuffle=False) to the DataLoader, or let
    Trainer/Accelerate/Lightning build it. If your data set is already sharded per rank, ignore this.
    """)

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

PARAMS_DIVERGED = declare(
    "DDP870", category="consistency", severity="error", title="Parameters differ between ranks",
    doc="""
    What: Check sums of the DDP model's parameters, taken after the first optimizer step and at the
    end, differ between ranks at the same step; the finding names the ranks and parameters.
    Why: DDP keeps replicas identical only if every update goes through it: calling model.module(x)
    (skipping the gradient all-reduce), changing parameters on one rank, or rank-dependent optimizer
    settings let the replicas drift, and the saved model is only rank 0's.
    Fix: Call the DDP-wrapped model for the forward pass, change parameters on every rank alike, and
    keep optimizer settings identical across ranks.
    """)

BUFFERS_DIVERGED = declare(
    "DDP871", category="consistency", severity="warning", title="Buffers differ between ranks",
    doc="""
    What: Model buffers (other than BatchNorm running statistics, which DDP re-broadcasts every
    forward) differ between ranks at the same step.
    Why: Buffers are not averaged by DDP; a buffer changed by rank-local logic drifts silently.
    Fix: Keep broadcast_buffers=True (the default) or update such buffers identically on every rank.
    """)

DATA_STRAGGLER = declare(
    "DDP872", category="consistency", severity="warning", title="One rank waits much longer for data",
    doc="""
    What: One rank's median time to get a training batch from its DataLoader is more than twice
    the others' (and at least 20 ms longer).
    Why: DDP synchronises every step, so the slowest rank's data pipeline sets the pace of all.
    Fix: Look at that rank's data path: its storage, num_workers, a rank-dependent transform, or a
    shard much larger than the others.
    """)

BATCH_SCALING = declare(
    "DDP873", category="consistency", severity="info", title="Effective batch size and learning rate",
    doc="""
    What: The global batch (per-device batch x gradient accumulation x world size) and the learning
    rate the Trainer uses.
    Why: Moving from one GPU to N multiplies the global batch by N; the learning rate usually needs
    scaling (linear or square-root rule) or the per-device batch dividing, or results change.
    Fix: Nothing to fix if intended; otherwise scale the learning rate or the per-device batch.
    """)

NO_DESTROY = declare(
    "DDP880", category="teardown", severity="warning", title="Script ended without destroy_process_group",
    doc="""
    What: The script ended successfully while the default process group it created itself was
    still up (groups made by Trainer/accelerate or Lightning are theirs to manage).
    Why: A process group left alive at exit is torn down in static destructors: NCCL warns or hangs
    at exit, and some launchers wait for ranks that never finish.
    Fix: Call dist.destroy_process_group() at the end of training (in a finally block).
    """)

REL_TOL = 1e-6
ROLLING_STATS = re.compile(r"(^|\.)(running_mean|running_var|num_batches_tracked)$")
STRAGGLER_RATIO, STRAGGLER_MIN_S = 2.0, 0.020


def by_rank(records: Iterable[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """One record per rank: the process that formed the process group as that rank wins over a
    process that only carries the rank in its environment (a spawn parent, a launcher), and a
    rank's own final record over the copy it shared through the store before it ended."""
    out: dict[int, dict[str, Any]] = {}
    for rec in records:
        r = rec.get("rank")
        if r is None:
            continue
        old = out.get(int(r))
        if old is None or _completeness(rec) > _completeness(old):
            out[int(r)] = rec
    return out


def _completeness(rec: dict[str, Any]) -> tuple[bool, int, int, bool]:
    return (bool(rec.get("pg")), int(rec.get("steps") or 0), len(rec.get("loaders") or []), bool(rec.get("ended")))


def probe_findings(records: Iterable[dict[str, Any]], *, failed: bool = False) -> list[Finding]:
    """Every probe finding for one job. `failed`: the job already failed (teardown rules that judge
    a normal ending are skipped)."""
    ranks = by_rank(records)
    out: list[Finding] = []
    for r in sorted(ranks):
        out += init_order(r, ranks[r])
    out += shared_gpu(ranks)
    out += sampler_rules(ranks)
    out += consistency(ranks)
    out += stragglers(ranks)
    out += batch_scaling(ranks)
    if not failed:
        out += teardown(ranks)
    return out


def _finding(entry: Any, message: str, *, rank: int | None, ranks: list[int] | None = None,
             evidence: dict[str, Any] | None = None, phase: str = "training", at: float | None = None
             ) -> Finding:
    f = event_finding(entry, message, rank=rank, ranks=ranks, evidence=evidence, phase=phase)
    if at is not None:
        f.time = at
    return f


def _where(e: dict[str, Any]) -> str:
    return f" at {e['site']}" if e.get("site") else ""


# ------------------------------------------------------------------ init order

def _device_index(text: Any) -> int | None:
    m = re.search(r"(\d+)$", str(text)) if text is not None else None
    return int(m.group(1)) if m else None


def init_order(rank: int, rec: dict[str, Any]) -> list[Finding]:
    out = []
    local = rec.get("local_rank")
    for e in rec.get("events", []):
        kind = e.get("kind")
        if kind == "trainer" and e.get("ddp_wrapped"):
            out.append(_finding(TRAINER_GOT_DDP, (
                f"Trainer was given a DistributedDataParallel-wrapped {e.get('model_class')}{_where(e)}"), rank=rank, evidence={"site": e.get("site")}, at=e["t"]))
        elif kind == "ddp" and not e.get("pg_initialized"):
            out.append(_finding(DDP_BEFORE_PG, (
                f"DistributedDataParallel({e.get('module_class')}) was built{_where(e)} before "
                f"init_process_group"), rank=rank, evidence={"site": e.get("site")}, at=e["t"]))
        elif kind == "ddp" and e.get("backend") == "nccl" and local is not None:
            count = int(e.get("device_count") or 0)
            want = local if count > 1 else 0
            ids = e.get("device_ids") or []
            got = _device_index(ids[0]) if ids else (
                _device_index(e.get("module_device")) if str(e.get("module_device", "")).startswith("cuda") else None)
            if (count > 1 and local and not e.get("set_device_called") and e.get("current_device") in (0, None)
                    and got == want):
                out.append(_finding(NO_SET_DEVICE, (
                    f"LOCAL_RANK={local}: DDP built{_where(e)} with the current CUDA device cuda:0 "
                    f"(torch.cuda.set_device never called)"), rank=rank,
                    evidence={"local_rank": local, "device_ids": ids}, at=e["t"]))
            if got is not None and count > 1 and got != want:
                what = f"device_ids={ids}" if ids else f"a model on {e.get('module_device')}"
                out.append(_finding(WRONG_DEVICE, (
                    f"rank {rank} (LOCAL_RANK={local}) built DDP with {what}{_where(e)}, not cuda:{want}; "
                    f"torch.cuda.set_device was {'called' if e.get('set_device_called') else 'never called'}"),
                    rank=rank, evidence={"device_ids": ids, "local_rank": local,
                                         "module_device": e.get("module_device")}, at=e["t"]))
        elif kind == "init_process_group" and e.get("already_initialized"):
            first = e.get("previous_site")
            out.append(_finding(INIT_TWICE, (
                f"init_process_group(backend={e.get('backend')}) called{_where(e)} while the "
                f"default process group already existed" + (f" (created at {first})" if first else "")),
                rank=rank, evidence={"site": e.get("site"), "first_site": first}, at=e["t"]))
        elif kind == "fork_after_cuda":
            out.append(_finding(FORK_AFTER_CUDA, (
                f"the process forked{_where(e)} after initialising CUDA"),
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
            out.append(_finding(SHARED_GPU, (
                f"ranks {format_ranks(rs)} on {host} all run their DDP model on {dev}"),
                rank=None, ranks=sorted(rs), evidence={"host": host, "device": dev}, at=at[(host, dev)]))
    return out


# ------------------------------------------------------------------ sampler

def _loader_keys(rec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Loaders keyed by where they were made and over what, numbered when made more than once:
    the same key on two ranks is the same loader, even if one rank made an extra one elsewhere."""
    out: dict[str, dict[str, Any]] = {}
    seen: Counter[str] = Counter()
    for ld in rec.get("loaders") or []:
        base = f"{ld.get('site')}|{ld.get('dataset')}|{ld.get('dataset_size')}"
        out[f"{base}#{seen[base]}"] = ld
        seen[base] += 1
    return out


def _overlap(its: dict[int, dict[str, Any]]) -> tuple[int, bool, int]:
    """(samples drawn by more than one rank, data differ by rank, samples compared) over the
    first batches of one epoch on each rank."""
    index_ranks: dict[int, set[int]] = {}
    content: dict[int, dict[int, str]] = {}
    hash_ranks: dict[str, set[int]] = {}
    drawn = 0
    indexed = True
    for r, it in its.items():
        for b, idx in enumerate(it.get("indices") or []):
            hashes = (it.get("hashes") or [])[b] if b < len(it.get("hashes") or []) else None
            if idx is None:
                indexed = False
            for j, i in enumerate(idx or []):
                index_ranks.setdefault(i, set()).add(r)
                drawn += 1
                if hashes and j < len(hashes):
                    content.setdefault(i, {})[r] = hashes[j]
            for h in hashes or []:
                hash_ranks.setdefault(h, set()).add(r)
    if not indexed or not index_ranks:  # an IterableDataset: only the contents say
        shared = sum(len(rs) - 1 for rs in hash_ranks.values() if len(rs) > 1)
        return shared, False, sum(len(rs) for rs in hash_ranks.values())
    shared_idx = [i for i, rs in index_ranks.items() if len(rs) > 1]
    with_content = [i for i in shared_idx if len(content.get(i, {})) > 1]
    same = [i for i in with_content if len(set(content[i].values())) == 1]
    if with_content and len(same) * 2 < len(with_content):
        return 0, True, drawn  # same indices, different samples: each rank reads its own data
    return sum(len(index_ranks[i]) - 1 for i in shared_idx), False, drawn


def sampler_rules(ranks: dict[int, dict[str, Any]]) -> list[Finding]:
    out: list[Finding] = []
    keyed = {r: _loader_keys(rec) for r, rec in ranks.items()}
    world = max([len(ranks)] + [int(rec.get("world_size") or 0) for rec in ranks.values()])
    keys = sorted({k for ks in keyed.values() for k in ks})
    for key in keys:
        have = {r: ks[key] for r, ks in keyed.items() if key in ks}
        info = next(iter(have.values()))
        training = {r: [it for it in ld.get("iterations", []) if it.get("training")] for r, ld in have.items()}
        trained = [r for r, its in training.items() if its]
        if not trained:
            continue
        flagged = rank_data = False
        if len(trained) > 1:
            first = {r: training[r][0] for r in trained}
            shared, rank_data, drawn = _overlap(first)
            allowed = (len(trained) - 1) * int(info.get("batch_size") or 1)
            if shared > allowed:
                flagged = True
                out.append(_finding(OVERLAP, (
                    f"ranks {format_ranks(trained)} drew the same samples from the DataLoader made at "
                    f"{info.get('site')} ({info.get('sampler')} over {info.get('dataset')} of "
                    f"{info.get('dataset_size')}): {shared} of {drawn} samples in the first "
                    f"{max(len(it.get('indices') or []) for it in first.values())} batches of the first "
                    f"epoch were drawn by more than one rank (padding allows {allowed})"),
                    rank=None, ranks=trained, evidence={"loader": info.get("site"), "shared": shared,
                                                        "drawn": drawn, "sampler": info.get("samplers")}))
        if (not flagged and not rank_data and world > 1 and info.get("map_style")
                and not any(ld.get("distributed") for ld in have.values())):
            out.append(_finding(NOT_SHARDED, (
                f"the training DataLoader made at {info.get('site')} uses {info.get('sampler')} "
                f"(samplers: {', '.join(info.get('samplers') or [])}) in a world of {world} ranks: no "
                f"DistributedSampler, no accelerate/Lightning sharding"),
                rank=None, ranks=sorted(have), evidence={"loader": info.get("site"),
                                                         "samplers": info.get("samplers")}))
        out += _same_order(info, training)
    return out


def _same_order(info: dict[str, Any], training: dict[int, list[dict[str, Any]]]) -> list[Finding]:
    """A shuffling loader whose next epoch starts in the same order: set_epoch was not called."""
    stuck = []
    for r, its in training.items():
        for a, b in zip(its, its[1:]):
            ia = [i for batch in a.get("indices") or [] for i in (batch or [])]
            ib = [i for batch in b.get("indices") or [] for i in (batch or [])]
            shuffles = info.get("shuffle") or ia != sorted(ia)
            epoch_kept = a.get("epoch") is not None and a.get("epoch") == b.get("epoch")
            if shuffles and ia and ia == ib and (epoch_kept or a.get("epoch") is None):
                stuck.append((r, a, b))
                break
    if not stuck:
        return []
    rs = sorted(r for r, _, _ in stuck)
    _, a, b = stuck[0]
    epoch = f" (sampler.epoch stayed {a.get('epoch')})" if a.get("epoch") is not None else ""
    return [_finding(SAME_ORDER, (
        f"the DataLoader made at {info.get('site')} ({info.get('sampler')}, shuffling) started epochs "
        f"{a.get('number')} and {b.get('number')} with the same order on rank(s) {format_ranks(rs)}{epoch}: "
        f"set_epoch(epoch) is not called"), rank=None, ranks=rs,
        evidence={"loader": info.get("site"), "epoch": a.get("epoch")})]


# ------------------------------------------------------------------ consistency

def _differs(a: float, b: float) -> bool:
    return abs(a - b) > REL_TOL * max(1.0, abs(a), abs(b))


def consistency(ranks: dict[int, dict[str, Any]]) -> list[Finding]:
    """Compare check sums rank by rank against the lowest rank, at the first point where any
    differ (later points only repeat it)."""
    for point in ("first_step", "end"):
        sums = {r: rec["checksums"][point] for r, rec in ranks.items() if point in (rec.get("checksums") or {})}
        by_step: dict[int, list[int]] = {}
        for r, s in sums.items():
            by_step.setdefault(int(s.get("step", 0)), []).append(r)
        found: list[Finding] = []
        for step, rs in sorted(by_step.items()):
            if len(rs) < 2:
                continue
            found += _compare(point, step, {r: sums[r] for r in sorted(rs)})
        if found:
            return found
    return []


def _compare(point: str, step: int, sums: dict[int, dict[str, Any]]) -> list[Finding]:
    ref_rank = min(sums)
    ref = sums[ref_rank]
    ref_vals = {n: (k, s, a) for n, k, s, a in zip(ref["names"], ref["kinds"], ref["sum"], ref["abs"])}
    params: dict[int, list[str]] = {}
    buffers: dict[int, list[str]] = {}
    examples: dict[str, str] = {}
    for r, s in sums.items():
        if r == ref_rank:
            continue
        vals = {n: (k, sm, ab) for n, k, sm, ab in zip(s["names"], s["kinds"], s["sum"], s["abs"])}
        for name in sorted(set(ref_vals) | set(vals)):
            mine, theirs = vals.get(name), ref_vals.get(name)
            kind = (mine or theirs)[0]  # type: ignore[index]
            if kind == "buffer" and ROLLING_STATS.search(name):
                continue
            if mine is None or theirs is None or _differs(mine[1], theirs[1]) or _differs(mine[2], theirs[2]):
                (params if kind == "param" else buffers).setdefault(r, []).append(name)
                if name not in examples:
                    examples[name] = ("missing on one rank" if mine is None or theirs is None else
                                      f"sum {theirs[1]:.6g} on rank {ref_rank} vs {mine[1]:.6g} on rank {r}")
    when = "after the first optimizer step" if point == "first_step" else f"at the end (step {step})"
    out = []
    for entry, diff, kind in ((PARAMS_DIVERGED, params, "parameters"), (BUFFERS_DIVERGED, buffers, "buffers")):
        if not diff:
            continue
        total = sum(1 for k in ref["kinds"] if (k == "param") == (kind == "parameters"))
        names = sorted({n for ns in diff.values() for n in ns})
        shown = "; ".join(f"{n}: {examples[n]}" for n in names[:3])
        out.append(_finding(entry, (
            f"{kind} of the DDP model differ {when}: rank(s) {format_ranks(diff)} vs rank {ref_rank} in "
            f"{max(len(v) for v in diff.values())} of {total} tensors ({shown}"
            f"{'; …' if len(names) > 3 else ''})"), rank=None, ranks=sorted(set(diff) | {ref_rank}),
            evidence={"point": point, "step": step, "reference_rank": ref_rank,
                      "differing": {str(r): v[:20] for r, v in diff.items()}}))
    return out


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


def stragglers(ranks: dict[int, dict[str, Any]]) -> list[Finding]:
    """Median time per training batch from the DataLoader, rank by rank (first batch left out:
    it includes starting the workers)."""
    med: dict[int, float] = {}
    for r, rec in ranks.items():
        times = [t for ld in rec.get("loaders") or [] if any(it.get("training") for it in ld.get("iterations", []))
                 for t in (ld.get("data_times") or [])[1:]]
        if len(times) >= 3:
            med[r] = _median(times)
    if len(med) < 2:
        return []
    slow = max(med, key=lambda r: med[r])
    others = _median([v for r, v in med.items() if r != slow])
    if med[slow] > STRAGGLER_RATIO * others and med[slow] - others > STRAGGLER_MIN_S:
        return [_finding(DATA_STRAGGLER, (
            f"rank {slow} waits {med[slow] * 1000:.1f} ms for each training batch from its DataLoader, "
            f"the other ranks {others * 1000:.1f} ms (median)"), rank=slow,
            evidence={"median_data_s": {str(r): round(v, 6) for r, v in med.items()}})]
    return []


def batch_scaling(ranks: dict[int, dict[str, Any]]) -> list[Finding]:
    for r in sorted(ranks):
        args = (ranks[r].get("extra") or {}).get("trainer_args")
        if not args:
            continue
        per, accum, world, lr = (args.get("per_device_train_batch_size"), args.get("gradient_accumulation_steps"),
                                 args.get("world_size"), args.get("learning_rate"))
        try:
            total = int(per) * int(accum) * int(world)
        except (TypeError, ValueError):
            return []
        return [_finding(BATCH_SCALING, (
            f"global batch {total} = {per} per device x {accum} accumulation step(s) x {world} rank(s); "
            f"learning rate {lr}"), rank=None, evidence=dict(args))]
    return []


# ------------------------------------------------------------------ teardown

def teardown(ranks: dict[int, dict[str, Any]]) -> list[Finding]:
    left = []
    for r, rec in ranks.items():
        ended = rec.get("ended") or {}
        # Only a group the script made itself: Trainer/accelerate and Lightning own the groups they make.
        made = any(e.get("kind") == "init_process_group" and e.get("ok") and not e.get("by_library")
                   for e in rec.get("events", []))
        if made and ended.get("pg_initialized") and ended.get("exit_code", 0) == 0:
            left.append(r)
    if not left:
        return []
    return [_finding(NO_DESTROY, (
        f"rank(s) {format_ranks(left)} ended the script with the default process group still up "
        f"(destroy_process_group was not called)"), rank=None, ranks=sorted(left), phase="teardown")]
