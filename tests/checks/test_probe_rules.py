"""The rules over in-training probe records (checks/init_order.py, sampler.py, replica_consistency.py,
training_scale.py, teardown.py, training_probes.py), on records as the probes write them
(training/probes/recorder.py). Rules that need GPUs (NCCL device placement, fork after CUDA) are
tested here only, on records shaped like a GPU run's; the others also run on real ranks in
test_probes_e2e.py."""
from __future__ import annotations

import copy

from ddp_doctor.checks.init_order import init_order, shared_gpu
from ddp_doctor.checks.probe_records import by_rank
from ddp_doctor.checks.replica_consistency import replica_divergence
from ddp_doctor.checks.sampler import sampler_rules
from ddp_doctor.checks.teardown import teardown
from ddp_doctor.checks.training_probes import probe_findings
from ddp_doctor.checks.training_scale import batch_scaling, stragglers


def record(rank: int, **kw) -> dict:
    rec = {"rank": rank, "local_rank": rank, "world_size": 2, "host": "algo-1", "pid": 100 + rank,
           "pg": {"rank": rank, "world_size": 2, "backend": "gloo"}, "events": [], "steps": 10,
           "loaders": [], "checksums": {}, "extra": {}, "ended": None}
    rec.update(kw)
    return rec


def event(kind: str, t: float = 1.0, **kw) -> dict:
    return {"kind": kind, "t": t, "site": "train.py:7", **kw}


def ids_of(findings) -> list[str]:
    return sorted(f.id for f in findings)


# ------------------------------------------------------------------ init order

def test_nccl_device_ids_must_follow_local_rank():
    bad = event("ddp", pg_initialized=True, backend="nccl", device_ids=["0"], module_device="cuda:0",
                device_count=8, set_device_called=False)
    good = dict(bad, device_ids=["1"], module_device="cuda:1", set_device_called=True)
    [f] = init_order(1, record(1, events=[bad]))
    assert f.id == "DDP862" and "LOCAL_RANK=1" in f.message and "never called" in f.message
    assert init_order(1, record(1, events=[good])) == []
    # One GPU visible per process (CUDA_VISIBLE_DEVICES=LOCAL_RANK): cuda:0 is right for every rank.
    assert init_order(1, record(1, events=[dict(bad, device_count=1)])) == []
    # gloo on CPU: device placement is not judged.
    assert init_order(1, record(1, events=[dict(bad, backend="gloo")])) == []


def test_nccl_without_set_device_is_a_warning_even_with_the_right_device_ids():
    ddp = event("ddp", pg_initialized=True, backend="nccl", device_ids=["1"], module_device="cuda:1",
                device_count=4, set_device_called=False, current_device=0)
    [f] = init_order(1, record(1, events=[ddp]))
    assert f.id == "DDP866" and f.severity == "warning" and "LOCAL_RANK=1" in f.message
    assert init_order(1, record(1, events=[dict(ddp, set_device_called=True, current_device=1)])) == []
    assert init_order(0, record(0, local_rank=0, events=[dict(ddp, device_ids=["0"], module_device="cuda:0")])) == []


def test_every_rank_on_cuda0_is_named_once_for_the_host():
    ddp = event("ddp", pg_initialized=True, backend="nccl", device_ids=None, module_device="cuda:0",
                device_count=2)
    ranks = {r: record(r, events=[ddp]) for r in (0, 1)}
    [f] = shared_gpu(ranks)
    assert f.id == "DDP863" and f.ranks == [0, 1] and "cuda:0" in f.message and "algo-1" in f.message
    ranks[1] = record(1, events=[dict(ddp, module_device="cuda:1")])
    assert shared_gpu(ranks) == []
    ranks[1] = record(1, host="algo-2", events=[ddp])  # other host, its own cuda:0
    assert shared_gpu(ranks) == []


def test_trainer_given_a_ddp_model_ddp_before_init_init_twice_fork_after_cuda():
    evs = [event("trainer", model_class="Bert", ddp_wrapped=True, t=3.0),
           event("ddp", pg_initialized=False, module_class="Net", t=1.0),
           event("init_process_group", already_initialized=True, backend="nccl", previous_site="a.py:1", t=2.0),
           event("fork_after_cuda", t=4.0)]
    found = init_order(0, record(0, events=evs))
    assert ids_of(found) == ["DDP860", "DDP861", "DDP864", "DDP865"]
    by = {f.id: f for f in found}
    assert by["DDP864"].evidence["first_site"] == "a.py:1" and "a.py:1" in by["DDP864"].message
    assert by["DDP861"].time == 1.0  # stamped when it happened: the earliest error is the root cause
    fine = [event("trainer", model_class="Bert", ddp_wrapped=False),
            event("ddp", pg_initialized=True, backend="gloo", module_device="cpu"),
            event("init_process_group", already_initialized=False, backend="gloo")]
    assert init_order(0, record(0, events=fine)) == []


# ------------------------------------------------------------------ sampler

