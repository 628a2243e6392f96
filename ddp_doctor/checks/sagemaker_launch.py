"""Local checks that the launch matches the cluster SageMaker built (DDP207-DDP213): the
launcher's rank layout (master = distribution_hosts[0], node rank = its index, hosts x processes
per host), the toolkit's master port, SM_NUM_GPUS against the GPUs visible, the smdistributed
environment and instance type. The EFA variables NCCL needs (DDP215) are checked on any launcher
in checks/efa.py, with the other EFA checks. The cluster itself is read with
the helpers of checks/sagemaker_config.py, whose checks make sure it agrees with itself.

Every check does nothing outside SageMaker (ctx.sagemaker is None). Facts follow
sagemaker-training-toolkit (environment.py, torch_distributed.py, smdataparallel.py).
"""
from __future__ import annotations

from typing import Any, Iterator

from ddp_doctor.checks.sagemaker_config import dist_hosts, host_evidence, hosts_text, multi_host, takes_part
from ddp_doctor.context import RankContext
from ddp_doctor.facts.instances import SMDDP_INSTANCES, SMDDP_OLDER_INSTANCES
from ddp_doctor.facts.launchers import is_ip_address
from ddp_doctor.facts.sagemaker_env import SMDDP_PORT, TORCHRUN_PORT, SageMakerEnv
from ddp_doctor.findings import Problem
from ddp_doctor.registry import check

# SMDDP_INSTANCES & co. come from the one instance table (facts/instances.py).
SMDDP_DISTRIBUTIONS = ("smdistributed", "pytorchddp")


def _toolkit_torchrun(ctx: RankContext, sm: SageMakerEnv) -> bool:
    """torchrun as the toolkit starts it for distribution torch_distributed (master port 7777)."""
    return (ctx.launcher.name == "torchrun" and sm.distribution == "torch_distributed"
            and ctx.master_port == TORCHRUN_PORT)


def _ppn_source(sm: SageMakerEnv) -> str:
    if "sagemaker_mpi_num_of_processes_per_host" in sm.framework_params:
        return "sagemaker_mpi_num_of_processes_per_host"
    return f"SM_NUM_GPUS={sm.num_gpus}" if sm.num_gpus else "SM_NUM_NEURONS, else 1"


def _show(env: Any, name: str) -> str:
    """`NAME='value'`, or `NAME is unset`, for messages."""
    v = env.get(name)
    return f"{name} is unset" if v is None else f"{name}={v!r}"


# -- the launcher against the cluster --------------------------------------------------------

@check("DDP207", category="launcher_env", severity="error", title="MASTER_ADDR is not the SageMaker master",
       severities=("warning",))
