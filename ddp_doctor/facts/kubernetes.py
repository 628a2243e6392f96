"""What a Kubernetes pod says of its place in a training job: the variables Kubeflow's operators
set, read as pure functions over an environment mapping (nothing here raises).

- The training operator's PyTorchJob (kubeflow.org/v1) names each pod `<job>-master-0` or
  `<job>-worker-<i>` (also its HOSTNAME and its headless service); it sets MASTER_ADDR /
  PET_MASTER_ADDR to `<job>-master-0`, MASTER_PORT / PET_MASTER_PORT, RANK and PET_NODE_RANK to the
  pod's rank (the master 0, worker i: i + 1), PET_NNODES to the pods, PET_NPROC_PER_NODE to
  nprocPerNode ("auto" by default), and WORLD_SIZE to pods x nprocPerNode when that is a number
  (else the pods). With an elasticPolicy: PET_RDZV_ENDPOINT, PET_RDZV_BACKEND (c10d), PET_NNODES
  as MIN:MAX, and no master.
- Kubeflow Trainer's TrainJob (trainer.kubeflow.org) runs an indexed Job of a JobSet: HOSTNAME is
  `<trainjob>-node-0-<index>`, JOB_COMPLETION_INDEX the pod's index, PET_NODE_RANK the same,
  PET_NNODES, PET_NPROC_PER_NODE, PET_MASTER_ADDR `<trainjob>-node-0-0.<trainjob>`, PET_MASTER_PORT
  29500; no RANK, WORLD_SIZE or MASTER_ADDR (torchrun sets them for its ranks).
- Every pod has KUBERNETES_SERVICE_HOST.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from ddp_doctor.facts.env_values import as_int, env_int

PYTORCHJOB_HOST = re.compile(r"^(?P<job>.+)-(?P<role>master|worker)-(?P<index>\d{1,6})$")
TRAINJOB_HOST = re.compile(r"^(?P<job>.+)-node-0-(?P<index>\d{1,6})$")


@dataclass(frozen=True)
class Pod:
    operator: str               # "pytorchjob", "trainjob", or "" (a pod no operator is recognised in)
    hostname: str
    job: str | None             # the job's name, from the pod's host name
    index: int | None           # the pod's place in the job: its node rank when the rendezvous is static
    index_source: str           # where `index` came from, for messages
    nnodes: int | None          # PET_NNODES as a number (None for MIN:MAX or unset)
    nproc_per_node: str | None  # PET_NPROC_PER_NODE as set ("auto", "8")
    node_rank: int | None       # PET_NODE_RANK
    elastic: bool               # a c10d / etcd rendezvous: node ranks are the rendezvous's to give
    master_addr: str | None     # the address the operator set (PET_MASTER_ADDR, else MASTER_ADDR)

    @property
    def expected_master(self) -> str | None:
        """The master pod's service as the operator names it (None when no master is known)."""
        if self.job is None or self.elastic:
            return None
        return f"{self.job}-master-0" if self.operator == "pytorchjob" else f"{self.job}-node-0-0.{self.job}"


def in_kubernetes(env: Mapping[str, str]) -> bool:
    return bool(env.get("KUBERNETES_SERVICE_HOST"))


def read(env: Mapping[str, str], hostname: str | None = None) -> Pod | None:
    """This pod's view, or None outside Kubernetes. `hostname`: the pod's, else HOSTNAME."""
    if not in_kubernetes(env):
        return None
    host = hostname or env.get("HOSTNAME") or ""
    pet = any(k.startswith("PET_") for k in env)
    elastic = bool(env.get("PET_RDZV_ENDPOINT") or env.get("PET_RDZV_BACKEND")
                   or ":" in (env.get("PET_NNODES") or ""))
    m_train, m_job = TRAINJOB_HOST.match(host), PYTORCHJOB_HOST.match(host)
    index = as_int(env_int(env, "JOB_COMPLETION_INDEX"))
    if pet and (index is not None or m_train):
        operator, job = "trainjob", (m_train.group("job") if m_train else None)
        source = "JOB_COMPLETION_INDEX"
        if index is None and m_train:
            index, source = int(m_train.group("index")), f"the host name {host}"
    elif m_job and (pet or env.get("MASTER_ADDR")):
        operator, job = "pytorchjob", m_job.group("job")
        worker = int(m_job.group("index"))
        # with a master the workers' node ranks start at 1; an elastic job has no master
        index = None if elastic else (0 if m_job.group("role") == "master" else worker + 1)
        source = f"the pod name {host}"
    else:
        operator, job, index, source = "", None, None, ""
    return Pod(operator=operator, hostname=host, job=job, index=index, index_source=source,
               nnodes=as_int(env_int(env, "PET_NNODES")), nproc_per_node=env.get("PET_NPROC_PER_NODE"),
               node_rank=as_int(env_int(env, "PET_NODE_RANK")), elastic=elastic,
               master_addr=env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR"))
