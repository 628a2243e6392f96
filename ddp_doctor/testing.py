"""Helpers for users' own tests of distributed code (also used by ddp-doctor's tests).

- :func:`simulated_sagemaker`: a SageMaker training container's SM_* variables and
  /opt/ml/input/config files under a temporary root, restored afterwards;
- :class:`LocalChecks` (the ``ddp_doctor`` pytest fixture): run ddp-doctor's local checks in this
  process and get the findings back.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

__all__ = ["Findings", "LocalChecks", "SimulatedSageMaker", "run_local_checks", "simulated_sagemaker"]

DISTRIBUTION_FLAGS = {
    "torch_distributed": "sagemaker_torch_distributed_enabled",
    "smdistributed": "sagemaker_distributed_dataparallel_enabled",
    "pytorchddp": "sagemaker_pytorch_ddp_enabled",
    "mpi": "sagemaker_mpi_enabled",
}
SM_ROOT_ENV = "DDP_DOCTOR_SM_ROOT"


@dataclass(frozen=True)
class SimulatedSageMaker:
    root: str                  # plays /opt/ml (DDP_DOCTOR_SM_ROOT points here)
    env: dict[str, str]        # the variables that were set


@contextlib.contextmanager
def simulated_sagemaker(hosts: Sequence[str] = ("algo-1",), current_host: str | None = None, *,
                        num_gpus: int = 0, distribution: str | None = "torch_distributed",
                        root: str | os.PathLike[str] | None = None,
                        instance_type: str = "ml.g5.12xlarge",
                        hyperparameters: Mapping[str, Any] | None = None,
                        extra_env: Mapping[str, str] | None = None) -> Iterator[SimulatedSageMaker]:
    """Inside the block, this process looks like a SageMaker training container on `current_host`
    (default: the first host): SM_HOSTS (a JSON list), SM_CURRENT_HOST, SM_NUM_GPUS,
    SM_FRAMEWORK_PARAMS (with the flag of `distribution`), SM_TRAINING_ENV, SM_OUTPUT_DATA_DIR, ... and
    <root>/input/config/resourceconfig.json (and hyperparameters.json). The environment is put
    back exactly as it was afterwards. `root` defaults to a temporary directory, removed after."""
    hosts = list(hosts)
    if not hosts:
        raise ValueError("simulated_sagemaker: hosts must name at least one host")
    current = current_host or hosts[0]
    if distribution is not None and distribution not in DISTRIBUTION_FLAGS:
        raise ValueError(f"simulated_sagemaker: distribution={distribution!r}; one of "
                         f"{', '.join(DISTRIBUTION_FLAGS)} or None")
    with contextlib.ExitStack() as stack:
        base = str(root) if root is not None else stack.enter_context(tempfile.TemporaryDirectory(prefix="sm-"))
        cfg = os.path.join(base, "input", "config")
        os.makedirs(cfg, exist_ok=True)
        rc = {"current_host": current, "current_instance_type": instance_type, "current_group_name":
              "homogeneousCluster", "hosts": hosts, "network_interface_name": "eth0",
              "instance_groups": [{"instance_group_name": "homogeneousCluster",
                                   "instance_type": instance_type, "hosts": hosts}]}
        with open(os.path.join(cfg, "resourceconfig.json"), "w", encoding="utf-8") as f:
            json.dump(rc, f)
        fp: dict[str, Any] = {"sagemaker_instance_type": instance_type}
        if distribution is not None:
            fp[DISTRIBUTION_FLAGS[distribution]] = True
        hp = {**fp, **dict(hyperparameters or {})}
        with open(os.path.join(cfg, "hyperparameters.json"), "w", encoding="utf-8") as f:
            json.dump({k: json.dumps(v) for k, v in hp.items()}, f)
        for d in ("model", os.path.join("output", "data")):
            os.makedirs(os.path.join(base, d), exist_ok=True)
        env = {
            "SM_HOSTS": json.dumps(hosts), "SM_CURRENT_HOST": current, "SM_NUM_GPUS": str(num_gpus),
            "SM_CURRENT_INSTANCE_TYPE": instance_type, "SM_NETWORK_INTERFACE_NAME": "eth0",
            "SM_IS_HETERO": "false", "SM_FRAMEWORK_PARAMS": json.dumps(fp),
            "SM_TRAINING_ENV": json.dumps({"hosts": hosts, "current_host": current,
                                           "num_gpus": num_gpus, "master_hostname": hosts[0]}),
            # the directories the toolkit names (uploaded with the job's output); the report defaults there
            "SM_MODEL_DIR": os.path.join(base, "model"), "SM_OUTPUT_DIR": os.path.join(base, "output"),
            "SM_OUTPUT_DATA_DIR": os.path.join(base, "output", "data"),
            SM_ROOT_ENV: base, **dict(extra_env or {}),
        }
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield SimulatedSageMaker(root=base, env=env)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def kubeflow_pod_env(operator: str = "pytorchjob", *, job: str = "train", index: int = 0, pods: int = 2,
                     nproc_per_node: str = "2", port: int | None = None) -> dict[str, str]:
    """The variables a Kubeflow operator gives pod `index` of a job of `pods` pods, for tests (set
    them in a process's environment, or give them to a check's context): "pytorchjob" (the
    training operator's PyTorchJob, kubeflow.org/v1, with a master: pod 0 is `<job>-master-0`, pod
    i `<job>-worker-<i-1>`; RANK is the pod's, WORLD_SIZE pods x nproc_per_node when that is a
    number) or "trainjob" (Kubeflow Trainer's TrainJob: `<job>-node-0-<i>`, JOB_COMPLETION_INDEX,
    no RANK or WORLD_SIZE). KUBERNETES_SERVICE_HOST and HOSTNAME as every pod has them."""
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
           "PET_NNODES": str(pods), "PET_NPROC_PER_NODE": nproc_per_node, "PET_NODE_RANK": str(index)}
    if operator == "pytorchjob":
        master, port = f"{job}-master-0", port or 23456
        per_pod = int(nproc_per_node) if nproc_per_node.isdigit() else 1
        env.update(HOSTNAME=master if index == 0 else f"{job}-worker-{index - 1}", PYTHONUNBUFFERED="1",
                   MASTER_ADDR=master, MASTER_PORT=str(port), PET_MASTER_ADDR=master, PET_MASTER_PORT=str(port),
                   RANK=str(index), WORLD_SIZE=str(pods * per_pod))
    elif operator == "trainjob":
        env.update(HOSTNAME=f"{job}-node-0-{index}", JOB_COMPLETION_INDEX=str(index),
                   PET_MASTER_ADDR=f"{job}-node-0-0.{job}", PET_MASTER_PORT=str(port or 29500))
    else:
        raise ValueError(f"kubeflow_pod_env: operator={operator!r}; pytorchjob or trainjob")
    return env


class Findings(list):  # type: ignore[type-arg]
    """A list of :class:`ddp_doctor.findings.Finding` with shorthands for assertions."""

    @property
    def ids(self) -> set[str]:
        return {f.id for f in self}

    @property
    def errors(self) -> list[Any]:
        return [f for f in self if f.severity == "error"]


def run_local_checks(*, select: Sequence[str] | None = None, skip: Sequence[str] | None = None,
                     options: Mapping[str, Any] | None = None, backend: str | None = None) -> Findings:
    """ddp-doctor's local checks (no process group needed) as this process sees itself now."""
    from ddp_doctor import check_runner, registry
    from ddp_doctor.context import current_context
    ctx = current_context(backend=backend, options=dict(options or {}))
    return Findings(check_runner.run_stage("local", (ctx,), ctx.rank, select=registry.parse_selectors(select),
                                     skip=registry.parse_selectors(skip)))


class LocalChecks:
    """What the ``ddp_doctor`` fixture returns: call it to run the local checks now. Picklable,
    so a ``@pytest.mark.distributed`` test can call it on every rank."""

    def __call__(self, *, select: Sequence[str] | None = None, skip: Sequence[str] | None = None,
                 options: Mapping[str, Any] | None = None, backend: str | None = None) -> Findings:
        return run_local_checks(select=select, skip=skip, options=options, backend=backend)