def master_addr_is_sagemaker_master(ctx: RankContext) -> Iterator[Problem]:
    """
    What: On a multi-host job started by torchrun (or a launcher setting RANK/WORLD_SIZE),
    MASTER_ADDR is not the host SageMaker made master (distribution_hosts[0], SM_TRAINING_ENV
    master_hostname), or rank 0 does not run on the MASTER_ADDR host.
    Why: Rank 0 serves the rendezvous store on its own host; every other rank connects to
    MASTER_ADDR. If they are different hosts, `init_process_group` hangs until its timeout. The
    master is the first host of the instance groups, which is not necessarily algo-1.
    Fix: Let the toolkit start torchrun (`distribution={"torch_distributed": {"enabled": True}}`), or
    pass `--master_addr` = `json.loads(os.environ["SM_TRAINING_ENV"])["master_hostname"]`.
    Severity: error when SageMaker's toolkit started torchrun (its MASTER_ADDR must be the master);
    a warning under a launcher of your own, which may be self-consistent.
    """
    sm = ctx.sagemaker
    if sm is None or ctx.launcher.name not in ("torchrun", "env") or not multi_host(sm) or not takes_part(sm):
        return
    master, dh = sm.master_hostname, dist_hosts(sm)
    te_master = sm.training_env.get("master_hostname")
    ev = {"MASTER_ADDR": ctx.master_addr, "master": master, "training_env_master": te_master,
          **host_evidence({"distribution_hosts": dh}), "this_host": sm.this_host, "node_rank": ctx.node_rank}
    if isinstance(te_master, str) and master and te_master != master:
        yield Problem(message=f"SM_TRAINING_ENV master_hostname={te_master!r} but resourceconfig.json "
                              f"instance_groups put {master!r} first ({hosts_text(dh)})", evidence=ev)
    addr = ctx.master_addr
    if not addr or is_ip_address(addr):
        return  # unset is DDP104's; an IP needs name resolution (network checks)
    addr_host = addr.split(".")[0]
    here, nr = sm.this_host, ctx.node_rank
    if here is not None and nr == 0 and addr_host != here:
        yield Problem(message=f"this host {here} runs node 0 (rank 0's node) but MASTER_ADDR={addr}: the "
                              f"store is served here while the other ranks connect to {addr}", evidence=ev)
    elif here is not None and nr is not None and nr != 0 and addr_host == here:
        yield Problem(message=f"MASTER_ADDR={addr} is this host, but this host runs node {nr}: rank 0 "
                              "serves the store on another host", evidence=ev)
    elif master and addr_host not in (master, te_master):
        # The toolkit sets MASTER_ADDR itself; a user's launcher may still be self-consistent.
        yield Problem(
            message=f"MASTER_ADDR={addr} but the SageMaker master is {master} (distribution_hosts[0] of "
                    f"{hosts_text(dh)})",
            severity=None if _toolkit_torchrun(ctx, sm) else "warning", evidence=ev,
            hint=None if _toolkit_torchrun(ctx, sm) else
            f"Works only if rank 0 runs on {addr}; prefer MASTER_ADDR={master} and node ranks in the order "
            f"{hosts_text(dh)}.")



@check("DDP208", category="launcher_env", severity="info", title="torchrun not started by the SageMaker toolkit")
def master_port_is_toolkit_port(ctx: RankContext) -> Iterator[Problem]:
    """
    What: On a multi-host torch_distributed job, torchrun's MASTER_PORT is not 7777, the port the
    SageMaker toolkit passes: this torchrun was started by your own code.
    Why: Nothing is wrong by itself, but the toolkit's layout (master, node ranks, processes per
    host) is then your code's responsibility, and the port must be open between the hosts.
    Fix: Nothing if intended; make sure the security group allows all traffic between members of
    the same group (a self-referencing rule, inbound and outbound).
    """
    sm = ctx.sagemaker
    if (sm is None or ctx.launcher.name != "torchrun" or sm.distribution != "torch_distributed"
            or not multi_host(sm) or ctx.master_port in (None, TORCHRUN_PORT)):
        return
    yield Problem(message=f"MASTER_PORT={ctx.master_port}; the toolkit's torchrun launch uses {TORCHRUN_PORT}",
                  evidence={"MASTER_PORT": ctx.master_port, "toolkit_port": TORCHRUN_PORT})



@check("DDP209", category="launcher_env", severity="error", title="Node rank is not this host's SageMaker position",
       severities=("warning",))
