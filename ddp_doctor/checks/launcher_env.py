"""Local checks on what the launcher handed this rank: rank variables, rendezvous address, backend,
GPUs per node, and whether the launcher fits the SageMaker distribution (DDP100-DDP199).

Every check is pure over the RankContext: parse problems are already recorded in it
(`LauncherInfo.invalid`), so a check reads, compares and yields; it never raises on bad input.
"""
from __future__ import annotations

from typing import Iterator, Mapping, Sequence

from ddp_doctor.checks.sagemaker_config import host_evidence, hosts_text
from ddp_doctor.context import BACKENDS, RankContext
from ddp_doctor.facts.host import SMDDP_MODULE
from ddp_doctor.facts.launchers import RANK_VARIABLES, LauncherInfo, address_problem
from ddp_doctor.findings import Finding, Problem
from ddp_doctor.registry import REGISTRY, check

# Which of (rank, local rank, world size, local world size) each launcher must set, and how bad a
# missing one is. torchrun and Open MPI always set all four, so a gap means something removed them;
# a generic launcher may legitimately skip LOCAL_WORLD_SIZE, and hydra's local variables are recent.
REQUIRED: dict[str, tuple[str | None, str | None, str | None, str | None]] = {
    "torchrun": ("error", "error", "error", "error"),
    "mpirun": ("error", "error", "error", "error"),
    "mpich": ("error", "warning", "error", "warning"),
    "slurm": ("error", "error", "error", None),  # tasks per node may come from SLURM_STEP_TASKS_PER_NODE
    "env": ("error", "warning", "error", None),
}

MISSING_HINTS = {
    "torchrun": "torchrun sets RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE for every worker; "
                "do not unset or overwrite them in a wrapper script.",
    "mpirun": "Open MPI sets OMPI_COMM_WORLD_{RANK,LOCAL_RANK,SIZE,LOCAL_SIZE} for every rank it starts; "
              "start the script directly under `mpirun -np N ...`, not through a wrapper that clears the environment.",
    "mpich": "Use MPICH/Intel MPI's hydra launcher (`mpiexec -n N -ppn M ...`), which sets PMI_RANK, PMI_SIZE, "
             "MPI_LOCALRANKID and MPI_LOCALNRANKS.",
    "slurm": "Start the ranks with `srun` inside the allocation (`srun --ntasks-per-node=M python train.py`), "
             "which sets SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS.",
    "env": "Start the job with torchrun (`torchrun --nnodes N --nproc-per-node M train.py`), which sets RANK, "
           "LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE; or export all four for every process.",
}

GPU_BACKENDS = ("nccl", "smddp")


def _names(ctx: RankContext) -> tuple[str, str, str, str]:
    """The variable names this launcher uses for rank, local rank, world size, local world size."""
    return RANK_VARIABLES.get(ctx.launcher.name, RANK_VARIABLES["env"])


def _observed(ctx: RankContext) -> str:
    """`RANK=0, WORLD_SIZE=2, ...`: what the launcher set, for messages."""
    seen = [f"{k}={v}" for k, v in ctx.launcher.variables.items() if v not in (None, "")]
    return ", ".join(seen) if seen else "none of its variables"


def _cvd(ctx: RankContext) -> str:
    v = ctx.env.get("CUDA_VISIBLE_DEVICES")
    return "CUDA_VISIBLE_DEVICES is unset" if v is None else f"CUDA_VISIBLE_DEVICES={v!r}"


@check("DDP101", category="launcher_env", severity="error", title="Rank variables missing or not integers",
       severities=("warning",))
def rank_variables_present(ctx: RankContext) -> Iterator[Problem]:
    """
    What: The launcher that started this process (torchrun, mpirun, MPICH, srun, or one that sets
    RANK/WORLD_SIZE) did not set every variable that carries the rank layout, or set one that is not
    a whole number.
    Why: `init_process_group` and training scripts read these variables; a missing one raises
    KeyError('RANK') or makes a script (Hugging Face Trainer with no LOCAL_RANK) run without
    distribution, and a non-integer one fails before any rank meets the others.
    Fix: Start the job with a launcher that sets them all (`torchrun --nnodes N --nproc-per-node M
    train.py`), or export RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE as whole numbers for
    every process.
    Severity: error for a variable the launcher always sets; a warning for one that MPICH
    (LOCAL_RANK, LOCAL_WORLD_SIZE) or a plain environment launch (LOCAL_RANK) may leave out, since a
    script can do without it.
    """
    name = ctx.launcher.name
    required = REQUIRED.get(name)
    if required is not None:
        for var, severity in zip(_names(ctx), required):
            if severity and ctx.launcher.variables.get(var) in (None, ""):
                yield Problem(
                    message=f"{name} launcher: {var} is not set (observed: {_observed(ctx)})",
                    hint=MISSING_HINTS.get(name), severity=severity,
                    evidence={"launcher": name, "missing": var, "variables": dict(ctx.launcher.variables)})
    for var, bad in sorted(ctx.launcher.invalid.items()):
        if var == "MASTER_PORT":  # DDP105's business
            continue
        yield Problem(
            message=f"{name} launcher: {var}={bad.raw!r} is {bad.why}",
            hint=f"Set {var} to a whole number (e.g. {var}=0); it is read with int(os.environ[{var!r}]).",
            evidence={"launcher": name, "variable": var, "value": bad.raw})


