"""Build RankContext objects for tests without touching the process environment or /opt/ml.

Shared by every test module; keep it small and its signatures stable:
- :func:`make_ctx`: a RankContext from an env dict and a made-up host;
- :func:`write_sm_config`: a SageMaker config dir (input/config/resourceconfig.json, ...);
- :func:`sm_env`, :func:`torchrun_env`, :func:`mpirun_env`: the variables those launchers set.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

from ddp_doctor.context import RankContext, build_context
from ddp_doctor.facts.host import HostFacts

# Used when a test names no SageMaker root, so a test never reads the real /opt/ml.
NO_SM_ROOT = "/nonexistent/ddp-doctor-tests/opt-ml"


def host_facts(*, gpus: int = 0, physical_gpus: int | None = None,
               interfaces: Sequence[str] = ("lo", "eth0"), backends: Sequence[str] | None = None,
               hostname: str = "test-host") -> HostFacts:
    """A made-up host. `physical_gpus` defaults to `gpus` (None, i.e. no NVML, when gpus=0);
    `backends` defaults to gloo, plus nccl when there are GPUs."""
    if physical_gpus is None and gpus:
        physical_gpus = gpus
    if backends is None:
        backends = ("gloo", "nccl") if gpus else ("gloo",)
    return HostFacts(hostname=hostname, interfaces=tuple(interfaces), visible_gpus=gpus,
                     physical_gpus=physical_gpus, backends=tuple(backends))


def make_ctx(env: Mapping[str, str] | None = None, *, gpus: int = 0, physical_gpus: int | None = None,
             interfaces: Sequence[str] = ("lo", "eth0"), backends: Sequence[str] | None = None,
             sm_root: str | os.PathLike[str] | None = None, backend: str | None = None,
             hostname: str = "test-host", **kwargs: Any) -> RankContext:
    """A RankContext as `build_context` makes it from `env` on a made-up host (see host_facts).
    Extra keyword arguments (rank=, world_size=, local_rank=, entry_script=) go to build_context."""
    env = dict(env or {})
    root = str(sm_root) if sm_root is not None else (env.get("DDP_DOCTOR_SM_ROOT") or NO_SM_ROOT)
    facts = host_facts(gpus=gpus, physical_gpus=physical_gpus, interfaces=interfaces,
                       backends=backends, hostname=hostname)
    return build_context(env, facts, backend=backend, sm_root=root, **kwargs)


def write_sm_config(root: str | os.PathLike[str], *, hosts: Sequence[str] = ("algo-1",),
                    current_host: str = "algo-1", instance_type: str = "ml.p4d.24xlarge",
                    instance_groups: list[dict[str, Any]] | None = None,
                    hyperparameters: Mapping[str, Any] | None = None,
                    resourceconfig: Any = None) -> str:
    """Write <root>/input/config/{resourceconfig,hyperparameters}.json and return root.

    `instance_groups` defaults to one group holding `hosts` in the given order. `resourceconfig`,
    when given, replaces the whole file: a str is written as is (e.g. invalid JSON), anything
    else as JSON. `hyperparameters` values are JSON-encoded the way SageMaker writes them."""
    cfg = os.path.join(str(root), "input", "config")
    os.makedirs(cfg, exist_ok=True)
    if resourceconfig is None:
        groups = instance_groups if instance_groups is not None else [
            {"instance_group_name": "homogeneousCluster", "instance_type": instance_type,
             "hosts": list(hosts)}]
        resourceconfig = {
            "current_group_name": "homogeneousCluster", "current_host": current_host,
            "current_instance_type": instance_type, "hosts": list(hosts),
            "instance_groups": groups, "network_interface_name": "eth0",
        }
    with open(os.path.join(cfg, "resourceconfig.json"), "w", encoding="utf-8") as f:
        f.write(resourceconfig if isinstance(resourceconfig, str) else json.dumps(resourceconfig))
    if hyperparameters is not None:
        with open(os.path.join(cfg, "hyperparameters.json"), "w", encoding="utf-8") as f:
            json.dump({k: json.dumps(v) for k, v in hyperparameters.items()}, f)
    return str(root)


DISTRIBUTION_PARAMS = {
    "torch_distributed": "sagemaker_torch_distributed_enabled",
    "smdistributed": "sagemaker_distributed_dataparallel_enabled",
    "pytorchddp": "sagemaker_pytorch_ddp_enabled",
    "mpi": "sagemaker_mpi_enabled",
}


def sm_env(hosts: Sequence[str] = ("algo-1",), current_host: str = "algo-1", *, num_gpus: int = 8,
           instance_type: str = "ml.p4d.24xlarge", distribution: str | None = "torch_distributed",
           master: str | None = None, **framework_params: Any) -> dict[str, str]:
    """The SM_* variables the training toolkit sets (SM_HOSTS as a JSON list, ...).
    `master`, when given, goes into SM_TRAINING_ENV as master_hostname."""
    fp: dict[str, Any] = {"sagemaker_instance_type": instance_type}
    if distribution:
        fp[DISTRIBUTION_PARAMS[distribution]] = True
    fp.update(framework_params)
    training_env: dict[str, Any] = {"hosts": list(hosts), "current_host": current_host}
    if master is not None:
        training_env["master_hostname"] = master
    return {
        "SM_HOSTS": json.dumps(list(hosts)), "SM_CURRENT_HOST": current_host,
        "SM_NUM_GPUS": str(num_gpus), "SM_CURRENT_INSTANCE_TYPE": instance_type,
        "SM_NETWORK_INTERFACE_NAME": "eth0", "SM_IS_HETERO": "false",
        "SM_FRAMEWORK_PARAMS": json.dumps(fp), "SM_TRAINING_ENV": json.dumps(training_env),
    }


def torchrun_env(*, rank: int = 0, local_rank: int | None = None, world_size: int = 1,
                 local_world_size: int | None = None, group_rank: int | None = None,
                 nnodes: int | None = None, master_addr: str = "127.0.0.1",
                 master_port: int = 29500) -> dict[str, str]:
    """What torchrun sets for one worker; local values default to a homogeneous layout."""
    lws = local_world_size if local_world_size is not None else world_size
    lr = local_rank if local_rank is not None else rank % lws
    gr = group_rank if group_rank is not None else rank // lws
    nn = nnodes if nnodes is not None else max(world_size // lws, 1)
    return {
        "TORCHELASTIC_RUN_ID": "test-run", "RANK": str(rank), "LOCAL_RANK": str(lr),
        "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(lws), "GROUP_RANK": str(gr),
        "GROUP_WORLD_SIZE": str(nn), "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }


def mpirun_env(*, rank: int = 0, local_rank: int | None = None, world_size: int = 1,
               local_world_size: int | None = None) -> dict[str, str]:
    """What Open MPI's mpirun sets for one rank (no MASTER_ADDR: mpirun does not set it)."""
    lws = local_world_size if local_world_size is not None else world_size
    lr = local_rank if local_rank is not None else rank % lws
    return {
        "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_RANK": str(lr),
        "OMPI_COMM_WORLD_SIZE": str(world_size), "OMPI_COMM_WORLD_LOCAL_SIZE": str(lws),
    }