def node_rank_matches_host_order(ctx: RankContext) -> Iterator[Problem]:
    """
    What: torchrun's GROUP_RANK (its --node_rank) differs from this host's index in the distribution
    hosts (the instance groups' order, which makes distribution_hosts[0] the master).
    Why: The toolkit numbers nodes in that order; node ranks computed otherwise (from SM_HOSTS or
    the algo-N suffix) can give two hosts the same node rank, or put node 0 on a host that is not
    MASTER_ADDR, and the rendezvous hangs.
    Fix: Let the toolkit start torchrun (`distribution={"torch_distributed": {"enabled": True}}`), or
    pass `--node_rank` = distribution_hosts.index(current_host) from SM_TRAINING_ENV.
    Severity: error when SageMaker's toolkit started torchrun; a warning under a torchrun of your
    own, whose dynamic (c10d) rendezvous numbers nodes in join order.
    """
    sm = ctx.sagemaker
    if sm is None or ctx.launcher.name != "torchrun" or not multi_host(sm):
        return
    dh, here, nr = dist_hosts(sm), sm.this_host, ctx.node_rank
    if here not in dh or nr is None or nr == dh.index(here):
        return
    toolkit = _toolkit_torchrun(ctx, sm)
    yield Problem(
        message=f"GROUP_RANK={nr} but this host {here} is at position {dh.index(here)} of the distribution "
                f"hosts {hosts_text(dh)} (master {dh[0]})",
        # A torchrun of your own with a dynamic (c10d) rendezvous numbers nodes in join order.
        severity=None if toolkit else "warning",
        hint=None if toolkit else
        f"With --rdzv-backend c10d node ranks follow join order and this is expected; with a static "
        f"rendezvous pass --node_rank {dh.index(here)} on this host.",
        evidence={"node_rank": nr, "expected": dh.index(here), **host_evidence({"distribution_hosts": dh}),
                  "this_host": here})



@check("DDP210", category="launcher_env", severity="error",
       title="World size does not match SageMaker hosts x processes per host", severities=("warning",))
def world_matches_sagemaker_layout(ctx: RankContext) -> Iterator[Problem]:
    """
    What: The launcher's world size differs from the number of distribution hosts x processes per
    host, or its per-node size from processes per host (sagemaker_mpi_num_of_processes_per_host,
    else SM_NUM_GPUS).
    Why: SageMaker gives every host the same number of GPUs; a smaller world leaves GPUs or whole
    hosts idle (each host may even train alone), a larger one waits for ranks that never start.
    Fix: Let the estimator's distribution start the ranks, or start `torchrun --nnodes <hosts>
    --nproc-per-node <GPUs per host>` on every host (`mpirun -np <hosts x GPUs>` for MPI).
    Severity: error with a SageMaker distribution enabled; a warning with distribution none, where
    the launcher is your own and the layout may be intended.
    """
    sm = ctx.sagemaker
    if sm is None or ctx.launcher.name not in ("torchrun", "env", "mpirun") or not takes_part(sm):
        return
    dh, ppn = dist_hosts(sm), sm.processes_per_host
    if not dh:
        return
    world_n, lworld_n = (("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE") if ctx.launcher.name == "mpirun"
                         else ("WORLD_SIZE", "LOCAL_WORLD_SIZE"))
    # With no distribution the launcher is the user's own: say so, but it may be intended.
    severity = None if sm.distribution != "none" else "warning"
    ev = {"world_size": ctx.world_size, "local_world_size": ctx.local_world_size, **host_evidence({"hosts": dh}),
          "processes_per_host": ppn, "distribution": sm.distribution}
    expected = len(dh) * ppn
    if ctx.launcher.name == "mpirun":
        dist = f'{{"mpi": {{"enabled": True, "processes_per_host": {ppn}}}}}'
        own = f"`mpirun -np {expected} -npernode {ppn} ...`"
    else:
        dist = '{"torch_distributed": {"enabled": True}}'
        own = (f"`torchrun --nnodes {len(dh)} --nproc-per-node {ppn} --node_rank <index in {hosts_text(dh)}> ...` "
               "on every host")
    hint = f"Let the estimator start the ranks (distribution={dist}) or run {own}"
    if ctx.world_size is not None and ctx.world_size != expected:
        yield Problem(
            message=f"{world_n}={ctx.world_size} but SageMaker runs {len(dh)} host(s) {hosts_text(dh)} x {ppn} "
                    f"processes per host ({_ppn_source(sm)}) = {expected}",
            severity=severity, hint=hint, evidence=ev)
    if ctx.local_world_size is not None and ctx.local_world_size != ppn:
        yield Problem(
            message=f"{lworld_n}={ctx.local_world_size} but processes per host is {ppn} ({_ppn_source(sm)})",
            severity=severity, hint=hint, evidence=ev)



@check("DDP211", category="topology", severity="error", title="SM_NUM_GPUS differs from the GPUs visible",
       severities=("warning",))
