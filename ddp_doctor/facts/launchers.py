"""Which launcher started this process, and the rank layout it says we have.

Pure functions over an environment mapping. Recognised, in this order:
- `spawn`: rank and world size passed explicitly to the Python API (torch.multiprocessing.spawn)
- `torchrun`: torch elastic (TORCHELASTIC_RUN_ID, GROUP_RANK, LOCAL_WORLD_SIZE, ROLE_*)
- `mpirun`: Open MPI (OMPI_COMM_WORLD_*), as SageMaker's MPI and smdistributed runners use
- `mpich`: MPICH / Intel MPI hydra (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS)
- `slurm`: srun tasks (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NNODES, SLURM_STEP_ID)
- `env`: any launcher that sets RANK and WORLD_SIZE
- `none`: a plain process
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

from ddp_doctor.facts.env_values import Invalid, as_int, env_bool, env_int

LAUNCHERS = ("spawn", "torchrun", "mpirun", "mpich", "slurm", "env", "none")

# The most ranks a job can have here (2**20): far beyond any real job, small enough that what
# is made per rank (a rendezvous's lists, a report's ranks) stays bounded. A rank, local rank,
# world size or node count past it is not believed: it is read as invalid (DDP101).
MAX_RANKS = 1 << 20
BEYOND = f"beyond any real job (at most {MAX_RANKS:,} ranks)"


@dataclass(frozen=True)
class LauncherInfo:
    name: str
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    node_rank: int | None = None
    nnodes: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    agent_store: bool = False  # torchrun's agent hosts the store; ranks are clients
    # variable name -> what was read, for every variable this launcher defines
    variables: dict[str, str | None] = field(default_factory=dict)
    # variable name -> Invalid, for those present but unparseable
    invalid: dict[str, Invalid] = field(default_factory=dict)


# For each launcher: the variables that carry rank, local rank, world size, local world size.
RANK_VARIABLES: dict[str, tuple[str, str, str, str]] = {
    "torchrun": ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
    "mpirun": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
               "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "mpich": ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE", "MPI_LOCALNRANKS"),
    "slurm": ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE"),
    "env": ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
}


def launcher_name(env: Mapping[str, str]) -> str:
    """The launcher that started this process (see the module docstring for the order)."""
    if env.get("TORCHELASTIC_RUN_ID"):
        return "torchrun"
    if "OMPI_COMM_WORLD_RANK" in env or "OMPI_COMM_WORLD_SIZE" in env:
        return "mpirun"
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        return "mpich"
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        return "slurm"
    if "RANK" in env or "WORLD_SIZE" in env:
        return "env"
    return "none"


PET_LAYOUT = ("PET_NNODES", "PET_NPROC_PER_NODE")  # torchrun's layout, as Kubeflow's operators set it


def torchrun_pod(env: Mapping[str, str]) -> bool:
    """Whether this process stands where a torchrun command is meant to start, not as one of its
    ranks: a pod that Kubeflow's PyTorchJob or TrainJob configured through torchrun's PET_*
    variables (PET_NNODES, PET_NPROC_PER_NODE), with no torchrun, MPI or SLURM task above it, and
    either no RANK / WORLD_SIZE (a TrainJob sets none) or a WORLD_SIZE that counts processes,
    PET_NNODES x PET_NPROC_PER_NODE with more than one per node (a PyTorchJob: its RANK is then the
    pod's). A PyTorchJob pod whose WORLD_SIZE counts pods (nprocPerNode "auto") runs `python
    train.py` as one rank of the job: RANK and WORLD_SIZE are its launcher's ("env")."""
    if not any(k in env for k in PET_LAYOUT):
        return False
    name = launcher_name(env)
    if name != "env":
        return name == "none"
    nproc, nnodes = as_int(env_int(env, "PET_NPROC_PER_NODE")), as_int(env_int(env, "PET_NNODES"))
    world = as_int(env_int(env, "WORLD_SIZE"))
    return (nproc is not None and nproc > 1
            and (world is None or world == (nnodes if nnodes is not None else 1) * nproc))


def _slurm_tasks_per_node(raw: str | None, node_id: int | None = None) -> str | None:
    # SLURM_NTASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE look like "8" or "8(x2)" or "8(x2),4":
    # per-node counts in node order; this node's count is the entry at SLURM_NODEID.
    if not raw:
        return raw
    # walked without expanding: "8(x100000000000)" builds nothing per node
    first: str | None = None
    seen = 0  # nodes counted so far
    for part in raw.split(","):
        m = re.fullmatch(r"\s*(\d{1,9})\s*(?:\(x(\d{1,9})\))?\s*", part)
        if not m:  # not the compressed form: hand the first entry on, env_int reports it
            return raw.split(",")[0].split("(")[0]
        first = m.group(1) if first is None else first
        times = int(m.group(2) or 1)
        if node_id is not None and seen <= node_id < seen + times:
            return m.group(1)
        seen += times
    return first


def detect(env: Mapping[str, str], *, rank: int | None = None, world_size: int | None = None,
           local_rank: int | None = None) -> LauncherInfo:
    """Read the launcher's view of the world. Never raises: bad values land in `invalid`."""
    name = "spawn" if rank is not None or world_size is not None else launcher_name(env)
    if name == "none":
        return LauncherInfo(name="none", master_addr=env.get("MASTER_ADDR") or None,
                            master_port=as_int(env_int(env, "MASTER_PORT")),
                            invalid=_invalid(env, ("MASTER_PORT",)))
    if name == "spawn":
        names = RANK_VARIABLES["env"]
        values: dict[str, int | None | Invalid] = {
            names[0]: rank, names[1]: local_rank if local_rank is not None else rank,
            names[2]: world_size, names[3]: env_int(env, "LOCAL_WORLD_SIZE") or world_size,
        }
        variables = {n: None if v is None else str(v) for n, v in values.items()}
    else:
        names = RANK_VARIABLES[name]
        view = dict(env)
        if name == "slurm":
            view["SLURM_NTASKS_PER_NODE"] = _slurm_tasks_per_node(
                env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE"),
                as_int(env_int(env, "SLURM_NODEID"))) or ""
        values = {n: env_int(view, n) for n in names}
        variables = {n: env.get(n) for n in names}
    for n, v in values.items():  # the launcher's word, but no job has this many ranks
        if isinstance(v, int) and abs(v) > MAX_RANKS:
            values[n] = Invalid(str(variables.get(n) if variables.get(n) is not None else v), BEYOND)
    r, lr, ws, lws = (as_int(values[n]) for n in names)
    invalid = {n: v for n, v in values.items() if isinstance(v, Invalid)}

    node_rank = nnodes = None
    extra: tuple[str, ...] = ()
    if name == "torchrun":
        extra = ("GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE")
    elif name == "slurm":
        extra = ("SLURM_NODEID", "SLURM_NNODES")
    for n in extra:
        variables[n] = env.get(n)
        v = _bounded_int(env, n)
        if isinstance(v, Invalid):
            invalid[n] = v
    if name == "torchrun":
        node_rank, nnodes = as_int(_bounded_int(env, "GROUP_RANK")), as_int(_bounded_int(env, "GROUP_WORLD_SIZE"))
    elif name == "slurm":
        node_rank, nnodes = as_int(_bounded_int(env, "SLURM_NODEID")), as_int(_bounded_int(env, "SLURM_NNODES"))
    elif lws and ws is not None and r is not None and ws % lws == 0:
        # mpirun / mpich / generic env: homogeneous layout assumed (ranks packed by node)
        node_rank, nnodes = r // lws, ws // lws

    port = env_int(env, "MASTER_PORT")
    if isinstance(port, Invalid):
        invalid["MASTER_PORT"] = port
    return LauncherInfo(
        name=name, rank=r, local_rank=lr, world_size=ws, local_world_size=lws,
        node_rank=node_rank, nnodes=nnodes, master_addr=env.get("MASTER_ADDR") or None,
        master_port=as_int(port), agent_store=env_bool(env, "TORCHELASTIC_USE_AGENT_STORE"),
        variables=variables, invalid=invalid,
    )


def multi_node(world_size: int | None, local_world_size: int | None, *, nnodes: int | None = None,
               hosts: int | None = None, unknown: bool = False) -> bool:
    """Whether the job spans more than one node: the one rule for every part that asks.

    Several nodes: more than one host the job runs on (`hosts`: SageMaker's distribution hosts,
    when this host is one of them), a launcher's node count above 1, or a world larger than this
    node's ranks (0 < local_world_size < world_size). One node: one host, a node count of 1, one
    rank, or a world of exactly this node's ranks. Evidence of several nodes wins over evidence of
    one (a layout that says both is not one node's). `unknown` is the answer when nothing says
    either: False where a multi-node step must be sure (a check that fires only across nodes, an
    exchange through the job's store), True where a one-node shortcut must be sure."""
    if (hosts or 0) > 1 or (nnodes or 0) > 1:
        return True
    if world_size is not None and local_world_size is not None and 0 < local_world_size < world_size:
        return True
    if hosts == 1 or nnodes == 1 or world_size == 1 or (world_size is not None and world_size == local_world_size):
        return False
    return unknown


def world_sizes(env: Mapping[str, str]) -> tuple[int | None, int | None]:
    """WORLD_SIZE and LOCAL_WORLD_SIZE as torch's `env://` reads them (torchrun sets both; ddp-doctor
    exports them for mpirun, MPICH and srun), None where unset or not a whole number."""
    return as_int(env_int(env, "WORLD_SIZE")), as_int(env_int(env, "LOCAL_WORLD_SIZE"))


def _bounded_int(env: Mapping[str, str], name: str) -> int | None | Invalid:
    """env_int, and Invalid past MAX_RANKS either way (a node count or node rank is no larger)."""
    v = env_int(env, name)
    if isinstance(v, int) and abs(v) > MAX_RANKS:
        return Invalid(env.get(name) or str(v), BEYOND)
    return v


def is_ip_address(text: str) -> bool:
    """Whether a MASTER_ADDR-like text is an IPv4 or IPv6 address (not a host name)."""
    import ipaddress
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def is_loopback_address(text: str) -> bool:
    """localhost, or a loopback IP address (127.0.0.0/8, ::1): only this host reaches it."""
    import ipaddress
    return text == "localhost" or (is_ip_address(text) and ipaddress.ip_address(text).is_loopback)


_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def address_problem(addr: str) -> str | None:
    """Why MASTER_ADDR cannot be a rendezvous address, or None when it can: a host name (labels of
    letters, digits, hyphens and underscores, joined by dots; at most 253 characters), an IPv4
    address, or an IPv6 address, plain or in brackets. Read from the text alone: nothing resolves."""
    import ipaddress
    text = addr.strip()
    if not text:
        return "empty"
    inner = text[1:-1] if text.startswith("[") and text.endswith("]") else None
    try:
        ipaddress.ip_address(inner if inner is not None else text)
        return None
    except ValueError:
        if inner is not None:
            return "not an IPv6 address inside its brackets"
    if ":" in text:
        return "not a host name or an IP address (a port goes in MASTER_PORT, an IPv6 address is written whole)"
    name = text[:-1] if text.endswith(".") else text
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        return ("not a host name or an IP address (a host name is letters, digits, hyphens, underscores and "
                "dots, at most 253 characters)")
    return None


def _invalid(env: Mapping[str, str], names: tuple[str, ...]) -> dict[str, Invalid]:
    out = {}
    for n in names:
        v = env_int(env, n)
        if isinstance(v, Invalid):
            out[n] = v
    return out