@check("DDP102", category="launcher_env", severity="error", title="Rank variables out of range")
def rank_values_in_range(ctx: RankContext) -> Iterator[Problem]:
    """
    What: The rank numbers contradict each other: the rank is not below the world size, the local
    rank not below the local world size, the world size below 1, more processes on this node than in
    the whole job, or a node rank not below the number of nodes.
    Why: torch waits in `init_process_group` for WORLD_SIZE ranks numbered 0..WORLD_SIZE-1; a rank
    outside that range is refused or waits forever for peers that never come.
    Fix: Let one launcher compute every value (`torchrun --nnodes N --nproc-per-node M`, or
    `mpirun -np N`) instead of setting some by hand; WORLD_SIZE must equal nodes x processes per node.
    """
    rank_n, local_n, world_n, lworld_n = _names(ctx)
    r, lr, ws, lws = ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size
    ev = {"launcher": ctx.launcher.name, "rank": r, "local_rank": lr, "world_size": ws,
          "local_world_size": lws}
    if ws is not None and ws < 1:
        yield Problem(message=f"{world_n}={ws}: a job needs at least one rank", evidence=ev)
    elif r is not None and ws is not None and not 0 <= r < ws:
        yield Problem(message=f"{rank_n}={r} is outside 0..{ws - 1} ({world_n}={ws})", evidence=ev)
    if lws is not None and lws < 1:
        yield Problem(message=f"{lworld_n}={lws}: a node runs at least one rank", evidence=ev)
    elif lr is not None and lws is not None and not 0 <= lr < lws:
        yield Problem(message=f"{local_n}={lr} is outside 0..{lws - 1} ({lworld_n}={lws})", evidence=ev)
    elif lr is not None and lr < 0:
        yield Problem(message=f"{local_n}={lr} is negative", evidence=ev)
    if lws is not None and ws is not None and 1 <= ws < lws:
        yield Problem(message=f"{lworld_n}={lws} is larger than {world_n}={ws}", evidence=ev)
    # Node rank: only where the launcher states it (torchrun GROUP_RANK, srun SLURM_NODEID).
    if ctx.launcher.name in ("torchrun", "slurm"):
        nr, nn = ctx.node_rank, ctx.nnodes
        nr_n, nn_n = (("GROUP_RANK", "GROUP_WORLD_SIZE") if ctx.launcher.name == "torchrun"
                      else ("SLURM_NODEID", "SLURM_NNODES"))
        if nr is not None and nn is not None and not 0 <= nr < nn:
            yield Problem(message=f"{nr_n}={nr} is outside 0..{nn - 1} ({nn_n}={nn})",
                          evidence={**ev, "node_rank": nr, "nnodes": nn})


@check("DDP103", category="launcher_env", severity="error", title="Rank layout does not add up",
       severities=("warning",))
