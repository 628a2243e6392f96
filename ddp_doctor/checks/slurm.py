"""Local checks that the launch fits the SLURM job around it (DDP230-DDP231): torchrun started
by srun (one launcher per task: its node count must be srun's task count), and MASTER_ADDR among
the job's nodes. The job's view is facts/slurm.py; every check does nothing outside a SLURM job.
The rank layout of ranks srun starts itself (SLURM_PROCID, SLURM_NTASKS, ...) is checked with
every launcher's in checks/launcher_env.py.
"""
from __future__ import annotations

from typing import Iterator

from ddp_doctor.context import RankContext
from ddp_doctor.facts import slurm
from ddp_doctor.facts.launchers import is_ip_address, is_loopback_address
from ddp_doctor.findings import Problem
from ddp_doctor.registry import check


@check("DDP230", category="launcher_env", severity="error",
       title="srun's tasks do not match torchrun's nodes")
def torchrun_nodes_are_srun_tasks(ctx: RankContext) -> Iterator[Problem]:
    """
    What: torchrun was started by srun (a SLURM job step), and the nodes torchrun counts
    (GROUP_WORLD_SIZE, from --nnodes) differ from the tasks srun started (SLURM_STEP_NUM_TASKS):
    each srun task runs one torchrun, which is one node of the job.
    Why: `srun -N2 torchrun --nnodes 1 ...` makes two jobs of one node each, every one training
    alone on all the data, with no error; `srun --ntasks-per-node 8 torchrun --nproc-per-node 8`
    starts 8 launchers per node, 64 processes that fight over 8 GPUs; more nodes than tasks wait
    at the rendezvous for launchers nobody starts.
    Fix: Start one torchrun per node, `srun --ntasks-per-node=1 torchrun --nnodes $SLURM_NNODES
    --nproc-per-node <GPUs per node> --rdzv-backend c10d --rdzv-endpoint <first node>:29500 ...`
    (or `ddp-doctor run` in place of torchrun); or let srun start every rank itself (`srun
    --ntasks-per-node=<GPUs> ddp-doctor run train.py`).
    """
    job = slurm.read(ctx.env)
    if job is None or ctx.launcher.name != "torchrun" or "SLURM_STEP_ID" not in ctx.env:
        return
    tasks, nodes = job.step_tasks, ctx.launcher.nnodes
    if tasks is None or nodes is None or tasks == nodes:
        return
    per_node = ctx.local_world_size
    if nodes < tasks:
        what = (f": {tasks // nodes} copies of a {nodes}-node job, each training alone or colliding at its "
                f"rendezvous" if tasks % nodes == 0 else "")
    else:
        what = f": the rendezvous waits for {nodes - tasks} node(s) nobody starts"
    yield Problem(message=f"srun started {tasks} task(s) (SLURM_STEP_NUM_TASKS), each a torchrun, but torchrun "
                          f"counts {nodes} node(s) (GROUP_WORLD_SIZE) of {per_node} rank(s){what}",
                  evidence={"srun_tasks": tasks, "torchrun_nodes": nodes, "ranks_per_node": per_node,
                            "job_nodes": job.step_nodes})


@check("DDP231", category="launcher_env", severity="error", title="MASTER_ADDR is not a node of the SLURM job")
def master_is_a_job_node(ctx: RankContext) -> Iterator[Problem]:
    """
    What: In a SLURM job step on several nodes (srun), MASTER_ADDR is a loopback address or a host
    name that is not one of the job's nodes (SLURM_JOB_NODELIST, expanded). An IP address is not
    judged.
    Why: Rank 0 runs on one of the job's nodes; a MASTER_ADDR of localhost makes each node wait
    for a master of its own, and a name from another allocation (a hard-coded node, the login
    node, a previous job's first node) is where no rank 0 listens: every rank waits until the
    rendezvous times out.
    Fix: Take the job's first node: `export MASTER_ADDR=$(scontrol show hostnames
    "$SLURM_JOB_NODELIST" | head -n 1)` in the batch script, before srun.
    """
    job = slurm.read(ctx.env)
    addr = ctx.master_addr
    # a step of several nodes (a batch script's own commands run on the first node alone)
    if (job is None or job.nodes is None or "SLURM_STEP_ID" not in ctx.env or (job.step_nodes or 1) < 2
            or not addr):
        return
    loopback = is_loopback_address(addr)
    short = addr.split(".")[0]
    if not loopback and (is_ip_address(addr) or addr in job.nodes or short in job.nodes):
        return
    shown = ", ".join(job.nodes[:8]) + (f" and {len(job.nodes) - 8} more" if len(job.nodes) > 8 else "")
    why = ": each node's ranks would wait for a master of their own" if loopback else \
        ": no rank of this job listens there"
    yield Problem(message=f"MASTER_ADDR={addr} but SLURM job {job.job_id} runs on {shown} "
                          f"(SLURM_JOB_NODELIST={job.node_list}){why}",
                  evidence={"master_addr": addr, "job_nodes": list(job.nodes[:64]), "job_id": job.job_id})
