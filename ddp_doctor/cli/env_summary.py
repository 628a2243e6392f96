"""The summary `ddp-doctor env` prints: this machine and job, to paste into a bug report.

`collect_env` returns plain data (secrets redacted); `render_env` turns it into a block ready to
paste, like `accelerate env`. Nothing here raises: a part that cannot be read says why instead.
torch is imported only inside `collect_env`; the subcommand (cli/env.py) imports this module only
when it runs, so building the parser stays cheap.
"""
from __future__ import annotations

import os
import platform
import socket
from importlib import metadata
from typing import Any, Callable, Mapping

from ddp_doctor.facts import host as host_facts
from ddp_doctor.facts import launchers
from ddp_doctor.facts import sagemaker_env as sagemaker
from ddp_doctor.report.redact import redact_env, redact_obj
from ddp_doctor.version import __version__

PACKAGES = ("torch", "transformers", "accelerate", "lightning", "pytorch-lightning", "numpy", "psutil", "nvidia-ml-py")
# Variables that decide how a distributed job is laid out and talks; secrets among them (AWS_*,
# HF_*, WANDB_*) are redacted, and their presence alone is often the clue.
ENV_PREFIXES = (
    "TORCHELASTIC_", "MASTER_", "NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "FI_", "GLOO_", "SM_",
    "SMDATAPARALLEL_", "OMPI_COMM_WORLD_", "PMI_", "SLURM_", "AWS_", "HF_", "WANDB_", "SAGEMAKER_",
    "DDP_DOCTOR_", "ROLE_", "MPI_LOCAL",
)
ENV_NAMES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "NODE_RANK", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CURRENT_HOST", "OMP_NUM_THREADS",
    "PYTORCH_CUDA_ALLOC_CONF", "TRANSFORMERS_CACHE", "ACCELERATE_USE_SAGEMAKER",
)
VALUE_LIMIT = 400  # SM_TRAINING_ENV and friends are long JSON; the summary keeps their start


def _guard(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a fact that cannot be read is shown as such, never a crash
        return f"unavailable ({type(e).__name__}: {e})"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _torch_info() -> dict[str, Any]:
    if _version("torch") == "not installed":
        return {}
    import torch  # lazily: only `ddp-doctor env` pays for it

    out: dict[str, Any] = {"cuda_available": bool(torch.cuda.is_available()),
                           "torch_cuda_build": torch.version.cuda or "none (CPU build)"}
    if out["cuda_available"]:
        out["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        out["nccl"] = _guard(lambda: ".".join(str(x) for x in torch.cuda.nccl.version()))
    return out


def _memory() -> str:
    import psutil

    vm = psutil.virtual_memory()
    return f"{vm.total / 2**30:.1f} GiB total, {vm.available / 2**30:.1f} GiB available"


def _world(env: Mapping[str, str]) -> dict[str, Any]:
    info = launchers.detect(env)
    out: dict[str, Any] = {k: getattr(info, k) for k in (
        "rank", "local_rank", "world_size", "local_world_size", "node_rank", "nnodes",
        "master_addr", "master_port")}
    if info.invalid:
        out["invalid"] = {k: repr(v) for k, v in info.invalid.items()}
    return out


def _sagemaker(env: Mapping[str, str]) -> dict[str, Any] | None:
    sm = sagemaker.read(env)
    if sm is None:
        return None
    out: dict[str, Any] = {
        "hosts": sm.hosts if sm.hosts is not None else env.get("SM_HOSTS"),
        "current_host": sm.this_host, "instance_type": sm.instance_type,
        "distribution": sm.distribution, "master": sm.master_hostname,
        "processes_per_host": sm.processes_per_host, "num_gpus": sm.num_gpus,
        "network_interface": sm.network_interface,
    }
    if sm.errors:
        out["errors"] = dict(sm.errors)
    return out


def _gpus(env: Mapping[str, str], torch_info: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"nvml_count": host_facts.nvml_gpu_count(),
                           "CUDA_VISIBLE_DEVICES": env.get("CUDA_VISIBLE_DEVICES", "unset")}
    if isinstance(torch_info, dict) and torch_info.get("cuda_devices") is not None:
        out["torch_devices"] = torch_info["cuda_devices"]
    return out


def relevant_env(env: Mapping[str, str]) -> dict[str, str]:
    """The distributed-training variables, sorted, secrets redacted, long values shortened."""
    picked = {k: str(v) for k, v in env.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}
    safe = redact_env(picked, env)  # literal secret values come from the environment described
    return {k: (v if len(v) <= VALUE_LIMIT else v[:VALUE_LIMIT] + f"… ({len(v)} chars)")
            for k, v in sorted((k, str(v)) for k, v in safe.items())}


def _os_name() -> str:
    """The distribution as /etc/os-release names it ("Ubuntu 22.04.4 LTS"), else the system's name."""
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME") or platform.system()
    except OSError:  # no os-release (macOS, a minimal container)
        return f"{platform.system()} {platform.release()}"


def collect_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    env = dict(os.environ if environ is None else environ)
    torch_info = _guard(_torch_info)
    data: dict[str, Any] = {
        "ddp_doctor": __version__,
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "platform": platform.platform(),
        "os": _guard(_os_name),
        **{name.replace("-", "_"): _version(name) for name in PACKAGES},
    }
    if isinstance(torch_info, dict):
        data["cuda_available"] = torch_info.get("cuda_available", False)
        data["torch_cuda_build"] = torch_info.get("torch_cuda_build", "n/a")
        if "nccl" in torch_info:  # only meaningful where CUDA works
            data["nccl"] = torch_info["nccl"]
    else:
        data["cuda_available"] = torch_info
    data.update({
        "cpu_count": os.cpu_count(),
        "memory": _guard(_memory),
        "hostname": _guard(socket.gethostname),
        "launcher": _guard(lambda: launchers.launcher_name(env)),
        "world": _guard(lambda: _world(env)),
        "sagemaker": _guard(lambda: _sagemaker(env)),
        "gpus": _guard(lambda: _gpus(env, torch_info)),
        "env": _guard(lambda: relevant_env(env)),
    })
    return redact_obj(data, env)  # a secret can also hide in a host name or an error message


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_inline(v)}" for k, v in value.items()) or "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    return "n/a" if value is None else str(value)


def render_env(data: dict[str, Any]) -> str:
    """Markdown for an issue: `- key: value` lines, then the environment in a fenced block."""
    lines = ["Copy-and-paste the text below in your GitHub issue.", ""]
    for key, value in data.items():
        if key != "env":
            lines.append(f"- {key}: {_inline(value)}")
    env = data.get("env")
    lines += ["- environment:", "```"]
    if isinstance(env, dict):
        lines += [f"{k}={v}" for k, v in env.items()] or ["(no distributed-training variables set)"]
    else:
        lines.append(str(env))
    lines.append("```")
    return "\n".join(lines)