def rank_layout_consistent(ctx: RankContext) -> Iterator[Problem]:
    """
    What: Under torchrun, RANK differs from GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK, or WORLD_SIZE
    differs from the number of nodes x LOCAL_WORLD_SIZE (torchrun's GROUP_WORLD_SIZE, srun's
    SLURM_NNODES).
    Why: The launcher on each node numbers its ranks from its node rank; when the numbers do not add
    up, two ranks claim the same number or a rank number is never taken, and `init_process_group`
    hangs until its timeout.
    Fix: Start every node with the same `torchrun --nnodes N --nproc-per-node M` and a distinct
    `--node-rank` (0..N-1); do not export RANK or WORLD_SIZE yourself on top of a launcher.
    Severity: error under srun and the MPI launchers; a warning under torchrun, which allows nodes
    with different --nproc-per-node (rare, but not wrong by itself).
    """
    name = ctx.launcher.name
    r, lr, ws, lws, nr, nn = (ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size,
                              ctx.node_rank, ctx.nnodes)
    if name not in ("torchrun", "slurm") or ws is None or lws is None or nn is None:
        return
    if name == "slurm" and "," in (ctx.env.get("SLURM_STEP_TASKS_PER_NODE")
                                   or ctx.env.get("SLURM_NTASKS_PER_NODE") or ""):
        return  # nodes run different task counts ("8(x2),4"): no single per-node number to check
    nodes_n = "GROUP_WORLD_SIZE" if name == "torchrun" else "SLURM_NNODES"
    world_n = "WORLD_SIZE" if name == "torchrun" else "SLURM_NTASKS"
    ev = {"launcher": name, "rank": r, "local_rank": lr, "world_size": ws, "local_world_size": lws,
          "node_rank": nr, "nnodes": nn}
    if ws != nn * lws:
        yield Problem(
            message=f"{world_n}={ws} but {nodes_n}={nn} nodes x {lws} processes per node = {nn * lws}",
            evidence=ev,
            # torchrun allows nodes with different --nproc-per-node; rare, but not wrong by itself.
            severity="warning" if name == "torchrun" else None,
            hint=None if name == "torchrun" else
            "Allocate with `sbatch --nodes N --ntasks-per-node M` and start with a plain `srun` so "
            "SLURM_NTASKS = N x M.")
        return  # the rank formula below assumes the homogeneous layout
    if name == "torchrun" and r is not None and lr is not None and nr is not None and r != nr * lws + lr:
        yield Problem(
            message=f"RANK={r} but GROUP_RANK={nr} x LOCAL_WORLD_SIZE={lws} + LOCAL_RANK={lr} = {nr * lws + lr}",
            evidence=ev)


@check("DDP104", category="launcher_env", severity="error", title="MASTER_ADDR not set", severities=("info",))
def master_addr_present(ctx: RankContext) -> Iterator[Problem]:
    """
    What: The job has more than one rank but MASTER_ADDR is not set, under a launcher that does not
    set it (mpirun, MPICH, srun, or one that only sets RANK/WORLD_SIZE; torchrun always sets it).
    Why: Every rank connects to MASTER_ADDR:MASTER_PORT, where rank 0 serves the rendezvous store;
    without it `init_process_group(init_method="env://")` fails with "MASTER_ADDR expected, but not
    set".
    Fix: Export MASTER_ADDR=<host of rank 0> and MASTER_PORT=<free port> to every rank, e.g.
    `mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500 ...`.
    Severity: error when the ranks span several nodes; info when every rank runs on this node under
    a launcher (not a plain environment launch), where the rendezvous falls back to 127.0.0.1 and
    works.
    """
    name = ctx.launcher.name
    ws = ctx.world_size
    if name not in ("mpirun", "mpich", "slurm", "env") or ws is None or ws <= 1 or ctx.master_addr:
        return
    ev = {"launcher": name, "world_size": ws, "local_world_size": ctx.local_world_size}
    hints = {
        "mpirun": "mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500 ...",
        "mpich": "mpiexec -genv MASTER_ADDR <host of rank 0> -genv MASTER_PORT 29500 ...",
        "slurm": 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1) '
                 "and MASTER_PORT=29500 in the batch script before srun",
        "env": "export MASTER_ADDR=<host of rank 0> MASTER_PORT=29500 for every process, or start with "
               "`torchrun --nnodes N --nproc-per-node M --rdzv-endpoint <host>:29500 ...`",
    }
    # All ranks on this node: ddp-doctor's rendezvous falls back to loopback for MPI/srun launchers.
    if name != "env" and ctx.local_world_size == ws:
        yield Problem(
            message=f"MASTER_ADDR is not set under {name} with WORLD_SIZE={ws}; all {ws} ranks are on this "
                    "node, so the default 127.0.0.1 is used",
            hint=f"Nothing to do on one node; set it explicitly to be safe: {hints[name]}",
            severity="info", evidence={**ev, "default": "127.0.0.1"})
        return
    yield Problem(
        message=f"MASTER_ADDR is not set under {name} with WORLD_SIZE={ws} "
                f"({ctx.local_world_size if ctx.local_world_size is not None else '?'} ranks on this node)",
        hint=hints[name], evidence=ev)


@check("DDP105", category="launcher_env", severity="error", title="MASTER_PORT not a usable port",
       severities=("warning",))
