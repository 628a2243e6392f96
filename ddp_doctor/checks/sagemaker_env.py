"""Local checks on a SageMaker training container (DDP200-DDP299): the SM_* variables and
/opt/ml/input/config agree with each other, and the launcher's rank layout matches the cluster
SageMaker built (master = distribution_hosts[0], node rank = its index, hosts x processes per host).

Every check does nothing outside SageMaker (ctx.sagemaker is None). Facts follow
sagemaker-training-toolkit (environment.py, torch_distributed.py, smdataparallel.py).
"""
from __future__ import annotations

import ipaddress
from typing import Any, Iterator

from ddp_doctor.context import RankContext
from ddp_doctor.facts.sagemaker_env import SMDDP_PORT, TORCHRUN_PORT, SageMakerEnv
from ddp_doctor.findings import Problem
from ddp_doctor.registry import check
from ddp_doctor.sagemaker.instances import (
    EFA_INSTANCES,
    EFA_RDMA_INSTANCES,
    SMDDP_INSTANCES,
    SMDDP_OLDER_INSTANCES,
)

# SMDDP_INSTANCES / EFA_INSTANCES & co. come from the one instance table (sagemaker/instances.py).
SMDDP_DISTRIBUTIONS = ("smdistributed", "pytorchddp")
RAW_LIMIT = 200  # characters of a raw value quoted in a message


def _clip(raw: str) -> str:
    return raw if len(raw) <= RAW_LIMIT else raw[:RAW_LIMIT] + "..."


def _dist_hosts(sm: SageMakerEnv) -> list[str]:
    return list(sm.distribution_hosts)


def _multi_host(sm: SageMakerEnv) -> bool:
    return len(sm.distribution_hosts) > 1


def _takes_part(sm: SageMakerEnv) -> bool:
    """False for a host outside the distribution instance groups of a heterogeneous cluster."""
    return not (sm.is_hetero and sm.this_host is not None and sm.distribution_hosts
                and sm.this_host not in sm.distribution_hosts)


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


def _is_ip(addr: str) -> bool:
    try:
        ipaddress.ip_address(addr)
        return True
    except ValueError:
        return False


# -- the config itself ------------------------------------------------------------------------

def _rc_shape_errors(rc: dict[str, Any]) -> Iterator[str]:
    """Structural problems of a resourceconfig.json that parsed to an object."""
    hosts = rc.get("hosts")
    if not (isinstance(hosts, list) and hosts and all(isinstance(h, str) for h in hosts)):
        yield f"resourceconfig.json: hosts is {hosts!r}, not a non-empty list of host names"
    if not isinstance(rc.get("current_host"), str):
        yield f"resourceconfig.json: current_host is {rc.get('current_host')!r}, not a host name"
    groups = rc.get("instance_groups")
    if groups is None:
        return
    if not isinstance(groups, list):
        yield f"resourceconfig.json: instance_groups is {_clip(repr(groups))}, not a list"
        return
    for i, g in enumerate(groups):
        gh = g.get("hosts") if isinstance(g, dict) else None
        if not (isinstance(gh, list) and all(isinstance(h, str) for h in gh)):
            yield f"resourceconfig.json: instance_groups[{i}] is {_clip(repr(g))}, not an object with a hosts list"


CONFIG_HINTS = {
    "SM_HOSTS": 'SM_HOSTS is JSON: read it with hosts = json.loads(os.environ["SM_HOSTS"]) (a list such as '
                '["algo-1","algo-2"]); if you set it yourself, write it as JSON: SM_HOSTS=\'["algo-1","algo-2"]\'.',
    "SM_NUM_GPUS": "SageMaker sets SM_NUM_GPUS to the number of GPUs as a whole number; do not override it.",
    "resourceconfig.json": "SageMaker writes /opt/ml/input/config/resourceconfig.json in every training container; "
                           "outside one (a local emulation) write it yourself, or point DDP_DOCTOR_SM_ROOT at a "
                           "directory holding input/config/resourceconfig.json.",
    "hyperparameters.json": "Every value in hyperparameters.json is a JSON-encoded string; let the estimator's "
                            "hyperparameters={...} write it.",
}
JSON_OBJECT_HINT = "The toolkit writes {name} as a JSON object; code that overrides it must write json.dumps(a_dict)."


@check("DDP201", category="topology", severity="error", title="SageMaker configuration unreadable",
       severities=("warning",))