def sagemaker_gpus_visible(ctx: RankContext) -> Iterator[Problem]:
    """
    What: SM_NUM_GPUS (what nvidia-smi listed when the container started) differs from the GPUs
    torch sees or NVML counts now, or this rank's LOCAL_RANK is not below SM_NUM_GPUS.
    Why: The toolkit starts SM_NUM_GPUS processes per host, one per GPU; with fewer usable GPUs the
    extra ranks fail on "invalid device ordinal" or share a GPU, and a GPU that NVML no longer counts
    has usually failed.
    Fix: Check `nvidia-smi` and that torch is a CUDA build (torch.version.cuda); do not narrow
    CUDA_VISIBLE_DEVICES in the entry point; replace the instance if a GPU has dropped off.
    Severity: error when GPUs are missing from the host; a warning when all are there but
    CUDA_VISIBLE_DEVICES narrows what this rank sees (maybe a deliberate one-GPU-per-rank binding).
    """
    sm = ctx.sagemaker
    if sm is None or sm.num_gpus is None:
        return
    n, host = sm.num_gpus, ctx.host
    ev = {"SM_NUM_GPUS": n, "visible_gpus": host.visible_gpus, "physical_gpus": host.physical_gpus,
          "CUDA_VISIBLE_DEVICES": ctx.env.get("CUDA_VISIBLE_DEVICES")}
    too_few_visible = host.visible_gpus < n
    nvml_differs = host.physical_gpus is not None and host.physical_gpus != n
    if too_few_visible or nvml_differs:
        cvd = ctx.env.get("CUDA_VISIBLE_DEVICES")
        counts = f"torch sees {host.visible_gpus}" + (
            f" and NVML counts {host.physical_gpus}" if host.physical_gpus is not None else "")
        yield Problem(
            message=f"SM_NUM_GPUS={n} but {counts} GPU(s) on this host"
                    + (f" (CUDA_VISIBLE_DEVICES={cvd!r})" if cvd is not None else ""),
            # All GPUs there but narrowed by CUDA_VISIBLE_DEVICES: maybe a deliberate one-GPU-per-rank binding.
            severity="warning" if cvd is not None and not nvml_differs else None, evidence=ev)
    lr = ctx.local_rank
    if n > 0 and lr is not None and lr >= n:
        yield Problem(message=f"LOCAL_RANK={lr} but SM_NUM_GPUS={n}: this rank has no GPU of its own",
                      evidence={**ev, "local_rank": lr})



@check("DDP212", category="launcher_env", severity="error", title="smdistributed launch environment incomplete",
       severities=("warning",))
