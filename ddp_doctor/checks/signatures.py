"""Known error signatures: an exception's text -> a finding that says what it means and what to do.

Each signature is a catalogue entry (category training_failure, IDs DDP820 on) plus regular
expressions matched against "Type: message" and the traceback text of the failing rank.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ddp_doctor.registry import Check, declare


@dataclass(frozen=True)
class Signature:
    entry: Check
    patterns: tuple[re.Pattern[str], ...]
    consequence: bool = False  # the error is a symptom of another rank's failure
    # Only a collective raises this error (a timeout, a lost peer, NCCL's own), also from DDP's C++
    # reducer inside backward(), where no Python frame of torch.distributed is on the traceback.
    collective: bool = False

    def matches(self, text: str) -> bool:
        return any(p.search(text) for p in self.patterns)


SIGNATURES: list[Signature] = []


def signature(id: str, title: str, patterns: list[str], doc: str, *, consequence: bool = False,
              severity: str = "error", collective: bool = False, cause_class: str = "",
              action: str = "") -> Signature:
    sig = Signature(declare(id, category="training_failure", severity=severity, title=title, doc=doc,
                            cause_class=cause_class, action=action),
                    tuple(re.compile(p, re.I | re.S) for p in patterns), consequence, collective)
    SIGNATURES.append(sig)
    return sig


def classify(text: str) -> Signature | None:
    """The first signature (catalogue order) whose pattern matches the failure text."""
    for sig in SIGNATURES:
        if sig.matches(text):
            return sig
    return None


signature("DDP820", "MASTER_ADDR / MASTER_PORT / RANK expected but not set", [
    r"environment variable (MASTER_ADDR|MASTER_PORT|RANK|WORLD_SIZE) expected, but not set"], doc="""
    What: init_process_group(init_method="env://") found a rendezvous variable missing.
    Why: The script was started without a launcher (plain `python train.py`), or a launcher that
    does not set torch's variables (mpirun without -x MASTER_ADDR).
    Fix: Start it with `ddp-doctor run --nproc-per-node N train.py` or torchrun; under mpirun pass
    `-x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500` and set RANK/WORLD_SIZE from OMPI_COMM_WORLD_*.
    """, cause_class="configuration")

signature("DDP821", "Address already in use", [r"EADDRINUSE", r"address already in use"], doc="""
    What: The store or a backend could not listen on its port because another process holds it.
    Why: A previous job or a hung test still holds MASTER_PORT, or two jobs share one port.
    Fix: Stop the process holding the port (`ss -ltnp 'sport = :PORT'`) or pick another
    MASTER_PORT (torchrun --master-port, or --standalone on a single node).
    """, cause_class="network")

signature("DDP822", "Default process group initialised twice", [
    r"trying to initialize the default process group twice"], doc="""
    What: init_process_group was called while a default process group already existed.
    Why: The script (or a library such as Trainer/Accelerate) already initialised it; a second call
    fails.
    Fix: Guard the call with `if not dist.is_initialized():`, or leave initialisation to the
    library that does it.
    """)

signature("DDP823", "DDP reduction not finished: unused parameters", [
    r"Expected to have finished reduction in the prior iteration"], doc="""
    What: DistributedDataParallel found parameters that received no gradient in an iteration, and
    the next forward raised "Expected to have finished reduction in the prior iteration ... Parameter
    indices which did not receive grad for rank N: 4 5" (torch names them only under
    TORCH_DISTRIBUTED_DEBUG=INFO/DETAIL). The finding names them, and the rank whose iteration left
    them unused ("rank 1: parameters unused in its iteration (DDP did not receive their gradient):
    head.weight (index 4), head.bias (index 5)"), from the names the probes record as each DDP model
    is built, in the order DDP counts them; without that record, torch's own words.
    Why: Part of the model is not used in forward (a head or an auxiliary loss left out, a frozen
    part still requiring grad) or not on every iteration (a conditional branch), so DDP waits for
    gradients that never come. When only some ranks raise it (the others fail after them), their
    forward took a path the others did not: a branch on the rank, on the data or on a flag.
    Fix: Pass find_unused_parameters=True to DistributedDataParallel (Trainer:
    ddp_find_unused_parameters=True); or make every parameter take part in the loss on every rank
    (use the named ones, drop them from the model, or set requires_grad=False on them before
    wrapping the model); when the same parameters are unused in every iteration, static_graph=True
    works too.
    """)

signature("DDP847", "DDP parameter marked ready twice (reentrant checkpointing)", [
    r"Expected to mark a variable ready only once"], doc="""
    What: DistributedDataParallel received the gradient of one parameter twice in one backward
    pass: "Expected to mark a variable ready only once ... Parameter at index 3 with name
    block.lin.bias has been marked as ready twice". The finding names the parameter and its module
    (from torch's message, or from the names the probes recorded when it gives the index only).
    Why: Activation checkpointing in its reentrant mode (torch.utils.checkpoint with
    use_reentrant=True, the old default; Hugging Face gradient_checkpointing) runs a separate
    backward for each checkpointed part: a module checkpointed twice, or used in two reentrant
    passes, fires DDP's hook twice, and with find_unused_parameters=True DDP also marks the
    parameters of a checkpointed part unused before its backward runs. A parameter used outside
    forward, or by two concurrent forward-backward passes, does it too.
    Fix: Checkpoint with torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)
    (Trainer: gradient_checkpointing_kwargs={"use_reentrant": False}); or pass static_graph=True to
    DistributedDataParallel when the graph is the same every iteration; or drop
    find_unused_parameters=True (find_unused_parameters=False) when every parameter is used.
    """)

# Order matters: classify() takes the first match, so a specific signature comes before a generic
# one that could also match its text (the NCCL watchdog timeout before the generic NCCL error, a
# store timeout before a collective timeout, the deprecated smdistributed import before the
# missing library, an invalid device ordinal before "no CUDA"; the heartbeat monitor and a
# collective mismatch before the watchdog timeout; a duplicate GPU, an illegal memory access and
# CUDA in a forked child before the generic NCCL error, whose texts they also contain).

signature("DDP841", "NCCL heartbeat monitor: the watchdog itself was stuck", [
    r"Heartbeat monitor timed out",
    r"watchdog got stuck for \d+ seconds without making progress",
    r"NCCL monitor thread timeout"], doc="""
    What: ProcessGroupNCCL's heartbeat monitor found the NCCL watchdog thread itself stuck
    ("Heartbeat monitor timed out! Process will be terminated after dumping debug info", "the
    watchdog got stuck for 600 seconds without making progress in monitoring enqueued
    collectives") and ended the process.
    Why: Not a slow collective (that is DDP824's watchdog timeout) but a hang below it: a CUDA or
    NCCL call that blocks (a GPU fault, a deadlocked NCCL communicator), or another thread holding
    the GIL inside a CUDA API; it often follows a peer that died or a collective mismatch.
    Fix: Look first at the other ranks' errors (the earliest is the cause); run with
    TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 to get each rank's last
    collectives, or `ddp-doctor run --hang-timeout S` for every rank's stack. If the watchdog was
    only slow (very long collectives on a loaded host), raise TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC.
    """, cause_class="unknown")

signature("DDP842", "Ranks called different collectives (TORCH_DISTRIBUTED_DEBUG=DETAIL)", [
    r"Detected mismatch between collectives on ranks"], doc="""
    What: With TORCH_DISTRIBUTED_DEBUG=DETAIL, torch compared each collective across the ranks
    before running it and found ranks at the same point running different collectives, or the
    same collective on different shapes or dtypes ("Detected mismatch between collectives on
    ranks. Rank 1 is running collective: CollectiveFingerPrint(...), but Rank 0 is running ...").
    Why: A rank-dependent branch (logging or evaluation on rank 0 only, an early exit, a
    different number of batches per rank), a model whose parameters differ between ranks, or
    metrics dicts with different keys per rank. Without DETAIL this would hang until the timeout.
    Fix: Read the two fingerprints and the "Collectives differ in the following aspects" part:
    make every rank call the same collectives in the same order with the same shapes (pad or
    gather sizes first; run rank-0-only work outside collectives).
    """)

signature("DDP824", "NCCL watchdog timeout", [
    r"Watchdog caught collective operation timeout",
    r"Some NCCL operations have failed or timed out",
    r"ProcessGroupNCCL.{0,200}tim(ed|ing) out"], collective=True, doc="""
    What: NCCL's watchdog found a collective (all_reduce, broadcast, ...) that had not finished
    within the process group's timeout (10 minutes by default for NCCL) and aborted it.
    Why: Not every rank reached the same collective: a straggler (slow data loading, a checkpoint
    written by rank 0 only, evaluation on one rank), a rank that took another branch and called a
    different or extra collective, or a rank that died. The rank named in the message is one that
    waited, not necessarily the culprit.
    Fix: Find the rank that was not in the collective: run with TORCH_NCCL_TRACE_BUFFER_SIZE=2000
    and TORCH_NCCL_DUMP_ON_TIMEOUT=1 (the flight recorder dumps each rank's last collectives) or
    TORCH_DISTRIBUTED_DEBUG=DETAIL, or with `ddp-doctor run --hang-timeout S` for every rank's
    stack; make all ranks call the same collectives in the same order; if a long rank-0-only step
    is expected, raise the timeout (init_process_group(timeout=...), Trainer's ddp_timeout).
    """, cause_class="unknown")

signature("DDP835", "A wait at the rendezvous store timed out", [
    r"waiting for clients\. \d+/\d+ clients joined",
    r"DistStoreError",
    r"Socket Timeout",
    r"wait timeout after \d+ ?ms, keys"], doc="""
    What: The rendezvous store (hosted by rank 0 / the launcher on MASTER_ADDR:MASTER_PORT) gave up
    waiting: not all WORLD_SIZE ranks joined, or a key a rank waits for never appeared.
    Why: Fewer processes were launched than WORLD_SIZE says (wrong --nnodes/--nproc-per-node, a
    node that never started or started late), a rank that cannot reach MASTER_ADDR:MASTER_PORT
    (security group, firewall, wrong interface), or a rank that died before joining.
    Fix: Make WORLD_SIZE equal nodes x processes per node and start every node (check each node's
    log for its own error); run `ddp-doctor preflight` on every node to test reachability of the
    master; on SageMaker allow all traffic between members of the job's security group.
    """, cause_class="network", action="investigate")

signature("DDP825", "Collective timed out (gloo)", [
    r"Timed out waiting \d+ ?ms for (recv|send) operation",
    r"gloo.{0,200}Timed out",
    r"Timed out waiting .{0,80} for"], collective=True, doc="""
    What: A gloo collective (or send/recv) on this rank waited longer than the process group's
    timeout (30 minutes by default) for another rank.
    Why: Another rank did not reach the same collective in time: it is slower (a straggler), stuck
    (I/O, a deadlock, a rank-dependent branch), called a different collective, or died. This is
    not labelled a consequence by itself: when another rank failed first, that rank is the root
    cause and this one is listed as failing after it; when no other rank failed, the missing rank
    left no error and this timeout is the first sign of it.
    Fix: Look at what the other ranks were doing (their findings, or `ddp-doctor run
    --hang-timeout S`, which records every rank's stack); use dist.monitored_barrier() to name the
    ranks that do not arrive; make every rank call the same collectives in the same order; raise
    init_process_group(timeout=...) only for steps that are legitimately long on one rank.
    """, cause_class="unknown")

signature("DDP826", "Connection to a peer rank lost", [
    r"Connection (closed|reset) by peer",
    r"gloo.{0,200}(Broken pipe|Connection refused)"], consequence=True, collective=True, doc="""
    What: A gloo connection to another rank (or the store) was closed while this rank was in a
    collective ("Connection closed by peer", "Connection reset by peer").
    Why: The other process is gone: it raised an exception, was killed (out-of-memory killer,
    SIGKILL, a node lost) or exited early. This rank's error is a consequence, not the cause.
    Fix: Read the error of the rank that ended first (the report's root cause); if that rank left
    no Python error, check its host for the OOM killer (`dmesg | grep -i killed`) or a crash.
    """, cause_class="network", action="investigate")

signature("DDP827", "DataLoader worker out of shared memory (/dev/shm)", [
    r"DataLoader worker \(pid.{0,40}\) is killed by signal: Bus error",
    r"unable to (write to|allocate shared memory\(shm\) for) file </torch_",
    r"No space left on device.{0,200}/dev/shm",
    r"/dev/shm.{0,200}No space left on device",
    r"out of shared memory"], doc="""
    What: A DataLoader worker could not hand its batch to the training process through shared
    memory: a bus error (SIGBUS) or "unable to write to / allocate shared memory ... No space left
    on device" for a /torch_* segment in /dev/shm.
    Why: /dev/shm is too small for num_workers x prefetch_factor batches. Docker gives containers
    64 MB unless told otherwise; SageMaker sizes /dev/shm with the instance, but a local-mode or
    custom container does not.
    Fix: Give the container more shared memory (`docker run --shm-size=8g` or `--ipc=host`; in
    Kubernetes an emptyDir with medium: Memory mounted at /dev/shm); or lower num_workers /
    prefetch_factor / batch size; `ddp-doctor preflight` warns when /dev/shm is small (DDP600).
    """, cause_class="configuration")

signature("DDP828", "CUDA out of memory", [
    r"CUDA out of memory",
    r"OutOfMemoryError",
    r"CUDA error: out of memory"], doc="""
    What: A CUDA allocation failed on this rank's GPU.
    Why: The batch, the model, optimizer states and activations do not fit, or several ranks share
    one GPU (LOCAL_RANK not used for the device), or memory is fragmented.
    Fix: Check that each rank uses cuda:LOCAL_RANK (`ddp-doctor preflight` DDP504/DDP701); lower
    the per-device batch size (use gradient accumulation), enable mixed precision or gradient
    checkpointing; try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation.
    """, cause_class="configuration")

signature("DDP829", "SM_HOSTS / a SageMaker host name parsed as an int", [
    r"invalid literal for int\(\) with base 10: '\[",
    r"invalid literal for int\(\) with base 10: '\"?algo-\d+"], doc="""
    What: int() was applied to SM_HOSTS (or to a host name such as algo-1).
    Why: SM_HOSTS is a JSON list of host names (`["algo-1","algo-2"]`), not a count, and host names
    are not ranks.
    Fix: `hosts = json.loads(os.environ["SM_HOSTS"])`, `num_hosts = len(hosts)`; take ranks from the
    launcher (RANK / LOCAL_RANK under torchrun, OMPI_COMM_WORLD_* under mpirun), never from the
    algo-N suffix.
    """)

signature("DDP830", "Deprecated smdistributed API", [
    r"smdistributed\.dataparallel\.torch\.(distributed|parallel)\b"], doc="""
    What: The script imports the old smdistributed API
    (`smdistributed.dataparallel.torch.distributed` / `.parallel.distributed`).
    Why: That API is deprecated since smdistributed-dataparallel v1.4.0 and missing from current
    SageMaker containers (and smdistributed exists only inside SageMaker's GPU containers).
    Fix: `import smdistributed.dataparallel.torch.torch_smddp`, then
    `torch.distributed.init_process_group(backend="smddp")` and the native
    torch.nn.parallel.DistributedDataParallel.
    """)

signature("DDP831", "smdistributed not installed", [
    r"No module named '?smdistributed"], doc="""
    What: `import smdistributed...` failed: the library is not installed.
    Why: smdistributed dataparallel ships only in SageMaker's PyTorch GPU training containers on
    supported instance types (ml.p4d.24xlarge, ml.p4de.24xlarge); it cannot be pip-installed, so a
    local run, a custom image or a CPU container lacks it.
    Fix: Run on a SageMaker PyTorch GPU container with distribution={"smdistributed":
    {"dataparallel": {"enabled": True}}}; elsewhere use backend="nccl" (GPU) or "gloo" (CPU) with
    torchrun, guarded by a try/except around the smdistributed import.
    """, cause_class="configuration")

signature("DDP832", "Trainer received an empty batch (model wrapped in DDP by hand)", [
    r"The batch received was empty"], doc="""
    What: Hugging Face Trainer raised "The batch received was empty".
    Why: Trainer keeps only the dataset columns named in model.forward's signature. A model
    wrapped in DistributedDataParallel by hand has forward(*inputs, **kwargs), so every column is
    removed; it also happens when the dataset's keys do not match the model's arguments.
    Fix: Pass the bare model to Trainer: it wraps it in DDP itself under torchrun / SageMaker
    (set ddp_find_unused_parameters etc. in TrainingArguments); otherwise rename the dataset
    columns to the model's argument names, or set remove_unused_columns=False.
    """)

signature("DDP833", "Default process group not initialised", [
    r"Default process group has not been initialized"], doc="""
    What: A torch.distributed call (a collective, get_rank, DistributedDataParallel,
    DistributedSampler) ran before any init_process_group.
    Why: The script calls init_process_group only when it detects a launcher (for example only
    when LOCAL_RANK is set) and was started as a plain `python train.py`, or it calls it after
    building DDP / the sampler.
    Fix: Call dist.init_process_group(...) at the start of every rank, and start the script with a
    launcher (`ddp-doctor run --nproc-per-node N train.py` or torchrun) that sets RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT.
    """)

signature("DDP834", "Rank variable missing from the environment", [
    r"KeyError: '(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|NODE_RANK|MASTER_ADDR"
    r"|MASTER_PORT|SMDATAPARALLEL_LOCAL_RANK|OMPI_COMM_WORLD_\w+)'"], doc="""
    What: The script read a launcher's variable (os.environ["RANK"], ["LOCAL_RANK"],
    ["WORLD_SIZE"], ...) and it was not set.
    Why: The script was started without a launcher (plain `python train.py`, a SageMaker job
    without a distribution), or by a launcher that sets other names (mpirun sets OMPI_COMM_WORLD_*,
    SLURM sets SLURM_PROCID).
    Fix: Start it with `ddp-doctor run --nproc-per-node N train.py` or torchrun (which set RANK,
    LOCAL_RANK, WORLD_SIZE), or on SageMaker with distribution={"torch_distributed": {"enabled":
    True}}; read them with defaults (`int(os.environ.get("LOCAL_RANK", 0))`) when one process is
    a valid run.
    """, cause_class="configuration")

signature("DDP836", "Model differs between ranks", [
    r"DDP expects same model across all ranks",
    r"appears not to match sizes of the same param in process",
    r"appears not to match strides of the same param in process"], doc="""
    What: DistributedDataParallel's construction check found that the ranks built different models
    (different parameter counts or shapes).
    Why: The model depends on something that differs per rank: a config read from a rank-local
    path, a vocabulary built from each rank's data shard, random architecture choices, a code
    version that differs between nodes.
    Fix: Build the same model on every rank: derive sizes from shared config, build vocabularies
    on rank 0 and broadcast them, deploy the same code to every node (`ddp-doctor preflight`
    compares code and library versions across ranks, DDP700/DDP705).
    """)

signature("DDP837", "CUDA invalid device ordinal", [
    r"invalid device ordinal"], doc="""
    What: The rank asked for a GPU index that does not exist on its host (CUDA "invalid device
    ordinal").
    Why: More processes per node than visible GPUs (--nproc-per-node larger than the GPU count,
    CUDA_VISIBLE_DEVICES narrowing the set), or the global RANK used as the device index instead
    of LOCAL_RANK on a second node.
    Fix: Use torch.cuda.set_device(int(os.environ["LOCAL_RANK"])); launch at most as many
    processes per node as GPUs (`ddp-doctor preflight` DDP109); check CUDA_VISIBLE_DEVICES.
    """, cause_class="configuration")

signature("DDP843", "Several ranks on the same GPU (NCCL \"Duplicate GPU detected\")", [
    r"Duplicate GPU detected"], doc="""
    What: NCCL refused to build its communicator because two ranks use the same GPU
    ("ncclInvalidUsage ... Duplicate GPU detected : rank 1 and rank 0 both on CUDA device ...").
    Why: Every rank of the host runs on cuda:0: the script never calls
    torch.cuda.set_device(LOCAL_RANK) (or uses the global RANK, or a hard-coded device), or
    CUDA_VISIBLE_DEVICES gives each rank the same single GPU. It is not a network problem.
    Fix: At the start of every rank: `local_rank = int(os.environ["LOCAL_RANK"])`,
    `torch.cuda.set_device(local_rank)`, and `DistributedDataParallel(model.to(local_rank),
    device_ids=[local_rank])`; do not give each process the same CUDA_VISIBLE_DEVICES
    (`ddp-doctor preflight` compares devices across ranks, DDP504/DDP701).
    """, cause_class="configuration")

signature("DDP844", "CUDA illegal memory access", [
    r"an illegal memory access was encountered"], doc="""
    What: A CUDA kernel read or wrote memory it does not own ("CUDA error: an illegal memory
    access was encountered"); the CUDA context of this rank is unusable afterwards.
    Why: An out-of-range index into an embedding or a gather (labels larger than the number of
    classes, a vocabulary larger than the embedding), a tensor on another rank's device (the
    rank did not call set_device(LOCAL_RANK)), a bug in a custom or compiled extension, or
    NCCL touching a buffer freed or resized under it. CUDA reports it asynchronously: the
    Python line in the traceback may not be the faulting one.
    Fix: Rerun with CUDA_LAUNCH_BLOCKING=1 (and TORCH_USE_CUDA_DSA builds for device-side
    asserts) to get the faulting line; check index ranges against the sizes (on CPU, one rank,
    the same batch gives a clear IndexError); make each rank use cuda:LOCAL_RANK.
    """, cause_class="unknown")

signature("DDP845", "CUDA initialised before fork", [
    r"Cannot re-initialize CUDA in forked subprocess"], doc="""
    What: A process started with fork (DataLoader workers, multiprocessing.Process, a fork-based
    launcher) used CUDA after its parent had initialised it ("Cannot re-initialize CUDA in forked
    subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start method").
    Why: The CUDA runtime cannot be used in a forked child once the parent touched the GPU: a
    dataset or collate_fn that moves tensors to the GPU in DataLoader workers, or ranks started
    with multiprocessing's default fork after torch.cuda was used in the parent.
    Fix: Keep DataLoader workers on the CPU (move the batch to the device in the training loop,
    pin_memory=True) or pass multiprocessing_context="spawn"; start ranks with
    torch.multiprocessing.spawn, torchrun or `ddp-doctor run` and do not touch CUDA in the parent
    before they start (torch.multiprocessing.set_start_method("spawn") at the top of __main__).
    """)

signature("DDP838", "NCCL error (network / system)", [
    r"unhandled system error",
    r"NCCL error in:",
    r"ncclSystemError|ncclInternalError|ncclRemoteError|ncclUnhandledCudaError",
    r"NCCL WARN"], collective=True, doc="""
    What: NCCL failed inside a collective or while connecting its ranks ("unhandled system error",
    ncclSystemError / ncclRemoteError, socket connect failures).
    Why: Most often the network: NCCL picked an interface that cannot reach the other nodes
    (docker0, a loopback-only NCCL_SOCKET_IFNAME), a firewall / security group blocks the ports
    NCCL opens, EFA/IB misconfigured; or /dev/shm too small for NCCL's intra-node buffers; or a peer
    died.
    Fix: Rerun with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,NET) to see the failing call; set
    NCCL_SOCKET_IFNAME to the interface that reaches the other nodes (eth0 on SageMaker); allow all
    traffic within the security group; `ddp-doctor preflight` checks interfaces and EFA settings.
    """, cause_class="network")

signature("DDP839", "CUDA not available", [
    r"Torch not compiled with CUDA enabled",
    r"module 'torch\._C' has no attribute '_cuda_\w+'",
    r"Found no NVIDIA driver on your system",
    r"No CUDA GPUs are available",
    r"ProcessGroupNCCL is only supported with GPUs"], doc="""
    What: The script used CUDA (a tensor or model on "cuda", set_device, backend nccl) where CUDA is
    not available.
    Why: A CPU-only torch build (there torch.cuda.set_device raises "AttributeError: module
    'torch._C' has no attribute '_cuda_setDevice'"), a CPU instance, a container started without
    GPUs (docker without --gpus), or CUDA_VISIBLE_DEVICES set to nothing.
    Fix: Run on a GPU instance with a CUDA build of torch; or make the script device-agnostic
    (`device = "cuda" if torch.cuda.is_available() else "cpu"`, backend "gloo" on CPU).
    """, cause_class="configuration")

signature("DDP840", "NCCL backend not available", [
    r"Distributed package doesn't have NCCL built in",
    r"NCCL is not available",
    r"Invalid backend: 'nccl'"], doc="""
    What: init_process_group(backend="nccl") on a torch build without NCCL.
    Why: NCCL exists only in CUDA builds of torch on Linux; a CPU build (or macOS / Windows) has
    gloo only.
    Fix: Use backend="gloo" on CPU (or `"nccl" if torch.cuda.is_available() else "gloo"`); on GPU
    hosts install a CUDA build of torch.
    """, cause_class="configuration")
