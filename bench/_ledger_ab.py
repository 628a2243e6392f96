"""The collective ledger's cost, for bench/overhead.py (case "ledger").

One process, a world of one (gloo, HashStore), a DDP MLP fed by a DistributedSampler DataLoader
(epoch after epoch, set_epoch each), that also all_reduces its loss from Python every step (the
logging pattern: one call-site wrapper call per step, the wrappers' worst case in a plain loop).
Timing is by short blocks of --block-steps steps: on a shared machine the minimum over many short
blocks is what other load does not inflate (a whole epoch rarely runs undisturbed). Each block's
wall time and process CPU time (all threads) are taken. Two modes:

--mode sites: the call-site wrappers of ddp_doctor/training/probes/collective_sites.py, installed
    as `ddp-doctor run` installs them (probes/install.py), switched off (torch's originals put
    back) and on between blocks, in turn order (off, on, on, off, ...) over --pairs rounds; the
    other probes are off in both variants, so the figure is the ledger's wrappers against plain
    torch. Also times the wrapper's own cost per call (around a function that does nothing, finer
    than a block's noise), and one ledger dump (`ledger.write`: the flight recorder's full buffer
    + the call sites) into a temporary directory, which happens only at a rank's endings. Run it
    with TORCH_FR_BUFFER_SIZE=2000 as `run` sets it, so the buffer is full when the dump is timed.
--mode fr: the same loop, no probes at all, --blocks blocks. The flight recorder is a process-wide
    setting read once (TORCH_FR_BUFFER_SIZE; on torch 2.13 gloo it records even when the variable
    is unset, 0 turns it off), so bench/overhead.py runs this mode in separate processes,
    alternating 0 and 2000. Also times one scalar all_reduce alone (wall, and the main thread's CPU
    time) and counts the collectives the recorder keeps per step.
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter
from torch.utils.data.distributed import DistributedSampler

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=("sites", "fr"), required=True)
ap.add_argument("--pairs", type=int, default=100, help="sites: rounds of off/on blocks")
ap.add_argument("--blocks", type=int, default=40, help="fr: blocks timed (after a warm-up epoch)")
ap.add_argument("--block-steps", type=int, default=25)
ap.add_argument("--epoch-steps", type=int, default=100)
ap.add_argument("--batch-size", type=int, default=32)
args = ap.parse_args()

torch.set_num_threads(1)
site_wrappers: list[tuple[object, str, object]] = []
if args.mode == "sites":
    from torch.optim import optimizer as optim_module

    from ddp_doctor.facts.frames import COLLECTIVES
    from ddp_doctor.training.probes import collective_sites, dist_wrappers, recorder
    from ddp_doctor.training.probes.install import install
    install(tempfile.mkdtemp(prefix="ddp-bench-ledger-"))
    recorder._current = None  # the other probes record nothing ...
    hooks = optim_module._global_optimizer_post_hooks
    for key in [k for k, h in hooks.items() if h is dist_wrappers.on_optimizer_step]:
        del hooks[key]
    for owner, name in ((_BaseDataLoaderIter, "__next__"), (_BaseDataLoaderIter, "_next_index"),
                        (DataLoader, "__iter__"), (DataLoader, "__init__"), (DistributedSampler, "set_epoch"),
                        (DDP, "__init__")):
        fn = getattr(owner, name)
        setattr(owner, name, getattr(fn, "_ddp_doctor_orig", fn))  # ... and are not even called
    for owner in (dist, c10d):
        for name in COLLECTIVES:
            fn = getattr(owner, name, None)
            if fn is not None and hasattr(fn, "_ddp_doctor_orig"):
                site_wrappers.append((owner, name, fn))
    if not site_wrappers:
        raise SystemExit("the call-site wrappers are not installed")
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def wrappers(on: bool) -> None:
    for owner, name, fn in site_wrappers:
        setattr(owner, name, fn if on else fn._ddp_doctor_orig)


torch.manual_seed(0)
n = args.epoch_steps * args.batch_size
data = TensorDataset(torch.randn(n, 256), torch.randint(0, 10, (n,)))
sampler = DistributedSampler(data, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
model = DDP(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def batches():
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        epoch += 1
        yield from loader


feed = batches()


def block(steps: int) -> tuple[float, float]:
    """(wall s, CPU s) of `steps` training steps."""
    t, c = time.perf_counter(), time.process_time()
    for _ in range(steps):
        xb, yb = next(feed)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)  # the logging pattern: a Python-level collective every step
    return time.perf_counter() - t, time.process_time() - c


def per_call(calls: int = 50, clock=time.perf_counter) -> float:
    """Seconds of one scalar dist.all_reduce, over `calls` calls, by `clock`."""
    scalar = torch.zeros(1)
    t = clock()
    for _ in range(calls):
        dist.all_reduce(scalar)
    return (clock() - t) / calls


def last_record() -> int:
    """The flight recorder's newest record id (-1: it records nothing)."""
    try:
        entries = json.loads(torch._C._distributed_c10d._dump_fr_trace_json(
            includeCollectives=True, onlyActive=False)).get("entries") or []
    except Exception:  # noqa: BLE001 - no recorder in this torch
        return -1
    return max((int(e.get("record_id", -1)) for e in entries), default=-1)