def master_port_valid(ctx: RankContext) -> Iterator[Problem]:
    """
    What: MASTER_PORT is not a whole number between 1 and 65535, or is a privileged port (below 1024).
    Why: Rank 0 binds the rendezvous store on MASTER_PORT; an invalid port fails at once, and a port
    below 1024 needs root to bind and may belong to a system service (22 is ssh).
    Fix: Use a free port between 1024 and 65535, e.g. `torchrun --master-port 29500` or
    `export MASTER_PORT=29500`.
    Severity: error for a port outside 1..65535; a warning for a privileged port (below 1024), which
    works only when the rank runs as root.
    """
    bad = ctx.launcher.invalid.get("MASTER_PORT")
    if bad is not None:
        yield Problem(message=f"MASTER_PORT={bad.raw!r} is {bad.why}",
                      evidence={"MASTER_PORT": bad.raw})
        return
    port = ctx.master_port
    if port is None:
        return
    if not 1 <= port <= 65535:
        yield Problem(message=f"MASTER_PORT={port} is outside 1..65535", evidence={"MASTER_PORT": port})
    elif port < 1024:
        yield Problem(message=f"MASTER_PORT={port} is a privileged port (below 1024)",
                      severity="warning", evidence={"MASTER_PORT": port})


@check("DDP111", category="launcher_env", severity="error", title="MASTER_ADDR is not an address")
def master_addr_valid(ctx: RankContext) -> Iterator[Problem]:
    """
    What: MASTER_ADDR is set to something that is neither a host name (letters, digits, hyphens,
    underscores and dots) nor an IPv4 or IPv6 address: a path, a URL, an address with its port, a
    value with spaces.
    Why: Every rank connects to MASTER_ADDR:MASTER_PORT for the rendezvous; a value that is no
    address never resolves, and the ranks wait at the rendezvous until their timeout (torch's
    default is 30 minutes) instead of failing at once. The preflight does not attempt the
    rendezvous with it.
    Fix: Set MASTER_ADDR to rank 0's host name or IP address alone (`MASTER_ADDR=10.0.0.1`,
    `MASTER_ADDR=algo-1`), and the port in MASTER_PORT.
    """
    addr = ctx.master_addr
    why = address_problem(addr) if addr is not None else None
    if addr is None or why is None:
        return
    shown = addr if len(addr) <= 200 else addr[:200] + "..."
    yield Problem(message=f"MASTER_ADDR={shown!r} is {why}: the rendezvous is not attempted with it",
                  hint="Set MASTER_ADDR to rank 0's host name or IP address alone (e.g. MASTER_ADDR=10.0.0.1) "
                       "and the port in MASTER_PORT.",
                  evidence={"MASTER_ADDR": shown, "why": why})


