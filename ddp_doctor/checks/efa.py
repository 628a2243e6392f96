"""EFA and NCCL's network on AWS instances, on any launcher (SageMaker, EC2, SLURM, HyperPod):
the EFA variables (DDP215), the EFA devices (DDP330), libfabric's EFA provider (DDP331), the
aws-ofi-nccl plugin (DDP332), the locked-memory limit (DDP333), NCCL settings that cost
bandwidth (DDP334), and the network NCCL chose, from its own INFO output (DDP335).

Every check here is silent unless the instance type is an EFA type of the one instance table
(ddp_doctor.facts.instances), the backend is NCCL (or smddp) and, except DDP334's peer-to-peer
part, the job spans more than one node: on CPU, off AWS and on single-node jobs nothing fires.
The instance type comes from ddp_doctor.facts.efa.instance_type: --instance-type,
DDP_DOCTOR_INSTANCE_TYPE, SageMaker's SM_CURRENT_INSTANCE_TYPE, else the DMI product name.
Node-wide facts (devices, libfabric, plugin, memlock) are reported by local rank 0 only.

NCCL_SOCKET_IFNAME naming a missing interface is DDP301's (any launcher); it is not repeated here.
"""
from __future__ import annotations

import os
import socket
from typing import Any, Iterator

from ddp_doctor.checks.sagemaker_config import takes_part
from ddp_doctor.context import RankContext
from ddp_doctor.facts import efa as efa_facts
from ddp_doctor.facts import launchers
from ddp_doctor.facts.efa import InstanceTypeSeen
from ddp_doctor.facts.instances import InstanceType, lookup
from ddp_doctor.findings import Finding, Problem
from ddp_doctor.registry import REGISTRY, check

MIB = 1 << 20
# Below this memlock soft limit EFA memory registration fails outright (containers often get 64 KiB,
# systemd's recent default is 8 MiB); above it but finite, large registrations may still fail.
MEMLOCK_ERROR_BELOW = 64 * MIB
# Settings read from ctx.options: instance_type (--instance-type), nccl_debug_file (a path to
# NCCL's INFO output for DDP335; else NCCL_DEBUG_FILE with %h/%p expanded for this process).


# ---------------------------------------------------------------------------------------------
# Helpers (DDP215 and the DDP33x checks share them)

def instance(ctx: RankContext) -> tuple[InstanceType | None, InstanceTypeSeen | None]:
    """This host's row of the instance table and the instance type as seen (name, source)."""
    sm_type = ctx.sagemaker.instance_type if ctx.sagemaker is not None else None
    option = ctx.options.get("instance_type") if ctx.options else None
    seen = efa_facts.instance_type(ctx.env, sagemaker=sm_type if isinstance(sm_type, str) else None,
                                   option=option if isinstance(option, str) else None)
    return (lookup(seen.name) if seen else None), seen


def is_efa(row: InstanceType | None) -> bool:
    return row is not None and (row.efa or row.efa_devices is not None)


def _multi_node(ctx: RankContext) -> bool:
    """The job spans more than one node (facts.launchers.multi_node over SageMaker's hosts, when
    this host takes part, the launcher's node count and the world and local world sizes)."""
    sm = ctx.sagemaker
    hosts = len(sm.distribution_hosts) if sm is not None and takes_part(sm) else None
    return launchers.multi_node(ctx.world_size, ctx.local_world_size, nnodes=ctx.nnodes, hosts=hosts)


def _nccl(ctx: RankContext) -> bool:
    return ctx.backend in ("nccl", "smddp")


def efa_job(ctx: RankContext) -> tuple[InstanceType, InstanceTypeSeen] | None:
    """(row, seen) when this rank runs a multi-node NCCL job on an EFA instance type, else None."""
    if not _nccl(ctx) or not _multi_node(ctx):
        return None
    row, seen = instance(ctx)
    if not is_efa(row) or seen is None or row is None:
        return None
    return row, seen


def _leader(ctx: RankContext) -> bool:
    return ctx.local_rank in (None, 0)


def _show(env: Any, name: str) -> str:
    v = env.get(name)
    return f"{name} is unset" if v is None else f"{name}={v!r}"