def sagemaker_config_readable(ctx: RankContext) -> Iterator[Problem]:
    """
    What: A SageMaker variable or config file could not be read as what SageMaker writes: SM_HOSTS
    not a JSON list, SM_NUM_GPUS not a number, SM_FRAMEWORK_PARAMS or SM_TRAINING_ENV not a JSON
    object, resourceconfig.json missing, invalid, or without a hosts list and current_host.
    Why: Scripts and launchers derive the host list, the master and the node rank from these; a
    script that reads `int(os.environ["SM_HOSTS"])` or splits it on commas crashes or computes a
    wrong world.
    Fix: Parse SM_* values as JSON (`json.loads(os.environ["SM_HOSTS"])` is a list), and do not
    override the variables or files SageMaker provides.
    Severity: error for a file or SM_* variable that is unreadable or malformed; a warning when only
    resourceconfig.json is missing (SM_* variables still describe the job).
    """
    sm = ctx.sagemaker
    if sm is None:
        return
    for source, why in sorted(sm.errors.items()):
        raw = ctx.env.get(source) if source.startswith("SM_") else None
        message = why if raw is None or repr(raw) in why else f"{why} (value: {_clip(raw)!r})"
        severity = "warning" if source == "resourceconfig.json" and why.endswith(" is missing") else None
        hint = CONFIG_HINTS.get(source) or JSON_OBJECT_HINT.format(name=source)
        yield Problem(message=message, hint=hint, severity=severity,
                      evidence={"source": source, "value": _clip(raw) if raw is not None else None})
    if sm.resource_config is not None:
        for message in _rc_shape_errors(sm.resource_config):
            yield Problem(message=message, hint=CONFIG_HINTS["resourceconfig.json"],
                          evidence={"source": "resourceconfig.json"})


@check("DDP202", category="topology", severity="error", title="This host is not in the host list")
def current_host_listed(ctx: RankContext) -> Iterator[Problem]:
    """
    What: SM_CURRENT_HOST is not in SM_HOSTS, or resourceconfig.json's current_host is not in its
    hosts.
    Why: The node rank is this host's position in the host list; a host that is not listed has no
    rank, and the toolkit's `hosts.index(current_host)` fails before training starts.
    Fix: Do not override SM_CURRENT_HOST, SM_HOSTS or resourceconfig.json; SageMaker writes them
    consistently in every training container.
    """
    sm = ctx.sagemaker
    if sm is None:
        return
    if sm.hosts is not None and sm.current_host is not None and sm.current_host not in sm.hosts:
        yield Problem(message=f"SM_CURRENT_HOST={sm.current_host!r} is not in SM_HOSTS={sm.hosts}",
                      evidence={"current_host": sm.current_host, "hosts": sm.hosts})
    rc_hosts, rc_host = sm.rc_hosts, sm.rc_current_host
    if rc_hosts is not None and rc_host is not None and rc_host not in rc_hosts:
        yield Problem(message=f"resourceconfig.json current_host={rc_host!r} is not in its hosts {rc_hosts}",
                      evidence={"current_host": rc_host, "hosts": rc_hosts})


@check("DDP203", category="launcher_env", severity="error", title="SM_* variables disagree with resourceconfig.json",
       severities=("warning",))
def sm_variables_match_config(ctx: RankContext) -> Iterator[Problem]:
    """
    What: SM_HOSTS holds other hosts than resourceconfig.json's hosts, or SM_CURRENT_HOST differs
    from its current_host.
    Why: SageMaker derives the SM_* variables from resourceconfig.json; when they differ, a script
    reading the variables computes another world (size, master, node rank) than the launcher uses.
    Under mpirun every rank sees the master's SM_CURRENT_HOST (sagemaker-training-toolkit#158).
    Fix: Read this host from /opt/ml/input/config/resourceconfig.json (current_host) rather than
    SM_CURRENT_HOST, and do not override SM_HOSTS.
    Severity: error when the host lists differ; a warning when only SM_CURRENT_HOST differs under
    mpirun, which every rank inherits from the master (a known toolkit quirk; the file's value is
    used).
    """
    sm = ctx.sagemaker
    if sm is None:
        return
    rc_hosts, rc_host = sm.rc_hosts, sm.rc_current_host
    # Order is DDP204's business; here only the membership.
    if sm.hosts is not None and rc_hosts is not None and sorted(sm.hosts) != sorted(rc_hosts):
        yield Problem(message=f"SM_HOSTS={sm.hosts} but resourceconfig.json hosts are {rc_hosts}",
                      evidence={"SM_HOSTS": sm.hosts, "resourceconfig_hosts": rc_hosts})
    if sm.current_host is not None and rc_host is not None and sm.current_host != rc_host:
        if ctx.launcher.name == "mpirun":
            yield Problem(
                message=f"SM_CURRENT_HOST={sm.current_host!r} but resourceconfig.json current_host={rc_host!r}: "
                        "under mpirun every rank sees the master's SM_CURRENT_HOST "
                        "(sagemaker-training-toolkit#158); ddp-doctor uses the file's value",
                severity="warning",
                evidence={"SM_CURRENT_HOST": sm.current_host, "resourceconfig_current_host": rc_host})
        else:
            yield Problem(
                message=f"SM_CURRENT_HOST={sm.current_host!r} but resourceconfig.json current_host={rc_host!r}",
                evidence={"SM_CURRENT_HOST": sm.current_host, "resourceconfig_current_host": rc_host})