def loader(iterations: list[dict], **kw) -> dict:
    ld = {"id": 0, "site": "train.py:20", "sampler": "RandomSampler", "samplers": ["DataLoader", "RandomSampler"],
          "dataset": "D", "dataset_size": 64, "map_style": True, "batch_size": 2, "distributed": False,
          "shuffle": True, "iterations": iterations, "data_times": []}
    ld.update(kw)
    return ld


def iteration(indices, hashes=None, number=0, epoch=None, training=True) -> dict:
    return {"number": number, "epoch": epoch, "batches": len(indices), "training": training,
            "indices": indices, "hashes": hashes or [None] * len(indices)}


def test_overlap_beyond_padding_is_an_error_padding_is_not():
    same = [[0, 1, 2, 3], [4, 5, 6, 7]]
    ranks = {r: record(r, loaders=[loader([iteration(same)])]) for r in (0, 1)}
    [f] = sampler_rules(ranks)
    assert f.id == "DDP850" and f.ranks == [0, 1] and "8 of 16" in f.message
    # DistributedSampler padding: the last index repeats on the other rank; allowed.
    ranks = {0: record(0, loaders=[loader([iteration([[0, 2, 4, 6]])], sampler="DistributedSampler",
                                          distributed=True)]),
             1: record(1, loaders=[loader([iteration([[1, 3, 5, 0]])], sampler="DistributedSampler",
                                          distributed=True)])}
    assert sampler_rules(ranks) == []


def test_same_indices_different_contents_means_rank_sharded_data():
    idx = [[0, 1, 2, 3]]
    ranks = {r: record(r, loaders=[loader([iteration(idx, [[f"r{r}-{i}" for i in range(4)]])])]) for r in (0, 1)}
    assert sampler_rules(ranks) == []  # neither DDP850 nor the static DDP853
    ranks = {r: record(r, loaders=[loader([iteration(idx, [["a", "b", "c", "d"]])])]) for r in (0, 1)}
    assert ids_of(sampler_rules(ranks)) == ["DDP850"]


def test_iterable_dataset_overlap_is_judged_by_contents():
    its = {r: iteration([None, None], [["a", "b"], ["c", "d"]]) for r in (0, 1)}
    ranks = {r: record(r, loaders=[loader([its[r]], map_style=False, sampler="_InfiniteConstantSampler")])
             for r in (0, 1)}
    assert ids_of(sampler_rules(ranks)) == ["DDP850"]
    its[1] = iteration([None, None], [["e", "f"], ["g", "h"]])
    ranks = {r: record(r, loaders=[loader([its[r]], map_style=False, sampler="_InfiniteConstantSampler")])
             for r in (0, 1)}
    assert sampler_rules(ranks) == []


def test_unsharded_loader_without_evidence_is_a_warning_and_eval_loaders_are_ignored():
    ranks = {r: record(r, loaders=[loader([iteration([[r * 10 + i for i in range(4)]])])]) for r in (0, 1)}
    [f] = sampler_rules(ranks)
    assert f.id == "DDP853" and f.severity == "warning" and "RandomSampler" in f.message
    ranks = {r: record(r, loaders=[loader([iteration([[0, 1, 2, 3]], training=False)])]) for r in (0, 1)}
    assert sampler_rules(ranks) == []  # never iterated while the optimizer stepped


def test_same_order_every_epoch():
    e0 = iteration([[5, 2, 7, 1]], number=0, epoch=0)
    e1 = iteration([[5, 2, 7, 1]], number=1, epoch=0)
    ds = dict(sampler="DistributedSampler", distributed=True)
    [f] = sampler_rules({0: record(0, loaders=[loader([e0, e1], **ds)])})
    assert f.id == "DDP852" and "sampler.epoch stayed 0" in f.message
    moved = iteration([[3, 6, 0, 4]], number=1, epoch=1)
    assert sampler_rules({0: record(0, loaders=[loader([e0, moved], **ds)])}) == []
    # A sequential (not shuffling) loader is in the same order every epoch by design.
    seq = [iteration([[0, 1, 2, 3]], number=n) for n in (0, 1)]
    assert sampler_rules({0: record(0, world_size=1, loaders=[loader(seq, shuffle=False,
                                                                        sampler="SequentialSampler")])}) == []


# ------------------------------------------------------------------ consistency

def sums(values, kinds=None, names=None, step=1) -> dict:
    names = names or [f"w{i}" for i in range(len(values))]
    return {"step": step, "names": names, "kinds": kinds or ["param"] * len(values), "sum": list(values),
            "abs": [abs(v) for v in values]}


def test_parameters_diverged_names_ranks_and_tensors():
    ranks = {0: record(0, checksums={"first_step": sums([1.0, 2.0])}),
             1: record(1, checksums={"first_step": sums([1.0, 2.5])})}
    [f] = replica_divergence(ranks)
    assert f.id == "DDP870" and f.ranks == [0, 1] and "w1" in f.message and "1 of 2" in f.message
    ranks[1]["checksums"]["first_step"] = sums([1.0, 2.0 + 1e-9])  # float noise is not divergence
    assert replica_divergence(ranks) == []


