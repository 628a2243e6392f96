"""RankContext: everything a check may read about its rank, built once from the environment; and
Group, the process group a preflight creates, as the `group` stage's checks see it.

`build_context` is a pure function of an environment mapping, a SageMaker config root and the
host facts, so tests build any situation (SageMaker on 2 hosts with 8 GPUs each, a bad SM_HOSTS,
...) without touching the process environment.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Mapping

from ddp_doctor.facts import gpus, kubernetes, launchers, nvml
from ddp_doctor.facts import sagemaker_env as sagemaker
from ddp_doctor.facts.host import HostFacts
from ddp_doctor.facts.kubernetes import Pod
from ddp_doctor.facts.launchers import LauncherInfo
from ddp_doctor.facts.sagemaker_env import SageMakerEnv

BACKENDS = ("gloo", "nccl", "smddp", "mpi")


@dataclass(frozen=True)
class RankContext:
    launcher: LauncherInfo
    sagemaker: SageMakerEnv | None
    host: HostFacts
    backend: str                      # the backend the preflight (and the job) will use
    backend_source: str               # where that choice came from, for messages
    env: Mapping[str, str] = field(repr=False, default_factory=dict)
    entry_script: str | None = None   # the training script, when ddp-doctor runs one
    # Settings for checks from the command line (thresholds, sweep sizes, output dir, ...);
    # each check documents the keys it reads and its default.
    options: Mapping[str, Any] = field(default_factory=dict)
    # Facts read on first use and kept with the context (see gpu_snapshot).
    _read_once: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def gpu_snapshot(self) -> gpus.Snapshot:
        """This rank's NVML read (facts.gpus), made on first use and kept with the context, so every
        gpu check sees the same one; read again when the NVML provider changed (tests swap it)."""
        held = self._read_once.get("gpu_snapshot")
        if held is None or held[0] is not nvml.provider:
            snap = gpus.read_snapshot(self.host.visible_gpus, self.local_rank, self.local_world_size,
                                      self.env.get("CUDA_VISIBLE_DEVICES"))
            held = self._read_once["gpu_snapshot"] = (nvml.provider, snap)
        return held[1]

    @property
    def kubernetes(self) -> Pod | None:
        """The pod's view (facts/kubernetes.py): None outside Kubernetes."""
        if "kubernetes" not in self._read_once:
            self._read_once["kubernetes"] = kubernetes.read(self.env)
        return self._read_once["kubernetes"]  # type: ignore[no-any-return]

    # Shorthands for the fields checks read most.
    @property
    def rank(self) -> int | None:
        return self.launcher.rank

    @property
    def local_rank(self) -> int | None:
        return self.launcher.local_rank

    @property
    def world_size(self) -> int | None:
        return self.launcher.world_size

    @property
    def local_world_size(self) -> int | None:
        return self.launcher.local_world_size

    @property
    def node_rank(self) -> int | None:
        return self.launcher.node_rank

    @property
    def nnodes(self) -> int | None:
        return self.launcher.nnodes

    @property
    def master_addr(self) -> str | None:
        return self.launcher.master_addr

    @property
    def master_port(self) -> int | None:
        return self.launcher.master_port

    @property
    def device(self) -> str:
        if self.backend in ("nccl", "smddp") and self.host.visible_gpus:
            return f"cuda:{self.local_rank or 0}"
        return "cpu"


def choose_backend(env: Mapping[str, str], sm: SageMakerEnv | None, facts: HostFacts,
                   explicit: str | None = None) -> tuple[str, str]:
    """(backend, where the choice came from): explicit option, DDP_DOCTOR_BACKEND, the SageMaker
    distribution (smdistributed -> smddp), else NCCL with GPUs and gloo without."""
    if explicit:
        return explicit, "--backend"
    if env.get("DDP_DOCTOR_BACKEND"):
        return env["DDP_DOCTOR_BACKEND"], "DDP_DOCTOR_BACKEND"
    if sm is not None and sm.distribution in ("smdistributed", "pytorchddp"):
        return "smddp", f"SageMaker distribution {sm.distribution}"
    if facts.visible_gpus > 0:
        return "nccl", f"{facts.visible_gpus} visible GPU(s)"
    return "gloo", "no visible GPU"


def build_context(env: Mapping[str, str], facts: HostFacts, *, backend: str | None = None,
                  rank: int | None = None, world_size: int | None = None,
                  local_rank: int | None = None, sm_root: str | None = None,
                  entry_script: str | None = None,
                  options: Mapping[str, Any] | None = None) -> RankContext:
    env = dict(env)
    info = launchers.detect(env, rank=rank, world_size=world_size, local_rank=local_rank)
    sm = sagemaker.read(env, sm_root)
    chosen, source = choose_backend(env, sm, facts, backend)
    return RankContext(launcher=info, sagemaker=sm, host=facts, backend=chosen,
                       backend_source=source, env=env, entry_script=entry_script,
                       options=dict(options or {}))


def current_context(**kwargs: object) -> RankContext:
    """The context of this process, reading the real environment and host."""
    from ddp_doctor.facts.host import read_host_facts
    return build_context(os.environ, read_host_facts(), **kwargs)  # type: ignore[arg-type]


@dataclass
class Group:
    """The process group a preflight creates, as the `group` stage's checks see it."""
    rank: int
    world_size: int
    backend: str
    device: str                 # "cpu" or "cuda:N": where collective tensors live
    timeout: float              # seconds; every collective a check issues is bounded by it
    # Checks append their figures here (e.g. measurements["all_reduce"]); merged across ranks.
    measurements: dict[str, Any] = field(default_factory=dict)

    def wait(self, work: Any) -> None:
        """Wait for an async collective, bounded by the group timeout."""
        work.wait(timedelta(seconds=self.timeout))