@check("DDP204", category="topology", severity="error", title="Host list has duplicates or is unsorted",
       severities=("warning",))
def hosts_unique_sorted(ctx: RankContext) -> Iterator[Problem]:
    """
    What: resourceconfig.json's hosts (or SM_HOSTS, without the file) name a host twice, or are not
    in the lexicographic order SageMaker writes (algo-10 before algo-2).
    Why: A host listed twice counts twice in the world size, so the job waits for ranks that never
    come; a list in another order than SageMaker's means the file was written by hand and may not
    describe the cluster the job runs on.
    Fix: Do not edit resourceconfig.json or SM_HOSTS; in a local emulation write hosts once each,
    sorted as strings.
    Severity: error when a host is listed twice; a warning when the hosts are only unsorted.
    """
    sm = ctx.sagemaker
    if sm is None:
        return
    source, hosts = ("resourceconfig.json hosts", sm.rc_hosts) if sm.rc_hosts is not None else ("SM_HOSTS", sm.hosts)
    if not hosts:
        return
    dupes = sorted({h for h in hosts if hosts.count(h) > 1})
    if dupes:
        yield Problem(message=f"{source} {hosts} name {', '.join(dupes)} more than once",
                      evidence={"source": source, "hosts": hosts, "duplicates": dupes})
    elif hosts != sorted(hosts):
        yield Problem(message=f"{source} {hosts} are not sorted; SageMaker writes {sorted(hosts)}",
                      severity="warning", evidence={"source": source, "hosts": hosts})


@check("DDP205", category="topology", severity="error", title="Instance groups do not match the hosts")
def instance_groups_consistent(ctx: RankContext) -> Iterator[Problem]:
    """
    What: An instance group in resourceconfig.json lists a host that is not in its hosts, or
    SM_DISTRIBUTION_INSTANCE_GROUPS names a group that does not exist.
    Why: The toolkit takes the distribution hosts, and so the master and the node ranks, from the
    instance groups; a host outside the cluster is never reached and the job hangs at rendezvous.
    Fix: Do not edit resourceconfig.json; in the estimator, name in `instance_groups` and
    `distribution={..., "instance_groups": [...]}` only groups that exist.
    """
    sm = ctx.sagemaker
    if sm is None or sm.resource_config is None:
        return
    groups = sm.resource_config.get("instance_groups")
    hosts = sm.rc_hosts
    if not isinstance(groups, list):
        return  # shape problems are DDP201's
    names = []
    for g in groups:
        if not isinstance(g, dict):
            continue
        names.append(g.get("instance_group_name"))
        gh = g.get("hosts")
        if hosts is None or not isinstance(gh, list):
            continue
        extra = [h for h in gh if h not in hosts]
        if extra:
            yield Problem(
                message=f"instance group {g.get('instance_group_name')!r} lists {extra}, not in hosts {hosts}",
                evidence={"group": g.get("instance_group_name"), "extra": extra, "hosts": hosts})
    if sm.is_hetero and sm.distribution_groups:
        missing = [n for n in sm.distribution_groups if n not in names]
        if missing:
            yield Problem(
                message=f"SM_DISTRIBUTION_INSTANCE_GROUPS names {missing}, but the instance groups are {names}",
                evidence={"distribution_groups": sm.distribution_groups, "groups": names})


