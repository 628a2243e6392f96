"""Local checks that the launch matches the job a Kubeflow operator built (DDP220-DDP222): the
pods x processes per pod against the world size, this pod's index against its node rank, and the
master pod against MASTER_ADDR. The pod's view is facts/kubernetes.py (PyTorchJob and TrainJob);
every check does nothing outside a pod an operator made, or where an elastic rendezvous (c10d)
gives the node ranks and the master itself.
"""
from __future__ import annotations

from typing import Iterator

from ddp_doctor.context import RankContext
from ddp_doctor.facts.kubernetes import Pod
from ddp_doctor.facts.launchers import is_loopback_address
from ddp_doctor.findings import Problem
from ddp_doctor.registry import check

OPERATOR_NAMES = {"pytorchjob": "PyTorchJob", "trainjob": "TrainJob"}
LAYOUT_HINT = ("Let torchrun take the layout from the operator: start the container with `torchrun train.py` "
               "or `ddp-doctor run train.py` and no --nnodes, --nproc-per-node, --node-rank or --master-addr "
               "(both read PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK and PET_MASTER_ADDR, which the "
               "operator sets for each pod); set the layout in the job's spec (PyTorchJob: replicas and "
               "nprocPerNode; TrainJob: numNodes and numProcPerNode).")


def _pod(ctx: RankContext) -> Pod | None:
    pod = ctx.kubernetes
    return pod if pod is not None and pod.operator and not pod.elastic else None


def _whole(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


@check("DDP220", category="launcher_env", severity="error",
       title="World size does not match the job's pods x processes per pod")
def world_matches_pods(ctx: RankContext) -> Iterator[Problem]:
    """
    What: In a pod of a Kubeflow PyTorchJob or TrainJob, the world size differs from the pods the
    operator made (PET_NNODES) times the processes each runs (LOCAL_WORLD_SIZE under torchrun), or
    the pod runs one process while WORLD_SIZE counts several per pod (PET_NPROC_PER_NODE).
    Why: A command that sets its own layout (`torchrun --nnodes 1 ...` in a two-pod job) makes each
    pod a job of its own: every pod trains alone on all the data, and nothing fails. One process
    per pod where WORLD_SIZE counts N per pod waits at the rendezvous for ranks nobody starts.
    Fix: Let torchrun take the layout from the operator: start the container with `torchrun
    train.py` or `ddp-doctor run train.py` and no --nnodes / --nproc-per-node / --node-rank /
    --master-addr; set the layout in the job's spec (PyTorchJob: replicas, nprocPerNode; TrainJob:
    numNodes, numProcPerNode).
    """
    pod = _pod(ctx)
    if pod is None or pod.nnodes is None or ctx.world_size is None:
        return
    op, world = OPERATOR_NAMES[pod.operator], ctx.world_size
    ev = {"operator": pod.operator, "pods": pod.nnodes, "world_size": world, "pod": pod.hostname}
    if ctx.launcher.name == "torchrun" and ctx.local_world_size:
        per_pod = ctx.local_world_size
        if world != pod.nnodes * per_pod:
            alone = ": each pod forms a job of its own and trains alone" if world == per_pod else ""
            yield Problem(message=f"WORLD_SIZE={world} but the {op} runs {pod.nnodes} pod(s) (PET_NNODES) x "
                                  f"{per_pod} process(es) per pod (LOCAL_WORLD_SIZE) = {pod.nnodes * per_pod}"
                                  f"{alone}",
                          hint=LAYOUT_HINT, evidence={**ev, "per_pod": per_pod})
        return
    nproc = _whole(pod.nproc_per_node)
    if ctx.launcher.name == "env" and nproc and nproc > 1 and world == pod.nnodes * nproc:
        yield Problem(message=f"this pod runs one process (RANK={ctx.rank} is the pod's, no launcher in the pod) but "
                              f"WORLD_SIZE={world} counts {nproc} per pod (PET_NPROC_PER_NODE={nproc}) x "
                              f"{pod.nnodes} pod(s): the rendezvous waits for processes nobody starts",
                      hint=LAYOUT_HINT, evidence={**ev, "per_pod": 1, "nproc_per_node": nproc})


@check("DDP221", category="launcher_env", severity="error", title="Node rank is not this pod's index in the job")
def node_rank_is_pod_index(ctx: RankContext) -> Iterator[Problem]:
    """
    What: Under torchrun in a pod of a Kubeflow PyTorchJob or TrainJob with a static rendezvous,
    the node rank (GROUP_RANK) differs from the pod's index in the job (TrainJob:
    JOB_COMPLETION_INDEX; PyTorchJob: the master 0, worker-i i + 1).
    Why: A --node-rank written into the container's command is the same in every pod: two pods
    claim one node rank, the rendezvous waits for the missing one until its timeout, or ranks
    collide.
    Fix: Drop --node-rank from the command: torchrun and `ddp-doctor run` read PET_NODE_RANK, which
    the operator sets to each pod's index.
    """
    pod = _pod(ctx)
    node = ctx.launcher.node_rank
    if pod is None or pod.index is None or ctx.launcher.name != "torchrun" or node is None or node == pod.index:
        return
    yield Problem(message=f"torchrun made pod {pod.hostname} node {node} (GROUP_RANK) but it is node {pod.index} of "
                          f"the {OPERATOR_NAMES[pod.operator]} ({pod.index_source}): another pod claims node {node}",
                  hint=LAYOUT_HINT, evidence={"pod": pod.hostname, "group_rank": node, "pod_index": pod.index,
                                              "from": pod.index_source})


@check("DDP222", category="launcher_env", severity="error", title="MASTER_ADDR is not the job's master pod")
def master_is_master_pod(ctx: RankContext) -> Iterator[Problem]:
    """
    What: On a pod other than the master of a Kubeflow PyTorchJob or TrainJob, MASTER_ADDR is
    neither the master pod's service the operator names (PyTorchJob: `<job>-master-0`; TrainJob:
    `<trainjob>-node-0-0.<trainjob>`) nor a longer form of it (`<job>-master-0.<namespace>.svc...`).
    Why: A --master-addr written into the command (localhost, a pod's own name, another job's
    service) makes this pod's ranks wait for a master of their own, or join another job; the
    master pod's ranks wait for them until the rendezvous times out.
    Fix: Drop --master-addr from the command (torchrun and `ddp-doctor run` read PET_MASTER_ADDR);
    where a script sets MASTER_ADDR itself, take the operator's value.
    """
    pod = _pod(ctx)
    expected, addr = (pod.expected_master if pod is not None else None), ctx.master_addr
    if pod is None or expected is None or not addr or pod.index in (0, None):
        return
    short = expected.split(".")[0]
    if addr == expected or addr.startswith(expected + ".") or addr == short or addr.startswith(short + "."):
        return
    own = is_loopback_address(addr) or addr == pod.hostname
    why = ": this pod's ranks would wait for a master of their own" if own else ""
    yield Problem(message=f"MASTER_ADDR={addr} on pod {pod.hostname} (node {pod.index}) but the "
                          f"{OPERATOR_NAMES[pod.operator]}'s master is {expected}{why}",
                  hint=LAYOUT_HINT, evidence={"pod": pod.hostname, "master_addr": addr, "expected": expected})