S = args.block_steps
if args.mode == "fr":
    block(args.epoch_steps)  # warm-up
    before = last_record()
    got = [block(S) for _ in range(args.blocks)]
    per_step = (last_record() - before) / (args.blocks * S) if before >= 0 else 0.0
    call = min(per_call() for _ in range(200))
    # the main thread's CPU time: what the recorder adds where the collective is issued, without the
    # wake-ups of gloo's thread, which swing with the machine's load
    call_cpu = min(per_call(clock=time.thread_time) for _ in range(200))
    dist.destroy_process_group()
    walls = [w for w, _ in got]
    print(f"fr_step_us={min(walls) / S * 1e6:.3f} fr_step_us_median={statistics.median(walls) / S * 1e6:.3f} "
          f"fr_cpu_us={min(c for _, c in got) / S * 1e6:.3f} call_us={call * 1e6:.3f} "
          f"call_cpu_us={call_cpu * 1e6:.3f} "
          f"recorded_per_step={per_step:.2f} buffer={os.environ.get('TORCH_FR_BUFFER_SIZE', '')}", flush=True)
    raise SystemExit(0)

wrappers(True)
block(args.epoch_steps)  # warm-up
wall: dict[bool, list[float]] = {False: [], True: []}
cpu: dict[bool, list[float]] = {False: [], True: []}
for i in range(args.pairs):
    for on in ((False, True) if i % 2 == 0 else (True, False)):
        wrappers(on)
        w, c = block(S)
        wall[on].append(w)
        cpu[on].append(c)
ratios = sorted(off / on for off, on in zip(wall[False], wall[True]))  # adjacent blocks
paired, q1, q3 = statistics.median(ratios), ratios[len(ratios) // 4], ratios[3 * len(ratios) // 4]

# The wrapper's own time, without the collective's (a scalar all_reduce hands its work to gloo's
# thread and waits: its wake-ups swing with the machine's load far more than the wrapper's cost):
# the same wrapper around a function that does nothing, against that function, called from here.


def nothing(*args: object, **kwargs: object) -> None:
    return None


def time_calls(fn, calls: int = 2000) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn(None)
    return (time.perf_counter() - t) / calls


wrapped = collective_sites.collective_wrapper("all_reduce")(nothing)
calls: dict[bool, list[float]] = {False: [], True: []}
for i in range(200):
    for on in ((False, True) if i % 2 == 0 else (True, False)):
        calls[on].append(time_calls(wrapped if on else nothing))

from ddp_doctor.training.run import ledger  # noqa: E402

wrappers(True)
per_call(2000)  # the recorder's buffer and the wrapper's ring full: the dump timed is the largest
dump = ledger.dump() or {}
entries = len(dump.get("entries") or [])
with tempfile.TemporaryDirectory(prefix="ddp-bench-ledger-dump-") as run_dir:
    dumps = []
    for _ in range(5):
        t = time.perf_counter()
        ledger.write(run_dir, 0, "finished", steps=1)
        dumps.append(time.perf_counter() - t)
    files = os.listdir(run_dir)
    size = os.path.getsize(os.path.join(run_dir, files[0])) if files else 0
dist.destroy_process_group()
print(f"step_us_off={min(wall[False]) / S * 1e6:.3f} step_us_on={min(wall[True]) / S * 1e6:.3f} "
      f"cpu_us_off={min(cpu[False]) / S * 1e6:.3f} cpu_us_on={min(cpu[True]) / S * 1e6:.3f} "
      f"paired_ratio={paired:.4f} paired_q1={q1:.4f} paired_q3={q3:.4f} "
      f"call_us_off={min(calls[False]) * 1e6:.3f} call_us_on={min(calls[True]) * 1e6:.3f} "
      f"dump_ms={min(dumps) * 1e3:.3f} dump_entries={entries} dump_calls={len(collective_sites.calls())} "
      f"dump_bytes={size}", flush=True)