@check("DDP206", category="topology", severity="info", title="Master is not the first host by name")
def master_not_first_sorted(ctx: RankContext) -> Iterator[Problem]:
    """
    What: resourceconfig.json's instance_groups list the hosts in another order than their names
    sort; that order, not the names, decides the master and the node ranks.
    Why: The toolkit makes distribution_hosts[0] the master and gives each host its index as node
    rank; code that assumes algo-1 is the master, or derives ranks from SM_HOSTS or the algo-N
    suffix, points ranks at the wrong host and hangs at rendezvous.
    Fix: Take the master from `json.loads(os.environ["SM_TRAINING_ENV"])["master_hostname"]` (or
    MASTER_ADDR under torchrun) and the node rank from GROUP_RANK; never assume algo-1.
    """
    sm = ctx.sagemaker
    if sm is None or not _multi_host(sm):
        return
    dh = _dist_hosts(sm)
    if dh == sorted(dh):
        return
    here = sm.this_host
    where = f"; this host {here} is node {dh.index(here)}" if here in dh else ""
    yield Problem(
        message=f"instance_groups list the hosts as {dh}: the master is {dh[0]} (not {sorted(dh)[0]}) and "
                f"node ranks follow this order{where}",
        evidence={"distribution_hosts": dh, "master": dh[0], "this_host": here})


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
    if sm is None or ctx.launcher.name not in ("torchrun", "env") or not _multi_host(sm) or not _takes_part(sm):
        return
    master, dh = sm.master_hostname, _dist_hosts(sm)
    te_master = sm.training_env.get("master_hostname")
    ev = {"MASTER_ADDR": ctx.master_addr, "master": master, "training_env_master": te_master,
          "distribution_hosts": dh, "this_host": sm.this_host, "node_rank": ctx.node_rank}
    if isinstance(te_master, str) and master and te_master != master:
        yield Problem(message=f"SM_TRAINING_ENV master_hostname={te_master!r} but resourceconfig.json "
                              f"instance_groups put {master!r} first ({dh})", evidence=ev)
    addr = ctx.master_addr
    if not addr or _is_ip(addr):
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
            message=f"MASTER_ADDR={addr} but the SageMaker master is {master} (distribution_hosts[0] of {dh})",
            severity=None if _toolkit_torchrun(ctx, sm) else "warning", evidence=ev,
            hint=None if _toolkit_torchrun(ctx, sm) else
            f"Works only if rank 0 runs on {addr}; prefer MASTER_ADDR={master} and node ranks in the order {dh}.")


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
            or not _multi_host(sm) or ctx.master_port in (None, TORCHRUN_PORT)):
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
    if sm is None or ctx.launcher.name != "torchrun" or not _multi_host(sm):
        return
    dh, here, nr = _dist_hosts(sm), sm.this_host, ctx.node_rank
    if here not in dh or nr is None or nr == dh.index(here):
        return
    toolkit = _toolkit_torchrun(ctx, sm)
    yield Problem(
        message=f"GROUP_RANK={nr} but this host {here} is at position {dh.index(here)} of the distribution "
                f"hosts {dh} (master {dh[0]})",
        # A torchrun of your own with a dynamic (c10d) rendezvous numbers nodes in join order.
        severity=None if toolkit else "warning",
        hint=None if toolkit else
        f"With --rdzv-backend c10d node ranks follow join order and this is expected; with a static "
        f"rendezvous pass --node_rank {dh.index(here)} on this host.",
        evidence={"node_rank": nr, "expected": dh.index(here), "distribution_hosts": dh, "this_host": here})


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
    if sm is None or ctx.launcher.name not in ("torchrun", "env", "mpirun") or not _takes_part(sm):
        return
    dh, ppn = _dist_hosts(sm), sm.processes_per_host
    if not dh:
        return
    world_n, lworld_n = (("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE") if ctx.launcher.name == "mpirun"
                         else ("WORLD_SIZE", "LOCAL_WORLD_SIZE"))
    # With no distribution the launcher is the user's own: say so, but it may be intended.
    severity = None if sm.distribution != "none" else "warning"
    ev = {"world_size": ctx.world_size, "local_world_size": ctx.local_world_size, "hosts": dh,
          "processes_per_host": ppn, "distribution": sm.distribution}
    expected = len(dh) * ppn
    if ctx.launcher.name == "mpirun":
        dist = f'{{"mpi": {{"enabled": True, "processes_per_host": {ppn}}}}}'
        own = f"`mpirun -np {expected} -npernode {ppn} ...`"
    else:
        dist = '{"torch_distributed": {"enabled": True}}'
        own = f"`torchrun --nnodes {len(dh)} --nproc-per-node {ppn} --node_rank <index in {dh}> ...` on every host"
    hint = f"Let the estimator start the ranks (distribution={dist}) or run {own}"
    if ctx.world_size is not None and ctx.world_size != expected:
        yield Problem(
            message=f"{world_n}={ctx.world_size} but SageMaker runs {len(dh)} host(s) {dh} x {ppn} processes "
                    f"per host ({_ppn_source(sm)}) = {expected}",
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
    if _multi_host(sm):
        addr, port = env.get("SMDATAPARALLEL_SERVER_ADDR"), env.get("SMDATAPARALLEL_SERVER_PORT")
        ev = {"SMDATAPARALLEL_SERVER_ADDR": addr, "SMDATAPARALLEL_SERVER_PORT": port,
              "master": sm.master_hostname, "distribution_hosts": _dist_hosts(sm)}
        if not addr:
            yield Problem(message=f"SMDATAPARALLEL_SERVER_ADDR is not set on a {len(sm.distribution_hosts)}-host "
                                  f"job (master {sm.master_hostname})", evidence=ev)
        elif not _is_ip(addr) and sm.master_hostname and addr.split(".")[0] != sm.master_hostname:
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


@check("DDP214", category="topology", severity="info", title="Host outside the distribution instance groups")
def host_outside_distribution(ctx: RankContext) -> Iterator[Problem]:
    """
    What: In a heterogeneous cluster (SM_IS_HETERO), this host belongs to no instance group named
    in the distribution, so it takes no part in the distributed training.
    Why: Only the distribution groups' hosts get ranks; work placed here (e.g. data preprocessing)
    runs outside the process group.
    Fix: Nothing if intended; otherwise add this host's group to the distribution's
    `instance_groups` in the estimator.
    """
    sm = ctx.sagemaker
    if sm is None or _takes_part(sm):
        return
    yield Problem(message=f"this host {sm.this_host} is not in the distribution hosts {_dist_hosts(sm)} "
                          f"(SM_DISTRIBUTION_INSTANCE_GROUPS={sm.distribution_groups})",
                  evidence={"this_host": sm.this_host, "distribution_hosts": _dist_hosts(sm),
                            "distribution_groups": sm.distribution_groups})


@check("DDP215", category="launcher_env", severity="warning", title="EFA not configured for NCCL",
       severities=("info",))
def efa_environment(ctx: RankContext) -> Iterator[Problem]:
    """
    What: A multi-host GPU job on an EFA instance type lacks the variables the SageMaker toolkit
    sets for EFA: FI_PROVIDER=efa, NCCL_PROTO=simple, and FI_EFA_USE_DEVICE_RDMA=1 on p4d/p4de.
    Why: Without them NCCL may fall back to TCP sockets and run at a fraction of the network's
    bandwidth (sagemaker-training-toolkit#240). NCCL_IB_DISABLE=1 only turns off InfiniBand verbs,
    not EFA through the aws-ofi-nccl plugin.
    Fix: Export FI_PROVIDER=efa, NCCL_PROTO=simple and (p4d/p4de) FI_EFA_USE_DEVICE_RDMA=1 before
    the ranks start, e.g. in the estimator's `environment={...}`, when you launch ranks yourself.
    Severity: a warning for an EFA setting NCCL needs; info for NCCL_IB_DISABLE=1, which does not
    affect EFA.
    """
    sm = ctx.sagemaker
    if (sm is None or sm.instance_type not in EFA_INSTANCES or not _multi_host(sm)
            or ctx.backend not in ("nccl", "smddp")):
        return
    env, it = ctx.env, sm.instance_type
    ev = {"instance_type": it, **{k: env.get(k) for k in
                                  ("FI_PROVIDER", "NCCL_PROTO", "FI_EFA_USE_DEVICE_RDMA", "NCCL_IB_DISABLE")}}
    if env.get("FI_PROVIDER") != "efa":
        yield Problem(message=f"{_show(env, 'FI_PROVIDER')} on {it} (expected 'efa')", evidence=ev)
    if (env.get("NCCL_PROTO") or "").lower() != "simple":
        yield Problem(message=f"{_show(env, 'NCCL_PROTO')} on {it} (the toolkit sets 'simple' for EFA)",
                      evidence=ev)
    if it in EFA_RDMA_INSTANCES and env.get("FI_EFA_USE_DEVICE_RDMA") != "1":
        yield Problem(message=f"{_show(env, 'FI_EFA_USE_DEVICE_RDMA')} on {it} "
                              "(expected '1': GPUDirect RDMA over EFA)", evidence=ev)
    if env.get("NCCL_IB_DISABLE") == "1":
        yield Problem(message=f"NCCL_IB_DISABLE=1 on {it}: this disables InfiniBand verbs only; EFA is used "
                              "through the aws-ofi-nccl plugin regardless", severity="info", evidence=ev)