def test_divergence_at_the_end_compares_equal_steps_only():
    ranks = {0: record(0, checksums={"first_step": sums([1.0]), "end": sums([3.0], step=10)}),
             1: record(1, checksums={"first_step": sums([1.0]), "end": sums([3.5], step=10)}),
             2: record(2, checksums={"first_step": sums([1.0]), "end": sums([9.0], step=7)})}
    [f] = replica_divergence(ranks)
    assert f.ranks == [0, 1] and "at the end (step 10)" in f.message


def test_batchnorm_running_stats_are_not_compared_other_buffers_are():
    kinds = ["param", "buffer", "buffer"]
    names = ["w", "bn.running_mean", "pos.table"]
    ranks = {0: record(0, checksums={"first_step": sums([1.0, 0.1, 5.0], kinds, names)}),
             1: record(1, checksums={"first_step": sums([1.0, 0.2, 5.0], kinds, names)})}
    assert replica_divergence(ranks) == []
    ranks[1]["checksums"]["first_step"] = sums([1.0, 0.2, 6.0], kinds, names)
    [f] = replica_divergence(ranks)
    assert f.id == "DDP871" and "pos.table" in f.message


def test_data_straggler_needs_ratio_and_absolute_gap():
    def with_times(r, t):
        return record(r, loaders=[loader([iteration([[0]])], data_times=[1.0] + [t] * 10)])
    [f] = stragglers({0: with_times(0, 0.005), 1: with_times(1, 0.080)})
    assert f.id == "DDP872" and f.ranks == [1] and "80.0 ms" in f.message
    assert stragglers({0: with_times(0, 0.001), 1: with_times(1, 0.004)}) == []  # 4x but 3 ms
    assert stragglers({0: with_times(0, 0.100), 1: with_times(1, 0.150)}) == []  # 50 ms but 1.5x


def test_batch_scaling_info_and_teardown():
    args = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "world_size": 4,
            "learning_rate": 5e-4}
    [f] = batch_scaling({0: record(0, extra={"trainer_args": args})})
    assert f.id == "DDP873" and f.severity == "info" and "global batch 64" in f.message
    made = [event("init_process_group", ok=True, backend="gloo")]
    left = {r: record(r, events=made, ended={"pg_initialized": True, "exit_code": 0}) for r in (0, 1)}
    [t] = teardown(left)
    assert t.id == "DDP880" and t.ranks == [0, 1] and t.phase == "teardown"
    assert "DDP880" not in ids_of(probe_findings(left.values(), failed=True))  # a failed job: not judged
    by_lib = {r: record(r, events=[dict(made[0], by_library=True)], ended={"pg_initialized": True, "exit_code": 0})
              for r in (0, 1)}
    assert teardown(by_lib) == []  # Trainer/Lightning made the group: theirs to manage
    done = copy.deepcopy(left)
    for rec in done.values():
        rec["ended"]["pg_initialized"] = False
    assert teardown(done) == []


def test_a_spawn_parent_does_not_shadow_the_rank_it_started():
    parent = record(0, pg={}, steps=0, loaders=[])
    child = record(0, steps=5)
    assert by_rank([parent, child])[0] is child
    assert by_rank([child, parent])[0] is child


def test_data_straggler_is_a_statistical_claim_and_weighs_the_hosts_load():
    from ddp_doctor.checks import host_busy
    from ddp_doctor.facts.host_load import LoadWindow

    def with_series(r, times):
        return record(r, loaders=[loader([iteration([[0]])], data_times=[1.0] + list(times))])
    steady = {0: with_series(0, [0.005] * 12), 1: with_series(1, [0.080] * 12)}
    [f] = stragglers(steady)
    assert f.severity == "warning" and "longer at 12 of 12 batches" in f.message and f.evidence["p"] < 0.005
    # five batches: too few to say
    assert stragglers({0: with_series(0, [0.005] * 5), 1: with_series(1, [0.080] * 5)}) == []
    # its median is 16x the others', but it is slower at only 7 of 12 batches (p = 0.39): no claim
    mixed = {0: with_series(0, [0.005] * 12), 1: with_series(1, [0.080] * 7 + [0.001] * 5)}
    assert stragglers(mixed) == []
    # the same steady rank on a busy host: info, saying so; on a quiet one: a warning
    busy = host_busy.read({r: LoadWindow(2.0, 0.5, 2.0, 0.0, 4.0, 2, 1.0, 9.0) for r in (0, 1)}, {0: "a", 1: "a"})
    [f] = stragglers(steady, busy)  # 16x the others at every batch: far above a busy host's noise
    assert f.severity == "warning" and "far beyond what the load's noise does" in f.message
    modest = {0: with_series(0, [0.020] * 12), 1: with_series(1, [0.050] * 12)}  # 2.5x: the load could
    [f] = stragglers(modest, busy)
    assert f.severity == "info" and "the host was busy while it trained" in f.message
    quiet = host_busy.read({r: LoadWindow(1.8, 0.9, 1.8, 0.0, 1.0, 2, 1.0, 9.0) for r in (0, 1)}, {0: "a", 1: "a"})
    [f] = stragglers(steady, quiet)
    assert f.severity == "warning"