@check("DDP106", category="launcher_env", severity="error", title="Requested backend not available")
def backend_available(ctx: RankContext) -> Iterator[Problem]:
    """
    What: The process-group backend this job will use is unknown, missing from this torch build
    (or, for smddp, the module that registers it, smdistributed.dataparallel.torch.torch_smddp, is
    not importable), or needs a GPU that is not visible.
    Why: `init_process_group(backend=...)` raises at once ("Backend nccl is not available",
    "ProcessGroupNCCL is only supported with GPUs, no GPUs found!"), on every rank. SMDDP is not on
    PyPI: it exists only in SageMaker's PyTorch GPU training images, so off SageMaker it cannot be
    installed at all. The preflight then does not try to form the process group (that attempt
    could only fail again, for this same reason).
    Fix: Use gloo on CPU-only hosts and nccl with GPUs; for smddp run the job on SageMaker with a
    PyTorch GPU training image and distribution={"smdistributed": {"dataparallel": {"enabled":
    True}}} (locally, use gloo or nccl instead); check that CUDA_VISIBLE_DEVICES does not hide the
    GPUs.
    """
    b, src, host = ctx.backend, ctx.backend_source, ctx.host
    ev = {"backend": b, "source": src, "available": list(host.backends), "visible_gpus": host.visible_gpus}
    if b not in BACKENDS:
        yield Problem(message=f"backend {b!r} (from {src}) is not one of {', '.join(BACKENDS)}",
                      hint="Name one of gloo, nccl, smddp, mpi (lower case).", evidence=ev)
    elif b == "smddp" and b not in host.backends:
        # One root cause: without the library, no GPU would help (and off SageMaker there is none).
        where = ("this SageMaker container's image does not ship it" if ctx.sagemaker is not None else
                 "this is not a SageMaker training container, and SMDDP exists only in SageMaker's "
                 "PyTorch GPU framework images (it is not on PyPI)")
        local = "gloo" if host.visible_gpus == 0 else "nccl"
        yield Problem(
            message=f"backend smddp (from {src}): {SMDDP_MODULE} is not importable: {where}",
            hint=("Use a SageMaker PyTorch GPU training image (ml.p4d.24xlarge / ml.p4de.24xlarge) with "
                  "distribution={\"smdistributed\": {\"dataparallel\": {\"enabled\": True}}}, or "
                  "distribution={\"torch_distributed\": {\"enabled\": True}} with backend nccl."
                  if ctx.sagemaker is not None else
                  f"Run the job on SageMaker (a PyTorch GPU training image, distribution="
                  f"{{\"smdistributed\": {{\"dataparallel\": {{\"enabled\": True}}}}}}); to run here use "
                  f"backend {local} (`--backend {local}`, or in the script "
                  f"init_process_group(\"{local}\") when {SMDDP_MODULE} does not import)."),
            evidence={**ev, "module": SMDDP_MODULE, "sagemaker": ctx.sagemaker is not None})
    elif b in GPU_BACKENDS and host.visible_gpus == 0:
        yield Problem(
            message=f"asked for {b.upper()} (from {src}) but no GPU is visible ({_cvd(ctx)}, "
                    f"NVML counts {host.physical_gpus if host.physical_gpus is not None else 'no'} GPUs)",
            hint="On a CPU-only host use backend gloo. On a GPU host check that torch is a CUDA build "
                 "(torch.version.cuda is not None), the driver loads (nvidia-smi) and "
                 "CUDA_VISIBLE_DEVICES does not hide the GPUs.",
            evidence=ev)
    elif b not in host.backends:
        yield Problem(message=f"backend {b!r} (from {src}) is not available here "
                              f"(available: {', '.join(host.backends) or 'none'})",
                      hint=f"This torch build has no {b} backend; install a build with it (e.g. a CUDA wheel "
                           "for nccl) or choose one of: " + (", ".join(host.backends) or "none"),
                      evidence=ev)


BACKEND_MISSING = REGISTRY["DDP106"]  # backend_available's entry, registered by @check above


def backend_missing_said(findings: list[Finding], backend: str | None, available: Sequence[str]) -> bool:
    """True when this rank's findings already say (DDP106) that `backend` cannot exist here: the
    preflight then does not try init_process_group, whose failure could only add a second,
    misleading finding (DDP321)."""
    return backend not in available and any(f.id == BACKEND_MISSING.id for f in findings)


# ctx.options key the Python API sets: a script will call init_process_group() after this preflight
# (under `ddp-doctor run` ctx.entry_script says so).
SCRIPT_FOLLOWS_OPTION = "script_follows"
# The variables a default init_process_group() (init_method "env://") reads, and LOCAL_RANK, which
# nearly every DDP script reads for its device.
SCRIPT_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")
# Launchers whose own variables `ddp-doctor run` maps to torch's for the script (script_env_exports).
EXPORTING_LAUNCHERS = ("mpirun", "mpich", "slurm")
PREFLIGHT_DEFAULT_PORT = 29500  # the preflight's own default (preflight_ranks/bounded_rendezvous.DEFAULT_PORT)

MAPPING_HINTS = {
    "mpirun": "map Open MPI's variables at the top of the script, before init_process_group: "
              "os.environ.setdefault(\"RANK\", os.environ[\"OMPI_COMM_WORLD_RANK\"]), likewise WORLD_SIZE from "
              "OMPI_COMM_WORLD_SIZE and LOCAL_RANK from OMPI_COMM_WORLD_LOCAL_RANK, and pass "
              "`mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500`",
    "mpich": "map hydra's variables at the top of the script: RANK from PMI_RANK, WORLD_SIZE from PMI_SIZE, "
             "LOCAL_RANK from MPI_LOCALRANKID, and pass `mpiexec -genv MASTER_ADDR <host of rank 0> "
             "-genv MASTER_PORT 29500`",
    "slurm": "map srun's variables at the top of the script: RANK from SLURM_PROCID, WORLD_SIZE from "
             "SLURM_NTASKS, LOCAL_RANK from SLURM_LOCALID, and export MASTER_ADDR (the first host of "
             "$SLURM_JOB_NODELIST) and MASTER_PORT in the batch script",
    "env": "export MASTER_ADDR=<host of rank 0> and MASTER_PORT=<free port> (and LOCAL_RANK) for every "
           "process, or start the job with torchrun, which sets them all",
}


