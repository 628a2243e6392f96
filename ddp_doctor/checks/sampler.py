"""Sampler checks (DDP850-DDP855): ranks drawing the same samples, samples never drawn, the same
order every epoch, a training DataLoader not sharded across ranks, every rank evaluating the whole
data set, ranks that each trained alone on all the data (no DDP model, no gradient synchronisation).

DDP850-DDP852 are raised both by `ddp_doctor.check_sampler` before training (it draws the indices,
ddp_doctor/training/sampler_check.py) and by `sampler_rules` over the in-training probe records of
all ranks (fingerprints of the first batches of each epoch); DDP853 and DDP854 only by the latter.

Which loaders are judged, from what the ranks did (never from the script's text):
- a loader's overlap across ranks matters only when its batches feed a model whose gradients the
  ranks synchronise: between its draws a DistributedDataParallel model ran a forward with autograd
  on, or an optimizer stepped over a DDP model's parameters (`ddp_training` of an iteration). Only
  these are sharding bugs (DDP850, DDP853). In a job where no DDP model trained, a loader iterated
  while an optimizer stepped is judged when the process groups carried collectives between its draws
  (`collectives`: FSDP, DeepSpeed, gradients all-reduced by hand) or when the probe did not say
  (records of an older probe, as before);
- in a job where no rank ever made a DDP model and no collective ran while any optimizer stepped,
  the ranks each trained alone: loaders whose first training passes overlap across ranks are then
  not a sampler to fix but a job that never went distributed (the framework did not see the
  launcher): one DDP855, which says whether the script formed a process group at all;
- a loader that fed only a model outside DDP (a reference model each rank trains on the full data on
  purpose) is not a sharding bug: nothing is reported;
- a loader drawn with no optimizer step and no DDP training forward (evaluation) that every rank
  reads in full, in a job whose DDP model trains, is wasteful, not wrong: DDP854, info;
- coverage (DDP851) is judged on every loader that all ranks drew a whole epoch from: the indices
  the ranks drew, counted over the pass, against the data set's length; what split the data twice
  is named from the samplers and the DistributedSampler arguments each rank recorded;
- accelerate's prepared loaders shard on their own terms: `dispatch_batches` (rank 0 loads and
  broadcasts, the other ranks draw nothing) and `split_batches` (each rank keeps its slice of one
  batch, so the indices may be the same on every rank) are never DDP850 or DDP853. Lightning's
  replacement samplers are DistributedSampler subclasses and judged as such.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from ddp_doctor.checks.internal import event_finding
from ddp_doctor.checks.probe_records import finding_at
from ddp_doctor.findings import Finding, format_ranks
from ddp_doctor.registry import declare

OVERLAP = declare(
    "DDP850", category="sampler", severity="error", title="Ranks draw the same samples",
    doc="""
    What: The indices the ranks draw in one epoch overlap beyond DistributedSampler's padding
    (at most world_size - 1 repeats when drop_last=False).
    In training (`ddp-doctor run`) only the DataLoaders whose batches feed a model whose gradients
    the ranks synchronise are judged (a DDP model's forward with autograd on, or an optimizer step
    over its parameters, between the loader's draws; with no DDP model, an optimizer step with
    collectives between the draws: FSDP, DeepSpeed, all_reduce by hand): a loader feeding a plain
    reference model that every rank trains on the full data on purpose is not a sharding bug,
    evaluation without a training step is DDP854 (info), ranks that never synchronised anything are
    DDP855, and accelerate's split_batches/dispatch_batches loaders, which slice or broadcast each
    batch across the ranks, are sharded by design.
    Why: Without a distributed-aware sampler every rank trains on the same data: the job "works"
    at 1/N of the speed it should, with N times the effective repetition.
    When the loader does draw through a DistributedSampler, its arguments recorded on each rank
    (num_replicas, rank, seed, shuffle, drop_last) are compared and the finding names what makes
    the shards overlap: a seed that differs by rank with shuffle=True (`seed=rank`), or rank= /
    num_replicas= passed by hand with a wrong value.
    Fix: Use DataLoader(dataset, sampler=DistributedSampler(dataset), shuffle=False) (or let
    Trainer/Accelerate shard the data), and call sampler.set_epoch(epoch) every epoch. With a
    DistributedSampler already there: the same seed on every rank, and rank / num_replicas left to
    the process group.
    """)

NOT_COVERED = declare(
    "DDP851", category="sampler", severity="warning", title="Some samples are never drawn",
    doc="""
    What: Over all ranks, one epoch leaves indices of the data set undrawn, beyond what
    drop_last=True may drop (fewer than world_size samples).
    In training (`ddp-doctor run`) it is decided from what the ranks drew: in each rank's first
    complete pass over a loader every drawn index is counted, and the ranks' draws together (their
    union where every index was kept) are compared with the data set's length (a Subset's base data
    set, when each rank's Subset holds other indices). The finding says what each rank draws ("each
    rank draws 1/4 of the data with 2 ranks") and why, from the loader's samplers and the
    DistributedSampler arguments each rank recorded: sharded twice (a DistributedSampler inside and
    accelerate's per-process split of Accelerator.prepare, a per-rank Subset such as
    indices[rank::world_size], or a sampler that splits the DistributedSampler's draws by rank
    again), num_replicas larger than the world, or seeds that differ by rank.
    Why: A sampler built for another data set size, num_replicas larger than the world, or data
    sharded twice skips data silently: part of every epoch is never trained on.
    Fix: Shard once: build DistributedSampler from the data set the DataLoader uses, with
    num_replicas equal to the world size (the default reads it from the process group), and do not
    split again (hand accelerate a DataLoader without a DistributedSampler, or do not prepare it).
    """)

SAME_ORDER = declare(
    "DDP852", category="sampler", severity="warning", title="Same order every epoch",
    doc="""
    What: A shuffling sampler yields the same order in consecutive epochs.
    Why: DistributedSampler seeds its shuffle with seed + epoch; without sampler.set_epoch(epoch)
    every epoch sees the data in the same order, which hurts convergence.
    Fix: Call sampler.set_epoch(epoch) at the start of every epoch (Trainer does it for you).
    """)

NOT_SHARDED = declare(
    "DDP853", category="sampler", severity="warning", title="Training DataLoader is not sharded across ranks",
    doc="""
    What: A map-style DataLoader whose batches feed the distributed model's training steps, in a
    world of more than one rank, uses a sampler that is not distributed-aware (not a
    DistributedSampler, not sharded by accelerate, Trainer or Lightning), and no rank-dependent data
    was seen. Loaders feeding only a model outside DDP, or evaluation, are not judged.
    Why: Each rank then draws from the whole data set: the job runs, but every epoch is N times
    longer than it should be and ranks may train on the same batches.
    Fix: Pass sampler=DistributedSampler(dataset) (and shuffle=False) to the DataLoader, or let
    Trainer/Accelerate/Lightning build it. If your data set is already sharded per rank, ignore this.
    """)

TRAINED_ALONE = declare(
    "DDP855", category="sampler", severity="error", title="Each rank trained alone on all the data",
    doc="""
    What: The ranks drew the same samples while an optimizer stepped, but no rank ever wrapped a
    model in DistributedDataParallel and no collective ran on any process group between those draws
    (or the script formed no process group at all): no gradient was synchronised, each rank trained
    its own copy of the model on the whole data set. Decided from what the probes recorded (DDP
    constructions, init_process_group, the process groups' collective counts), not from the script.
    Why: The job never went distributed: the framework did not see the launcher and ran as a single
    process on every rank (Hugging Face Trainer and accelerate on a machine without GPUs need to be
    told to use the CPU, or they take the world to be one process). It "works", N times over, and
    every rank writes the same checkpoints.
    Fix: Make the framework see the launcher. Hugging Face Trainer: launch with torchrun / ddp-doctor
    run (they set LOCAL_RANK) and, on CPU, pass use_cpu=True (--use_cpu) with ddp_backend="gloo".
    accelerate: start with `accelerate launch` (`--cpu` on CPU), or under torchrun / ddp-doctor run set
    ACCELERATE_USE_CPU=1 on CPU. A plain script: call init_process_group, wrap the model in
    DistributedDataParallel and shard the data with DistributedSampler. If each rank training its own
    model on all the data is what you want (an ensemble), ignore this.
    """)

FULL_EVALUATION = declare(
    "DDP854", category="sampler", severity="info", title="Every rank evaluates the whole data set",
    doc="""
    What: A DataLoader drawn with no training step in between (no optimizer step, no DDP forward
    with autograd on: evaluation) yields the same samples on every rank, in a job whose
    DistributedDataParallel model trains.
    Why: It is not wrong, each rank computes the same metrics, but the evaluation takes N times the
    compute it needs and its wall time does not shrink as ranks are added.
    Fix: Shard it with DistributedSampler(dataset, shuffle=False) and combine the metrics across
    ranks (dist.all_reduce of sums and counts, torchmetrics, accelerator.gather_for_metrics), or
    evaluate on rank 0 only (through model.module, with the other ranks waiting at a barrier). If each
    rank's own full-set number is what you want, ignore this.
    """)


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


def _ddp_trained(ranks: dict[int, dict[str, Any]]) -> bool:
    """Whether a DDP model did training work on any rank (then only the loaders feeding it are
    judged as training loaders)."""
    for rec in ranks.values():
        if rec.get("ddp_forwards") or rec.get("ddp_steps"):
            return True
        if any(it.get("ddp_training") for ld in rec.get("loaders") or [] for it in ld.get("iterations") or []):
            return True
    return False


def _feeds_training(it: dict[str, Any], ddp_job: bool) -> bool:
    """Whether an iteration fed a model whose gradients the ranks synchronise: the DDP model, where
    one trained; otherwise an optimizer step with collectives between the draws (FSDP, DeepSpeed,
    a hand-made all_reduce), or any optimizer step where the probe did not record collectives."""
    if ddp_job and "ddp_training" in it:
        return bool(it["ddp_training"])
    return bool(it.get("training")) and it.get("collectives") is not False


def _alone(it: dict[str, Any]) -> bool:
    """An optimizer stepped between the draws with no collective on any process group: the model
    trained on this rank only."""
    return bool(it.get("training")) and it.get("collectives") is False and not it.get("ddp_training")


def _ddp_made(ranks: dict[int, dict[str, Any]]) -> bool:
    """Whether any rank constructed a DistributedDataParallel model (trained or not)."""
    return any(rec.get("ddp_models") or any(e.get("kind") == "ddp" for e in rec.get("events") or [])
               for rec in ranks.values())


def _group_formed(ranks: dict[int, dict[str, Any]]) -> str | None:
    """How the script formed its process group, from the lowest rank that formed one ("the process
    group formed at train.py:12", "... (by a library)"); None when it formed none."""
    for _, rec in sorted(ranks.items()):
        inits = [e for e in rec.get("events") or [] if e.get("kind") == "init_process_group" and e.get("ok")]
        pg = rec.get("pg") or {}
        if not inits and not pg:
            continue
        site = inits[0].get("site") if inits else pg.get("site")
        by = " (by a library)" if inits and inits[0].get("by_library") else ""
        return f"the process group formed at {site}{by}" if site else f"the process group it formed{by}"
    return None


def _evaluation(it: dict[str, Any]) -> bool:
    """A pass with no training between its draws. It takes two draws to see what happened between
    them: a pass of one batch (`next(iter(loader))`, then a step) is not taken for evaluation."""
    drawn = int(it.get("batches") or len(it.get("indices") or []))
    return drawn >= 2 and not it.get("training") and not it.get("ddp_training")


def _sharded_by_wrapper(have: dict[int, dict[str, Any]]) -> str | None:
    """accelerate's modes that shard a batch after loading it: "dispatch_batches" or "split_batches"."""
    if any(ld.get("dispatch") for ld in have.values()):
        return "dispatch_batches"
    if any(ld.get("split_batches") for ld in have.values()):
        return "split_batches"
    return None


def sampler_rules(ranks: dict[int, dict[str, Any]]) -> list[Finding]:
    out: list[Finding] = []
    keyed = {r: _loader_keys(rec) for r, rec in sorted(ranks.items())}  # the lowest rank's details are quoted
    world = max([len(ranks)] + [int(rec.get("world_size") or 0) for rec in ranks.values()])
    ddp_job = _ddp_trained(ranks)
    keys = sorted({k for ks in keyed.values() for k in ks})
    for key in keys:
        have = {r: ks[key] for r, ks in keyed.items() if key in ks}
        info = next(iter(have.values()))
        mode = _sharded_by_wrapper(have)
        training = {r: [it for it in ld.get("iterations", []) if _feeds_training(it, ddp_job)]
                    for r, ld in have.items()}
        trained = [r for r, its in training.items() if its]
        if not trained:
            if ddp_job and mode is None:
                out += _full_evaluation(info, have, world)
            continue
        flagged = rank_data = False
        if len(trained) > 1 and mode is None:
            first = {r: training[r][0] for r in trained}
            shared, rank_data, drawn = _overlap(first)
            allowed = (len(trained) - 1) * int(info.get("batch_size") or 1)
            if shared > allowed:
                flagged = True
                cause, hint = overlap_cause({r: have[r] for r in trained}, world)
                f = finding_at(OVERLAP, (
                    f"ranks {format_ranks(trained)} drew the same samples from the DataLoader made at "
                    f"{info.get('site')} ({info.get('sampler')} over {info.get('dataset')} of "
                    f"{info.get('dataset_size')}): {shared} of {drawn} samples in the first "
                    f"{max(len(it.get('indices') or []) for it in first.values())} batches of the first "
                    f"epoch were drawn by more than one rank (padding allows {allowed}){cause}"),
                    rank=None, ranks=trained, evidence={"loader": info.get("site"), "shared": shared,
                                                        "drawn": drawn, "sampler": info.get("samplers"),
                                                        "sampler_args": _args_by_rank(have)})
                if hint:
                    f.hint = hint
                out.append(f)
        if (not flagged and not rank_data and world > 1 and info.get("map_style") and mode is None
                and not any(ld.get("distributed") for ld in have.values())):
            out.append(finding_at(NOT_SHARDED, (
                f"the training DataLoader made at {info.get('site')} uses {info.get('sampler')} "
                f"(samplers: {', '.join(info.get('samplers') or [])}) in a world of {world} ranks: no "
                f"DistributedSampler, no accelerate/Lightning sharding"),
                rank=None, ranks=sorted(have), evidence={"loader": info.get("site"),
                                                         "samplers": info.get("samplers")}))
        out += _same_order(info, training)
    for key in keys:
        have = {r: ks[key] for r, ks in keyed.items() if key in ks}
        out += coverage_findings(have, world)
    if not ddp_job and not _ddp_made(ranks):
        out += _trained_alone(ranks, keyed, world)
    return out


def _trained_alone(ranks: dict[int, dict[str, Any]], keyed: dict[int, dict[str, dict[str, Any]]],
                   world: int) -> list[Finding]:
    """DDP855: no DDP model anywhere, no collective while any optimizer stepped, and loaders whose
    first training passes overlap across ranks: each rank trained alone on the whole data."""
    passes = [it for rec in ranks.values() for ld in rec.get("loaders") or [] for it in ld.get("iterations") or []]
    if world < 2 or any(it.get("training") and not _alone(it) for it in passes):
        return []  # some training was synchronised (or the probe could not say): judged as DDP850
    overlapping = []
    for key in sorted({k for ks in keyed.values() for k in ks}):
        have = {r: ks[key] for r, ks in keyed.items() if key in ks}
        if _sharded_by_wrapper(have):
            continue
        first = {}
        for r, ld in have.items():
            alone = [it for it in ld.get("iterations") or [] if _alone(it)]
            if alone:
                first[r] = alone[0]
        if len(first) < 2:
            continue
        info = next(iter(have.values()))
        shared, rank_data, drawn = _overlap(first)
        if not rank_data and shared > (len(first) - 1) * int(info.get("batch_size") or 1):
            overlapping.append((info, sorted(first), shared, drawn, first))
    if not overlapping:
        return []
    info, rs, shared, drawn, first = overlapping[0]
    formed = _group_formed(ranks)
    why = ("the script formed no process group" if formed is None else
           f"{formed} carried no collective while they trained")
    sites = list(dict.fromkeys(str(o[0].get("site")) for o in overlapping[1:]))
    more = (f"; so did {len(overlapping) - 1} more DataLoader(s) (made at {', '.join(sites[:3])}"
            f"{', ...' if len(sites) > 3 else ''})") if sites else ""
    return [finding_at(TRAINED_ALONE, (
        f"ranks {format_ranks(rs)} each trained on all the data: no model was wrapped in "
        f"DistributedDataParallel and {why} - the framework did not see the launcher, so every rank "
        f"ran the whole training on its own. The DataLoader made at {info.get('site')} "
        f"({info.get('sampler')} over {info.get('dataset')} of {info.get('dataset_size')}): {shared} of "
        f"{drawn} samples in the first {max(len(it.get('indices') or []) for it in first.values())} batches "
        f"of the first epoch were drawn by more than one rank{more}"),
        rank=None, ranks=rs, evidence={"loader": info.get("site"), "shared": shared, "drawn": drawn,
                                       "sampler": info.get("samplers"), "process_group": formed is not None,
                                       "ddp_models": 0,
                                       "loaders": list(dict.fromkeys(str(o[0].get("site")) for o in overlapping))})]


def _full_evaluation(info: dict[str, Any], have: dict[int, dict[str, Any]], world: int) -> list[Finding]:
    """DDP854: a loader only ever drawn for evaluation, whose first pass overlaps across ranks."""
    first = {}
    for r, ld in have.items():
        evals = [it for it in ld.get("iterations", []) if _evaluation(it)]
        if evals:
            first[r] = evals[0]
    if len(first) < 2 or world < 2:
        return []
    shared, rank_data, drawn = _overlap(first)
    allowed = (len(first) - 1) * int(info.get("batch_size") or 1)
    if rank_data or shared <= allowed:
        return []
    rs = sorted(first)
    return [finding_at(FULL_EVALUATION, (
        f"ranks {format_ranks(rs)} each drew the same samples from the DataLoader made at {info.get('site')} "
        f"({info.get('sampler')} over {info.get('dataset')} of {info.get('dataset_size')}) with no training "
        f"step between its batches (evaluation): {shared} of {drawn} samples in the first "
        f"{max(len(it.get('indices') or []) for it in first.values())} batches were drawn by more than one "
        f"rank, so every rank repeats the same evaluation"),
        rank=None, ranks=rs, evidence={"loader": info.get("site"), "shared": shared, "drawn": drawn,
                                       "sampler": info.get("samplers")})]


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
    return [finding_at(SAME_ORDER, (
        f"the DataLoader made at {info.get('site')} ({info.get('sampler')}, shuffling) started epochs "
        f"{a.get('number')} and {b.get('number')} with the same order on rank(s) {format_ranks(rs)}{epoch}: "
        f"set_epoch(epoch) is not called"), rank=None, ranks=rs,
        evidence={"loader": info.get("site"), "epoch": a.get("epoch")})]


# ---------------------------------------------------------------- what makes shards overlap or fall short

def _args_by_rank(have: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """rank -> the DistributedSampler's arguments its loader recorded (num_replicas, rank, seed,
    shuffle, drop_last), for the ranks whose loader has one."""
    return {str(r): ld["sampler_args"] for r, ld in sorted(have.items()) if ld.get("sampler_args")}


def overlap_cause(have: dict[int, dict[str, Any]], world: int) -> tuple[str, str | None]:
    """(": what makes the shards overlap", a hint) from the DistributedSampler arguments each rank
    recorded, compared across ranks; ("", None) when no rank's loader has a DistributedSampler (the
    catalogue's own fix, a DistributedSampler, then applies)."""
    args = {r: a for r, ld in sorted(have.items()) if (a := ld.get("sampler_args"))}
    if not args:
        return "", None
    ranks = sorted(args)
    seeds = {r: a.get("seed") for r, a in args.items()}
    given = {r: a.get("rank") for r, a in args.items()}
    replicas = {r: a.get("num_replicas") for r, a in args.items()}
    shuffles = any(a.get("shuffle") for a in args.values())
    taken = [v for v in given.values() if v is not None]
    if len(set(taken)) < len(taken):
        dup = sorted({v for v in taken if taken.count(v) > 1})[0]
        who = [r for r in ranks if given[r] == dup]
        return (f": a DistributedSampler with rank={dup} on ranks {format_ranks(who)} (rank= passed by hand "
                f"with a wrong value), so they draw the same shard",
                "Leave rank= and num_replicas= out of DistributedSampler (they are read from the process group), "
                "or pass dist.get_rank() and dist.get_world_size().")
    wrong_world = {r: n for r, n in replicas.items() if isinstance(n, int) and n != world}
    if wrong_world:
        r, n = sorted(wrong_world.items())[0]
        return (f": a DistributedSampler with num_replicas={n} in a world of {world} (num_replicas= passed by "
                f"hand, on rank(s) {format_ranks(wrong_world)}), so the shards are cut for another world",
                "Leave num_replicas= and rank= out of DistributedSampler (they are read from the process group), "
                "or pass dist.get_world_size() and dist.get_rank().")
    if shuffles and len(set(seeds.values())) > 1:
        shown = ", ".join(f"seed={seeds[r]} on rank {r}" for r in ranks[:4])
        return (f": a DistributedSampler whose seed differs by rank ({shown}{', ...' if len(ranks) > 4 else ''}"
                f"): with shuffle=True each rank shards its own permutation, so the shards overlap and leave "
                f"samples out",
                "Give DistributedSampler the same seed on every rank (the default, 0, or one shared value; "
                "seed=rank breaks the sharding), and call sampler.set_epoch(epoch) for a new order each epoch.")
    return "", None


def _fraction(part: float, whole: int) -> str:
    """"1/4" when part/whole is within 10% of one over an integer, else a percentage."""
    if part <= 0 or whole <= 0:
        return "none"
    k = round(whole / part)
    if k >= 2 and abs(whole / part - k) <= 0.1 * k:
        return f"1/{k}"
    return f"{100 * part / whole:.0f}%"


def _per_rank_subset(have: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The Subset every rank's loader draws from, when its indices differ by rank (a hand-made split
    of the data set, `indices[rank::world]`); None otherwise."""
    subsets = [ld.get("subset") for ld in have.values()]
    split = [x for x in subsets if isinstance(x, dict) and x.get("head") and x.get("base_size")]
    if len(subsets) < 2 or len(split) < len(subsets):
        return None
    heads = {tuple(x["head"]) for x in split}
    return split[0] if len(heads) > 1 else None


def _second_split(have: dict[int, dict[str, Any]], args: dict[str, Any] | None,
                  subset: dict[str, Any] | None, world: int) -> tuple[str, str]:
    """(the cause, the hint) of a loader whose ranks leave samples undrawn."""
    lds = list(have.values())
    accelerate = any(ld.get("wrapper") or "BatchSamplerShard" in (ld.get("samplers") or []) for ld in lds)
    inside = ", ".join(dict.fromkeys(str(ld.get("sampler")) for ld in lds if ld.get("wrapped_samplers")))
    if args and accelerate:
        return ("sharded twice: a DistributedSampler inside, and accelerate's per-process split",
                "Shard once: hand Accelerator.prepare() a DataLoader without a DistributedSampler (accelerate "
                "shards it per process), or keep the DistributedSampler and do not prepare that DataLoader.")
    if args and subset:
        return ("sharded twice: a DistributedSampler inside, and a per-rank Subset of the data set (each rank's "
                f"Subset of {subset.get('base')} holds other indices: a hand-made split such as "
                "indices[rank::world_size])",
                "Shard once: give every rank the same data set and let the DistributedSampler split it, or keep "
                "the per-rank split and use a plain sampler on it.")
    if args and inside:
        return (f"sharded twice: a DistributedSampler inside {inside}, which splits what it draws by rank again",
                "Shard once: keep the DistributedSampler and drop the second per-rank split around it (or the "
                "reverse).")
    nums = [a.get("num_replicas") for a in [ld.get("sampler_args") or {} for ld in lds]]
    big = max((n for n in nums if isinstance(n, int)), default=0)
    if args and big > world:
        return (f"a DistributedSampler with num_replicas={big} in a world of {world}: the shards of ranks "
                f"{format_ranks(range(world, big))} are drawn by no one",
                "Leave num_replicas= out of DistributedSampler (it is read from the process group), or pass "
                "dist.get_world_size().")
    seeded, seed_hint = overlap_cause(have, world)
    if seeded:
        return seeded[2:], seed_hint or ""
    if subset:
        return (f"each rank draws from its own Subset of {subset.get('base')}, and the Subsets leave samples out",
                "Check the per-rank split covers the data set.")
    return ("the samplers leave part of the data set undrawn",
            "Build the sampler from the data set the DataLoader uses, sharded once across the world.")


def coverage_findings(have: dict[int, dict[str, Any]], world: int) -> list[Finding]:
    """DDP851 over the probe records: in the first complete pass of each rank over one loader, the
    samples all ranks drew (counted over the whole pass; distinct where every index was kept) fall
    short of the data set's length (the base data set's, for a Subset that differs by rank) by more
    than drop_last may drop. Judged only when every rank of the world drew a whole epoch from it;
    accelerate's dispatch_batches (rank 0 draws for everyone) and iterable data sets are left out."""
    if world < 2 or len(have) < world or _sharded_by_wrapper(have) == "dispatch_batches":
        return []
    info = have[min(have)]
    if not info.get("map_style"):
        return []
    passes: dict[int, dict[str, Any]] = {}
    for r, ld in have.items():
        done = [it for it in ld.get("iterations") or [] if it.get("complete") and it.get("samples") is not None]
        if not done:
            return []
        passes[r] = done[0]
    subset = _per_rank_subset(have)
    n = int((subset or {}).get("base_size") or info.get("dataset_size") or 0)
    total = sum(int(it.get("samples") or 0) for it in passes.values())
    if n <= 0 or total <= 0:
        return []
    drawn = total
    kept = [it.get("indices") or [] for it in passes.values()]
    if subset is None and all(sum(len(b or []) for b in k) == int(it.get("samples") or 0)
                              for k, it in zip(kept, passes.values())):
        drawn = len({i for k in kept for b in k for i in (b or [])})  # every index kept: the exact union
    bs = int(info.get("batch_size") or 1)
    allowed = (world - 1) + (world * (bs - 1) if any(ld.get("drop_last") for ld in have.values()) else 0)
    if drawn + allowed >= n:
        return []
    args = next((ld.get("sampler_args") for _, ld in sorted(have.items()) if ld.get("sampler_args")), None)
    cause, hint = _second_split(have, args, subset, world)
    share = _fraction(total / len(passes), n)
    f = finding_at(NOT_COVERED, (
        f"the DataLoader made at {info.get('site')} ({info.get('sampler')} over "
        f"{(subset or {}).get('base') or info.get('dataset')} of {n}): one epoch over {world} ranks draws "
        f"{drawn} of {n} samples, {n - drawn} never drawn: each rank draws {share} of the data with {world} "
        f"ranks: {cause}"),
        rank=None, ranks=sorted(have), evidence={
            "loader": info.get("site"), "dataset_size": n, "drawn": drawn, "missing": n - drawn,
            "per_rank": {str(r): int(it.get("samples") or 0) for r, it in sorted(passes.items())},
            "samplers": info.get("samplers"), "sampler_args": _args_by_rank(have),
            "wrapper": info.get("wrapper"), "per_rank_subset": subset is not None})
    f.hint = hint
    return [f]


# ---------------------------------------------------------------- before training: check_sampler's draws

@dataclass
class SamplerDraws:
    """The indices `ddp_doctor.check_sampler` drew before training (training/sampler_check.py): the
    facts DDP850-DDP852 are decided on there."""
    sampler: str  # the sampler's class name
    dataset_size: int
    world: int  # the ranks that draw
    distributed: bool  # a DistributedSampler: it pads its shards when drop_last=False
    drop_last: bool
    draws: list[list[list[int]]]  # epoch -> rank -> indices
    num_replicas: int | None = None  # a DistributedSampler's
    actual_world: int | None = None  # the world it will run in, when known


def draw_findings(d: SamplerDraws) -> list[Finding]:
    """DDP850 (shards overlap beyond DistributedSampler's padding), DDP851 (samples no rank draws, beyond
    what drop_last may drop) and DDP852 (a shuffling sampler in the same order in epochs 0 and 1)."""
    findings: list[Finding] = []
    n, world, first = d.dataset_size, d.world, d.draws[0]
    counts = Counter(i for shard in first for i in shard)
    repeats = sum(c - 1 for c in counts.values() if c > 1)
    allowed = world - 1 if d.distributed and not d.drop_last else 0
    if world > 1 and repeats > allowed:
        shared = sorted(i for i, c in counts.items() if c > 1)
        findings.append(event_finding(OVERLAP, (
            f"{d.sampler} over {n} samples and {world} ranks: {repeats} index draws repeat "
            f"across ranks in one epoch (padding allows {allowed}); e.g. indices {shared[:5]} are drawn by "
            f"ranks {format_ranks(r for r, shard in enumerate(first) if shared and shared[0] in shard)}"),
            rank=None, ranks=list(range(world)),
            evidence={"sampler": d.sampler, "repeats": repeats, "allowed": allowed}))
    missing = n - len(counts)
    replicas, actual = d.num_replicas, d.actual_world
    if missing > (world - 1 if d.drop_last else 0):
        why, short = "", {}
        if d.distributed and actual and replicas and replicas > actual:
            why = (f" (DistributedSampler num_replicas={replicas} in a world of {actual}: the shards of "
                   f"ranks {format_ranks(range(actual, replicas))} are drawn by no one)")
            short = {"num_replicas": replicas, "world_size": actual}
        findings.append(event_finding(NOT_COVERED, (
            f"one epoch over {world} rank(s) draws {len(counts)} of {n} distinct samples: {missing} never "
            f"drawn{why}"), rank=None, evidence={"missing": missing, "dataset_size": n, **short}))
    shuffled = any(shard != sorted(shard) for shard in first)
    if len(d.draws) > 1 and shuffled and d.draws[0] == d.draws[1]:
        findings.append(event_finding(SAME_ORDER, (
            f"{d.sampler} shuffles, but gave the same order in epochs 0 and 1 on every rank"),
            rank=None, evidence={"epochs": len(d.draws)}))
    return findings