def _where(seen: InstanceTypeSeen) -> str:
    return f"{seen.name} (from {seen.source})"


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / MIB:.0f} MiB" if n >= MIB else f"{n // 1024} KiB"


# ---------------------------------------------------------------------------------------------
# DDP215: the EFA variables

@check("DDP215", category="launcher_env", severity="warning", title="EFA not configured for NCCL",
       severities=("info",))
def efa_environment(ctx: RankContext) -> Iterator[Problem]:
    """
    What: A multi-node NCCL job on an EFA instance type has EFA variables missing or set against
    EFA. Under SageMaker (types the toolkit treats as EFA): FI_PROVIDER=efa, NCCL_PROTO=simple and,
    on p4d/p4de/trn1, FI_EFA_USE_DEVICE_RDMA=1 missing, as the toolkit sets them. Under any other
    launcher (EC2, SLURM, HyperPod, your own torchrun), where aws-ofi-nccl picks EFA and the protocol
    itself: FI_PROVIDER set to another provider, NCCL_PROTO set without simple, or
    FI_EFA_USE_DEVICE_RDMA=0 on a GPUDirect RDMA type. NCCL_IB_DISABLE=1 is noted.
    Why: Without them NCCL may fall back to TCP sockets and run at a fraction of the network's
    bandwidth (sagemaker-training-toolkit#240); protocols other than simple can deliver data out of
    order over EFA (the reason the toolkit sets NCCL_PROTO=simple). NCCL_IB_DISABLE=1 only turns
    off InfiniBand verbs, not EFA through the aws-ofi-nccl plugin.
    Fix: Export FI_PROVIDER=efa, NCCL_PROTO=simple and (p4d/p4de) FI_EFA_USE_DEVICE_RDMA=1 before
    the ranks start, e.g. in the estimator's `environment={...}` when you launch ranks yourself on
    SageMaker; elsewhere unset the variables that point away from EFA (`unset FI_PROVIDER
    NCCL_PROTO`) or set them to those values in the job script.
    Severity: a warning for an EFA setting NCCL needs; info for NCCL_IB_DISABLE=1, which does not
    affect EFA.
    """
    job = efa_job(ctx)
    if job is None:
        return
    row, seen = job
    env, it = ctx.env, seen.name
    ev = {"instance_type": it, "instance_type_source": seen.source,
          **{k: env.get(k) for k in ("FI_PROVIDER", "NCCL_PROTO", "FI_EFA_USE_DEVICE_RDMA", "NCCL_IB_DISABLE")}}
    if ctx.sagemaker is not None and row.efa:
        # The toolkit exports these on its EFA types: missing means the launch bypassed it.
        if env.get("FI_PROVIDER") != "efa":
            yield Problem(message=f"{_show(env, 'FI_PROVIDER')} on {it} (expected 'efa')", evidence=ev)
        if (env.get("NCCL_PROTO") or "").lower() != "simple":
            yield Problem(message=f"{_show(env, 'NCCL_PROTO')} on {it} (the toolkit sets 'simple' for EFA)",
                          evidence=ev)
        if row.efa_rdma and env.get("FI_EFA_USE_DEVICE_RDMA") != "1":
            yield Problem(message=f"{_show(env, 'FI_EFA_USE_DEVICE_RDMA')} on {it} "
                                  "(expected '1': GPUDirect RDMA over EFA)", evidence=ev)
    else:
        where = _where(seen)
        fp = (env.get("FI_PROVIDER") or "").strip()
        if fp and fp.lower() != "efa":
            yield Problem(message=f"FI_PROVIDER={fp!r} on {where}: libfabric will not offer its efa provider "
                                  "to aws-ofi-nccl, so NCCL falls back to TCP sockets",
                          hint="Unset FI_PROVIDER (aws-ofi-nccl selects efa itself) or set FI_PROVIDER=efa.",
                          evidence=ev)
        proto = (env.get("NCCL_PROTO") or "").strip()
        if proto and "simple" not in proto.lower():
            yield Problem(message=f"NCCL_PROTO={proto!r} on {where}: aws-ofi-nccl sets 'simple' for EFA "
                                  "itself, and this value overrides it",
                          hint="Unset NCCL_PROTO or set NCCL_PROTO=simple.", evidence=ev)
        if row.efa_rdma and (env.get("FI_EFA_USE_DEVICE_RDMA") or "").strip() == "0":
            yield Problem(message=f"FI_EFA_USE_DEVICE_RDMA='0' on {where}: GPUDirect RDMA over EFA is off, "
                                  "so every transfer is staged through host memory",
                          hint="Unset FI_EFA_USE_DEVICE_RDMA or set it to 1.", evidence=ev)
    if env.get("NCCL_IB_DISABLE") == "1":
        yield Problem(message=f"NCCL_IB_DISABLE=1 on {it}: this disables InfiniBand verbs only; EFA is used "
                              "through the aws-ofi-nccl plugin regardless", severity="info", evidence=ev)


# ---------------------------------------------------------------------------------------------
# DDP330-DDP334: this node's EFA stack

@check("DDP330", category="network", severity="error", title="Fewer EFA devices than the instance type has",
       cause_class="host")
def efa_device_count(ctx: RankContext) -> Iterator[Problem]:
    """
    What: On an EFA instance type running a multi-node NCCL job, the EFA devices this process can
    use are fewer than the type has (the instance table's EFA count, with its source: p4d/p4de 4,
    p5/p5e 32, p5en 16, ...): fewer /sys/class/infiniband devices bound to the efa driver, or fewer
    /dev/infiniband/uverbs* device files than those (a container not given its devices).
    Why: NCCL spreads inter-node traffic over every EFA device it finds; each missing one removes
    its share of the instance's network bandwidth, and with none NCCL falls back to TCP sockets.
    Fix: Launch the instance with one EFA interface per network card (SageMaker does this itself;
    on EC2 see "EFA configuration for a P5 and P5e instances" in the EC2 user guide), and pass the
    devices into containers: `docker run --device=/dev/infiniband/uverbs0 ...` for each device (or
    `--privileged`), on EKS request `vpc.amazonaws.com/efa: <count>` with the EFA device plugin.
    """
    job = efa_job(ctx)
    if job is None or not _leader(ctx):
        return
    row, seen = job
    expected = row.efa_devices
    if expected is None:
        return
    dev = efa_facts.efa_devices(efa_facts.sys_root(ctx.env))
    ev = {"instance_type": seen.name, "instance_type_source": seen.source, "expected": expected,
          "expected_source": row.efa_source, "efa_devices": list(dev.efa), "other_rdma_devices": list(dev.other),
          "uverbs": list(dev.uverbs), "sysfs_readable": dev.sysfs_readable}
    where = _where(seen)
    if dev.sysfs_readable and len(dev.efa) < expected:
        names = f" ({', '.join(dev.efa)})" if dev.efa else ""
        yield Problem(message=f"{len(dev.efa)} EFA device(s){names} in /sys/class/infiniband on {where}, "
                              f"which has {expected}: NCCL gets {len(dev.efa)}/{expected} of the EFA bandwidth"
                              + (" and falls back to TCP sockets" if not dev.efa else ""), evidence=ev)
    elif dev.sysfs_readable and len(dev.uverbs) < len(dev.efa):
        yield Problem(message=f"{len(dev.uverbs)} /dev/infiniband/uverbs* device file(s) but the host has "
                              f"{len(dev.efa)} EFA device(s) ({', '.join(dev.efa)}) on {where}: this process (its "
                              "container) was not given "
                              + ("any of them; NCCL falls back to TCP sockets" if not dev.uverbs else "all of them"),
                      hint="Pass every device into the container: `docker run --device=/dev/infiniband/uverbs0 "
                           "--device=/dev/infiniband/uverbs1 ...` (or --privileged); on EKS request "
                           f"`vpc.amazonaws.com/efa: {len(dev.efa)}` with the EFA device plugin.", evidence=ev)
    elif not dev.sysfs_readable and len(dev.uverbs) < expected:
        what = (f"{len(dev.uverbs)} /dev/infiniband/uverbs* device file(s) and no /sys/class/infiniband"
                if dev.uverbs else "no EFA device (no /sys/class/infiniband, no /dev/infiniband/uverbs*: the "
                "EFA driver is not loaded or no EFA interface is attached)")
        yield Problem(message=f"{what} on {where}, which has {expected}: NCCL gets "
                              f"{len(dev.uverbs)}/{expected} of the EFA bandwidth"
                              + (" and falls back to TCP sockets" if not dev.uverbs else ""), evidence=ev)


@check("DDP331", category="network", severity="error", title="libfabric has no EFA provider", timeout=15.0,
       cause_class="configuration")
def libfabric_efa_provider(ctx: RankContext) -> Iterator[Problem]:
    """
    What: On an EFA instance type running a multi-node NCCL job with EFA devices present,
    `fi_info -p efa -t FI_EP_RDM` (run with the rank's environment, bounded to a few seconds) lists
    no efa provider. Silent when fi_info is not installed (PATH, /opt/amazon/efa/bin) or does not
    answer in time: that alone proves nothing.
    Why: aws-ofi-nccl reaches EFA through libfabric's efa provider; without it the plugin fails
    ("NET/OFI Couldn't find any optimal provider") and NCCL falls back to TCP sockets. Usual
    causes: the EFA software not installed in the container, an older libfabric found first on
    LD_LIBRARY_PATH, or FI_PROVIDER naming another provider.
    Fix: Install the EFA software in the image (`./efa_installer.sh -y --skip-kmod` in containers),
    put /opt/amazon/efa/lib first on LD_LIBRARY_PATH, unset FI_PROVIDER or set it to efa, and check
    with `fi_info -p efa -t FI_EP_RDM`.
    """
    job = efa_job(ctx)
    if job is None or not _leader(ctx):
        return
    _, seen = job
    dev = efa_facts.efa_devices(efa_facts.sys_root(ctx.env))
    if not dev.efa and not dev.uverbs:
        return  # no device at all is DDP330's finding; no provider follows from it
    fi = efa_facts.fi_info_efa(ctx.env)
    if fi.status != "ok" or fi.has_efa:
        return
    fp = ctx.env.get("FI_PROVIDER")
    first = fi.output.splitlines()[0] if fi.output else "no output"
    yield Problem(
        message=f"`fi_info -p efa -t FI_EP_RDM` ({fi.path}) lists no efa provider on {_where(seen)} "
                f"(exit {fi.returncode}: {first!r})"
                + (f"; FI_PROVIDER={fp!r} restricts libfabric's providers" if fp and fp.lower() != "efa" else ""),
        evidence={"fi_info": fi.path, "returncode": fi.returncode, "providers": list(fi.providers),
                  "output": fi.output, "FI_PROVIDER": fp, "efa_devices": list(dev.efa)})


@check("DDP332", category="network", severity="error", title="aws-ofi-nccl plugin not found where NCCL looks",
       cause_class="configuration")
def ofi_nccl_plugin(ctx: RankContext) -> Iterator[Problem]:
    """
    What: On an EFA instance type running a multi-node NCCL job, no NCCL network plugin library
    (libnccl-net.so, libnccl-net-ofi.so, libnccl-net-aws-ofi.so, or libnccl-net-X.so for
    NCCL_NET_PLUGIN=X) is in a directory the dynamic loader searches (LD_LIBRARY_PATH,
    /etc/ld.so.conf.d, the system library directories), or NCCL_NET_PLUGIN=none.
    Why: NCCL uses EFA only through the aws-ofi-nccl plugin; without it NCCL logs "NET/Plugin: No
    plugin found" (or "Could not find: libnccl-net.so") and runs over TCP sockets at a fraction of
    the instance's bandwidth. A plugin installed under /opt/amazon/ofi-nccl/lib is not loaded
    unless that directory is on the loader's path.
    Fix: Install aws-ofi-nccl (the EFA installer ships it under /opt/amazon/ofi-nccl; AWS Deep
    Learning Containers have it) and `export LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:$LD_LIBRARY_PATH`
    before the ranks start; unset NCCL_NET_PLUGIN=none.
    """
    job = efa_job(ctx)
    if job is None or not _leader(ctx):
        return
    _, seen = job
    plugin = efa_facts.find_net_plugin(ctx.env)
    ev = {"NCCL_NET_PLUGIN": plugin.requested, "names": list(plugin.names), "loadable": list(plugin.loadable),
          "elsewhere": list(plugin.elsewhere), "searched": list(plugin.searched),
          "LD_LIBRARY_PATH": ctx.env.get("LD_LIBRARY_PATH")}
    if plugin.disabled:
        yield Problem(message=f"NCCL_NET_PLUGIN={plugin.requested!r} on {_where(seen)}: NCCL loads no network "
                              "plugin, so it cannot use EFA and runs over TCP sockets",
                      hint="Unset NCCL_NET_PLUGIN (NCCL then loads libnccl-net.so from aws-ofi-nccl).", evidence=ev)
        return
    if plugin.loadable:
        return
    if plugin.elsewhere:
        dirs = sorted({os.path.dirname(p) for p in plugin.elsewhere})
        yield Problem(message=f"aws-ofi-nccl is at {', '.join(plugin.elsewhere)} on {_where(seen)}, but "
                              f"{' and '.join(dirs)} is not on LD_LIBRARY_PATH nor in /etc/ld.so.conf.d: NCCL "
                              "will not load it and runs over TCP sockets",
                      hint=f"export LD_LIBRARY_PATH={':'.join(dirs)}:$LD_LIBRARY_PATH before the ranks start.",
                      evidence=ev)
        return
    yield Problem(message=f"no NCCL net plugin ({', '.join(plugin.names)}) in LD_LIBRARY_PATH, /etc/ld.so.conf.d "
                          f"or the system library directories on {_where(seen)}: NCCL runs over TCP sockets "
                          "instead of EFA", evidence=ev)


@check("DDP333", category="network", severity="error", title="Locked-memory limit too low for EFA",
       severities=("warning",), cause_class="configuration")
def memlock_unlimited(ctx: RankContext) -> Iterator[Problem]:
    """
    What: On an EFA instance type running a multi-node NCCL job, the locked-memory limit
    (RLIMIT_MEMLOCK, `ulimit -l`) is not unlimited.
    Why: libfabric's EFA provider pins (registers) the buffers it sends from and receives into;
    past the limit registration fails ("Cannot allocate memory", "ibv_reg_mr failed") and NCCL
    either errors out or falls back to TCP sockets. Containers often start with 64 KiB.
    Fix: `ulimit -l unlimited` in the launch script (up to the hard limit), `docker run --ulimit
    memlock=-1:-1`, `memlock unlimited` in /etc/security/limits.conf, LimitMEMLOCK=infinity for a
    systemd unit, or PropagateResourceLimitsExcept=MEMLOCK in slurm.conf with the slurmd limit raised.
    Severity: error below 64 MiB (registration fails outright); a warning for a larger finite limit,
    which large buffers can still exceed.
    """
    job = efa_job(ctx)
    if job is None or not _leader(ctx):
        return
    _, seen = job
    soft, hard = efa_facts.memlock_limit()
    if soft is None:
        return
    hard_s = "unlimited" if hard is None else _size(hard)
    yield Problem(message=f"locked-memory limit (ulimit -l) is {_size(soft)} (hard limit {hard_s}) on {_where(seen)}; "
                          "EFA needs it unlimited",
                  severity=None if soft < MEMLOCK_ERROR_BELOW else "warning",
                  evidence={"soft_bytes": soft, "hard_bytes": hard, "instance_type": seen.name})


@check("DDP334", category="network", severity="warning", title="NCCL settings that cost bandwidth on EFA",
       cause_class="configuration")
def nccl_costly_settings(ctx: RankContext) -> Iterator[Problem]:
    """
    What: On an EFA instance type with NCCL, settings that take NCCL off its fast paths:
    NCCL_NET naming a network other than the OFI plugin (Socket, IB) on a multi-node job, or
    NCCL_P2P_DISABLE=1 on an instance whose GPUs are joined by NVLink/NVSwitch.
    Why: NCCL_NET=Socket forces TCP sockets (a fraction of EFA's bandwidth); NCCL_NET=IB asks for
    InfiniBand verbs, which do not drive EFA, so NCCL fails to initialise its network.
    NCCL_P2P_DISABLE=1 sends intra-node traffic through host memory instead of NVLink, several
    times slower on p4d/p5. These are often left over from debugging another cluster.
    Fix: Unset NCCL_NET (NCCL picks the aws-ofi-nccl plugin) and NCCL_P2P_DISABLE in the job's
    environment.
    """
    if not _nccl(ctx):
        return
    row, seen = instance(ctx)
    if not is_efa(row) or seen is None or row is None:
        return
    env = ctx.env
    net = (env.get("NCCL_NET") or "").strip()
    ev = {"instance_type": seen.name, "instance_type_source": seen.source, "NCCL_NET": env.get("NCCL_NET"),
          "NCCL_P2P_DISABLE": env.get("NCCL_P2P_DISABLE")}
    if net and _multi_node(ctx) and efa_facts.network_kind(net) != "OFI":
        cost = ("forces NCCL's TCP socket transport: inter-node collectives run at a fraction of EFA's bandwidth"
                if net.lower().startswith("socket") else
                "names a network that does not drive EFA: NCCL fails to initialise it or falls back to sockets")
        yield Problem(message=f"NCCL_NET={net!r} on {_where(seen)} {cost}", evidence=ev)
    if (env.get("NCCL_P2P_DISABLE") or "").strip() == "1" and row.nvlink:
        yield Problem(message=f"NCCL_P2P_DISABLE=1 on {_where(seen)}, whose GPUs are joined by NVLink/NVSwitch: "
                              "intra-node traffic goes through host memory instead, several times slower",
                      evidence=ev)


# ---------------------------------------------------------------------------------------------
# DDP335: the network NCCL chose, from its own INFO output

def nccl_log_path(ctx: RankContext) -> str | None:
    """Where this process's NCCL INFO output is: ctx.options["nccl_debug_file"], else
    NCCL_DEBUG_FILE with %h (host name) and %p (this process id) expanded; None when neither."""
    explicit = ctx.options.get("nccl_debug_file") if ctx.options else None
    if isinstance(explicit, str) and explicit:
        return explicit
    pattern = (ctx.env.get("NCCL_DEBUG_FILE") or "").strip()
    if not pattern:
        return None
    return efa_facts.expand_nccl_debug_file(pattern, hostname=socket.gethostname(), pid=os.getpid())


def judge_nccl_network(lines: list[str], seen: InstanceTypeSeen, source: str) -> Problem | None:
    """The DDP335 problem for NCCL INFO `lines` on an EFA instance type, or None."""
    net = efa_facts.nccl_network(lines)
    if net.kind != "Socket":
        return None
    quoted = "; ".join(repr(x) for x in (*net.plugin_failed[-2:], *net.lines))
    return Problem(
        message=f"NCCL chose its TCP socket transport on {_where(seen)} (from {source}): {quoted}",
        evidence={"instance_type": seen.name, "network": net.name, "lines": list(net.lines),
                  "plugin_failed": list(net.plugin_failed), "provider": net.provider, "log": source})


def nccl_network_finding(lines: list[str], instance_type: str, source: str, *, nodes: int,
                         given_by: str) -> Finding | None:
    """DDP335 after the fact (`ddp-doctor analyze`): NCCL's INFO `lines` of a job of `nodes` hosts
    of `instance_type` (as `given_by` names it: the SageMaker job's description, --instance-type),
    or None when the type has no EFA, the job ran on one host, or NCCL did not choose sockets."""
    if nodes < 2 or not is_efa(lookup(instance_type)):
        return None
    problem = judge_nccl_network(lines, InstanceTypeSeen(instance_type, given_by), source)
    return REGISTRY["DDP335"].finding(problem, None, "training") if problem is not None else None


def _warm_up(group: Any) -> None:
    """One small all_reduce on the process group so that NCCL creates its communicator (and logs
    the network it chose) now, before the log is read. Every rank of an NCCL group runs it, decided
    only by values all ranks share (backend and world size), so no rank waits alone."""
    import torch
    import torch.distributed as dist
    t = torch.ones(1, device=group.device)
    group.wait(dist.all_reduce(t, async_op=True))


@check("DDP335", category="network", severity="error", stage="group", timeout=300.0,
       title="NCCL uses TCP sockets on an EFA instance", cause_class="configuration")
def nccl_network_is_efa(ctx: RankContext, group: Any) -> Iterator[Problem]:
    """
    What: After the NCCL process group is up (one small all_reduce creates NCCL's communicator),
    NCCL's own INFO output says it chose its TCP socket transport ("NCCL INFO Using network
    Socket", "NET/Socket : Using [0]eth0", "via NET/Socket/0") instead of EFA through aws-ofi-nccl
    ("Using network AWS Libfabric" / "Libfabric", "NET/OFI Selected Provider is efa") on an EFA
    instance type, multi-node. Read from the file NCCL_DEBUG_FILE names for this process (with
    NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET), or the path in the option nccl_debug_file;
    silent without such a log. After the fact (`ddp-doctor analyze`): from the NCCL INFO lines
    in the job's logs, with the instance type of `--sagemaker-job`'s description or
    `--instance-type`, for a job of more than one host.
    Why: Over sockets inter-node collectives run at a small fraction of EFA's bandwidth and the job
    is several times slower, with no error anywhere: only NCCL's INFO lines tell.
    Fix: The plugin failed or is missing: see DDP331/DDP332 and the NET/OFI warnings quoted; unset
    NCCL_NET=Socket and FI_PROVIDER values other than efa; check that the EFA devices reach the
    process (DDP330) and `ulimit -l unlimited` (DDP333). Confirm with `NCCL_DEBUG=INFO
    NCCL_DEBUG_SUBSYS=INIT,NET`: NCCL must log "NET/OFI Selected Provider is efa".
    """
    if getattr(group, "backend", None) != "nccl" or getattr(group, "world_size", 1) < 2:
        return
    _warm_up(group)
    job = efa_job(ctx)
    if job is None:
        return
    path = nccl_log_path(ctx)
    if path is None:
        return
    lines = efa_facts.read_log_lines(path)
    if not lines:
        return
    problem = judge_nccl_network(lines, job[1], path)
    if problem is not None:
        yield problem