def script_env_exports(info: LauncherInfo, env: Mapping[str, str]) -> dict[str, str]:
    """What `ddp-doctor run` exports for the script under mpirun, MPICH and srun, whose ranks carry
    only the launcher's own variables: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE from them,
    MASTER_ADDR=127.0.0.1 when every rank is on this node (the preflight's own default; across
    nodes only the user knows rank 0's host), MASTER_PORT (the preflight's port) with an address.
    Variables already set are never changed. Empty for every other launcher."""
    if info.name not in EXPORTING_LAUNCHERS:
        return {}
    out: dict[str, str] = {}
    for var, value in (("RANK", info.rank), ("WORLD_SIZE", info.world_size), ("LOCAL_RANK", info.local_rank),
                       ("LOCAL_WORLD_SIZE", info.local_world_size)):
        if value is not None and not env.get(var):
            out[var] = str(value)
    if not env.get("MASTER_ADDR") and info.world_size is not None and info.local_world_size == info.world_size:
        out["MASTER_ADDR"] = "127.0.0.1"
    if not env.get("MASTER_PORT") and (env.get("MASTER_ADDR") or "MASTER_ADDR" in out):
        out["MASTER_PORT"] = str(info.master_port or PREFLIGHT_DEFAULT_PORT)
    return out


@check("DDP110", category="launcher_env", severity="error",
       title="The script's init_process_group() will not find its variables", severities=("info",))
def script_env_ready(ctx: RankContext) -> Iterator[Problem]:
    """
    What: Before a script that ddp-doctor runs (`ddp-doctor run`) or that called the Python API
    (`ddp_doctor.preflight()`), some of the variables a default `init_process_group()`
    (init_method "env://") reads are missing: MASTER_ADDR and MASTER_PORT in a
    torch.multiprocessing.spawn worker, or RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and
    LOCAL_RANK, which scripts read for their device) under mpirun, MPICH or srun, which set only
    their own variables. The preflight itself can meet without them (it reads the launcher's
    variables and defaults to 127.0.0.1 on one node); the script cannot.
    Why: The preflight would pass and the script fail at once with "environment variable RANK
    expected, but not set" (or MASTER_ADDR), or KeyError: 'LOCAL_RANK'.
    Fix: Before torch.multiprocessing.spawn, set os.environ["MASTER_ADDR"] = "localhost" and
    os.environ["MASTER_PORT"] = "<free port>" in the parent (or pass init_method="tcp://host:port").
    Under mpirun, map OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK to RANK / WORLD_SIZE / LOCAL_RANK
    in the script and pass -x MASTER_ADDR -x MASTER_PORT, or start the script with
    `mpirun ... ddp-doctor run train.py`, which exports them for it (likewise for MPICH and srun).
    Severity: info under `ddp-doctor run` with mpirun, MPICH or srun when it exports every missing
    variable for the script (the finding lists them); error otherwise. A script that passes
    init_method="tcp://..." or a store of its own does not need them: skip DDP110 then.
    """
    api = bool(ctx.options.get(SCRIPT_FOLLOWS_OPTION))
    if not (ctx.entry_script or api):
        return  # a bare `ddp-doctor preflight`: no script follows
    name, env = ctx.launcher.name, ctx.env
    if name == "spawn":
        needed = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not env.get(v)]
    elif name in EXPORTING_LAUNCHERS or name == "env":
        needed = [v for v in SCRIPT_VARIABLES if not env.get(v)]
    else:
        return  # torchrun sets all of them; a plain process (no launcher) runs no group
    if not needed:
        return
    ev = {"launcher": name, "missing": needed, "mode": "api" if api and not ctx.entry_script else "run"}
    if name == "spawn":
        ws = ctx.world_size
        yield Problem(
            message=f"{' and '.join(needed)} not set in this torch.multiprocessing.spawn worker "
                    f"(ddp_doctor.preflight(rank=..., world_size={ws})): the preflight met at "
                    f"{ctx.master_addr or '127.0.0.1'}:{ctx.master_port or PREFLIGHT_DEFAULT_PORT} on its own, "
                    f"but the script's init_process_group(rank=..., world_size={ws}) reads "
                    f"{' and '.join(needed)} from the environment and fails at once",
            hint="Set them in the parent before torch.multiprocessing.spawn: os.environ[\"MASTER_ADDR\"] = "
                 "\"localhost\"; os.environ[\"MASTER_PORT\"] = \"29500\" (a free port). A script that passes "
                 "init_method=\"tcp://host:port\" does not need them: skip DDP110.",
            evidence=ev)
        return
    exports = script_env_exports(ctx.launcher, env) if ctx.entry_script else {}
    left = [v for v in needed if v not in exports]
    if exports and not left:
        # per-rank values in the evidence; the message is the same on every rank (one merged finding)
        shown = ", ".join(f"{k}={v}" if k.startswith("MASTER_") else k for k, v in exports.items())
        yield Problem(
            message=f"{name} sets only its own rank variables; ddp-doctor run exports {shown} for the "
                    f"script, so its init_process_group() (env://) finds {', '.join(needed)}",
            hint="Nothing to do under `ddp-doctor run`. Started without it, the script would need them "
                 f"mapped: {MAPPING_HINTS[name]}.",
            severity="info", evidence={**ev, "exported": exports})
        return
    how = ("`ddp-doctor run` exports the rest, but not MASTER_ADDR across nodes: "
           if exports else "")
    yield Problem(
        message=f"{', '.join(left)} not set under {name}: the preflight reads {name}'s own "
                f"variables, but the script's init_process_group() (env://) reads {', '.join(left)} and "
                f"fails at once",
        hint=(f"{how}{MAPPING_HINTS[name][0].upper()}{MAPPING_HINTS[name][1:]}"
              + ("; or start the script with `ddp-doctor run train.py` under the launcher, which exports "
                 "RANK, WORLD_SIZE, LOCAL_RANK (and MASTER_ADDR/MASTER_PORT on one node) for it."
                 if name in EXPORTING_LAUNCHERS and not exports else ".")),
        evidence={**ev, "exported": exports, "missing_for_script": left,
                  "variables": dict(ctx.launcher.variables)})