def smddp_environment(ctx: RankContext) -> Iterator[Problem]:
    """
    What: Under SageMaker's smdistributed data parallel (mpirun + smddprun), variables it relies on
    are missing or wrong: LOCAL_RANK and SMDATAPARALLEL_LOCAL_RANK, SMDATAPARALLEL_USE_HOMOGENEOUS
    or SMDATAPARALLEL_USE_SINGLENODE, and on several hosts SMDATAPARALLEL_SERVER_ADDR (the master)
    and SMDATAPARALLEL_SERVER_PORT (7592); or the smdistributed package is not importable.
    Why: smddp ranks meet at SERVER_ADDR:SERVER_PORT; a wrong address hangs the job. Hugging Face
    Trainer starts distribution only when LOCAL_RANK is set and picks its GPU from
    SMDATAPARALLEL_LOCAL_RANK.
    Fix: Let the estimator start the ranks (`distribution={"smdistributed": {"dataparallel":
    {"enabled": True}}}`) instead of calling mpirun or smddprun yourself, in a SageMaker PyTorch
    training image that ships smdistributed.
    Severity: error when SMDATAPARALLEL_SERVER_ADDR is missing or wrong, or smdistributed is not
    importable; a warning for the variables Hugging Face Trainer and the toolkit expect (LOCAL_RANK,
    SMDATAPARALLEL_LOCAL_RANK, USE_HOMOGENEOUS/SINGLENODE, the server port), without which the job
    may still run.
    """
    sm = ctx.sagemaker
    if sm is None or sm.distribution not in SMDDP_DISTRIBUTIONS or ctx.launcher.name != "mpirun":
        return
    env = ctx.env
    missing = [v for v in ("LOCAL_RANK", "SMDATAPARALLEL_LOCAL_RANK") if not env.get(v)]
    if missing:
        yield Problem(message=f"{' and '.join(missing)} not set under smddp (Hugging Face Trainer needs both)",
                      severity="warning", evidence={"missing": missing})
    if not (env.get("SMDATAPARALLEL_USE_HOMOGENEOUS") or env.get("SMDATAPARALLEL_USE_SINGLENODE")):
        yield Problem(message="neither SMDATAPARALLEL_USE_HOMOGENEOUS nor SMDATAPARALLEL_USE_SINGLENODE is set",
                      severity="warning", evidence={})
    if multi_host(sm):
        addr, port = env.get("SMDATAPARALLEL_SERVER_ADDR"), env.get("SMDATAPARALLEL_SERVER_PORT")
        ev = {"SMDATAPARALLEL_SERVER_ADDR": addr, "SMDATAPARALLEL_SERVER_PORT": port,
              "master": sm.master_hostname, **host_evidence({"distribution_hosts": dist_hosts(sm)})}
        if not addr:
            yield Problem(message=f"SMDATAPARALLEL_SERVER_ADDR is not set on a {len(sm.distribution_hosts)}-host "
                                  f"job (master {sm.master_hostname})", evidence=ev)
        elif not is_ip_address(addr) and sm.master_hostname and addr.split(".")[0] != sm.master_hostname:
            yield Problem(message=f"SMDATAPARALLEL_SERVER_ADDR={addr} but the SageMaker master is "
                                  f"{sm.master_hostname}", evidence=ev)
        if port != str(SMDDP_PORT):
            yield Problem(message=f"{_show(env, 'SMDATAPARALLEL_SERVER_PORT')} (the toolkit uses {SMDDP_PORT})",
                          severity="warning", evidence=ev)
    # With backend smddp, DDP106 already reports a missing smdistributed.
    if ctx.backend != "smddp" and "smddp" not in ctx.host.backends:
        yield Problem(message=f"distribution {sm.distribution!r} but smdistributed is not importable here",
                      evidence={"available": list(ctx.host.backends)})



@check("DDP213", category="topology", severity="error", title="Instance type not supported by smdistributed",
       severities=("warning",))
def smddp_instance_type(ctx: RankContext) -> Iterator[Problem]:
    """
    What: The smdistributed data parallel distribution runs on an instance type the library does not
    support (ml.p4d.24xlarge, ml.p4de.24xlarge; ml.p3.16xlarge and ml.p3dn.24xlarge only in older
    versions).
    Why: SMDDP's collectives are built for those instances' GPUs and network; elsewhere the library
    or the SDK refuses to start.
    Fix: Use ml.p4d.24xlarge or ml.p4de.24xlarge, or switch to `distribution={"torch_distributed":
    {"enabled": True}}` (NCCL) on other GPU instances.
    Severity: error on an instance type smdistributed does not support; a warning on one only older
    versions support (ml.p3.16xlarge, ml.p3dn.24xlarge).
    """
    sm = ctx.sagemaker
    if sm is None or sm.distribution != "smdistributed" or not isinstance(sm.instance_type, str):
        return
    it = sm.instance_type
    ev = {"instance_type": it, "supported": list(SMDDP_INSTANCES)}
    if it in SMDDP_OLDER_INSTANCES:
        yield Problem(message=f"instance type {it} is supported by older smdistributed versions only",
                      severity="warning", evidence=ev)
    elif it not in SMDDP_INSTANCES:
        yield Problem(message=f"instance type {it} is not supported by smdistributed data parallel "
                              f"(supported: {', '.join(SMDDP_INSTANCES)})", evidence=ev)