def _sm_hosts(ctx: RankContext) -> list[str]:
    sm = ctx.sagemaker
    return (sm.hosts or sm.rc_hosts or []) if sm is not None else []


@check("DDP107", category="launcher_env", severity="error",
       title="Single process in a distributed SageMaker job", severities=("warning",))
def sagemaker_without_launcher(ctx: RankContext) -> Iterator[Problem]:
    """
    What: This process was started without any launcher (no RANK, WORLD_SIZE or MPI variables) in a
    SageMaker job that has several hosts or several GPUs per host.
    Why: With no distribution configured, SageMaker runs one plain `python train.py` per host: every
    host trains its own independent copy and all GPUs but one per host sit idle.
    Fix: Add `distribution={"torch_distributed": {"enabled": True}}` to the PyTorch estimator, so the
    toolkit starts torchrun with one process per GPU on every host.
    Severity: error on a multi-host job (every host trains its own copy); a warning on a single host
    with several GPUs (the job runs, with GPUs idle).
    """
    sm = ctx.sagemaker
    if ctx.launcher.name != "none" or sm is None:
        return
    if sm.is_hetero and sm.this_host and sm.distribution_hosts and sm.this_host not in sm.distribution_hosts:
        return  # a host outside the distribution groups takes no part (DDP214 says so)
    hosts, gpus = _sm_hosts(ctx), sm.num_gpus or 0
    ev = {**host_evidence({"hosts": hosts}), "num_gpus": gpus, "distribution": sm.distribution}
    per_host = max(gpus, 1)
    if len(hosts) > 1:
        yield Problem(
            message=f"no launcher: a single process on a SageMaker job with {len(hosts)} hosts "
                    f"(SM_HOSTS={hosts_text(hosts)}) and SM_NUM_GPUS={gpus}; every host runs its own independent copy "
                    f"and {len(hosts) * per_host - len(hosts)} of {len(hosts) * per_host} GPUs idle",
            evidence=ev)
    elif gpus > 1:
        yield Problem(
            message=f"no launcher: a single process on a SageMaker host with SM_NUM_GPUS={gpus}; "
                    f"{gpus - 1} of {gpus} GPUs idle",
            severity="warning", evidence=ev)


@check("DDP108", category="launcher_env", severity="warning",
       title="Launcher does not match the SageMaker distribution")
def launcher_matches_distribution(ctx: RankContext) -> Iterator[Problem]:
    """
    What: The SageMaker estimator asked for a distribution whose launcher differs from the one that
    started this process (torch_distributed launches torchrun; smdistributed, pytorchddp and mpi
    launch mpirun).
    Why: It usually means the entry point starts its own launcher on top of the toolkit's, so each
    host runs launchers inside launchers: more processes than GPUs, or ranks whose numbers and world
    size disagree.
    Fix: Keep the entry point a plain training script and let the estimator's distribution start
    the ranks, or change the distribution to the launcher you use:
    `{"torch_distributed": {"enabled": True}}` for torchrun, `{"mpi": {"enabled": True}}` for mpirun.
    """
    sm = ctx.sagemaker
    found = ctx.launcher.name
    # "none" is DDP107's case; "spawn" is ddp-doctor's own API, told the rank explicitly.
    if sm is None or sm.expected_launcher is None or found in ("none", "spawn", sm.expected_launcher):
        return
    yield Problem(
        message=f"SageMaker distribution {sm.distribution!r} launches ranks with {sm.expected_launcher}, "
                f"but this process was started by {found} ({_observed(ctx)})",
        evidence={"distribution": sm.distribution, "expected": sm.expected_launcher, "found": found})


@check("DDP109", category="launcher_env", severity="error", title="More local ranks than visible GPUs",
       severities=("warning",))
def local_ranks_fit_gpus(ctx: RankContext) -> Iterator[Problem]:
    """
    What: With a GPU backend (nccl, smddp), this node runs more ranks than it has visible GPUs, or
    this rank's local rank has no GPU of its own.
    Why: Each rank needs its own GPU: NCCL refuses two ranks on one device ("Duplicate GPU
    detected"), and `cuda:LOCAL_RANK` beyond the visible count raises "invalid device ordinal".
    Fix: Start one process per visible GPU (`torchrun --nproc-per-node <GPUs>`), or make more GPUs
    visible (check CUDA_VISIBLE_DEVICES).
    Severity: error when the local ranks outnumber the GPUs this rank sees; a warning when
    CUDA_VISIBLE_DEVICES gives this rank one GPU while the node runs several ranks, which is right
    only if every rank got a different one (a cross-rank question).
    """
    gpus = ctx.host.visible_gpus
    lr, lws = ctx.local_rank, ctx.local_world_size
    if ctx.backend not in GPU_BACKENDS or gpus <= 0:
        return  # no GPU at all is DDP106's finding
    _, local_n, _, lworld_n = _names(ctx)
    ev = {"visible_gpus": gpus, "local_rank": lr, "local_world_size": lws,
          "CUDA_VISIBLE_DEVICES": ctx.env.get("CUDA_VISIBLE_DEVICES")}
    fix = f"Start {gpus} process(es) per node (`torchrun --nproc-per-node {gpus}`) or make more GPUs visible."
    # One GPU per process through CUDA_VISIBLE_DEVICES (e.g. srun --gpus-per-task=1) is a valid
    # pattern if every rank got a different one; that is a cross-rank question, so only warn here.
    if "CUDA_VISIBLE_DEVICES" in ctx.env and gpus == 1 and lws is not None and lws > 1:
        yield Problem(
            message=f"{lworld_n}={lws} ranks on this node but this rank sees 1 GPU ({_cvd(ctx)}); this "
                    "works only if every rank was given a different GPU and uses cuda:0",
            hint="Give each rank a distinct GPU and call torch.cuda.set_device(0), or leave "
                 "CUDA_VISIBLE_DEVICES unset and use cuda:LOCAL_RANK.",
            severity="warning", evidence=ev)
        return
    if lws is not None and lws > gpus:
        yield Problem(
            message=f"{lworld_n}={lws} ranks on this node but only {gpus} GPU(s) are visible ({_cvd(ctx)}): "
                    "ranks would share GPUs",
            hint=fix, evidence=ev)
    elif lr is not None and lr >= gpus:
        yield Problem(
            message=f"{local_n}={lr} but only {gpus} GPU(s) are visible ({_cvd(ctx)}): cuda:{lr} does not exist",
            hint=fix, evidence=ev)


LOCAL_RANKS_EXCEED_GPUS = REGISTRY["DDP109"]  # local_ranks_fit_gpus' entry


def device_missing_said(findings: list[Finding], device: str, visible_gpus: int) -> bool:
    """True when this rank's GPU (`cuda:N`) is not among the visible ones and its findings already
    say so (DDP109): the preflight then does not try init_process_group, whose failure ("invalid
    device ordinal") could only add a second, misleading finding (DDP321)."""
    if not device.startswith("cuda:"):
        return False
    try:
        index = int(device.split(":", 1)[1])
    except ValueError:
        return False
    return index >= visible_gpus and any(f.id == LOCAL_RANKS_EXCEED_GPUS.id for f in findings)
