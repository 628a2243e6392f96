"""The one table of instance types: GPUs, GPU model, NVLink, EFA, SMDDP support, expected busbw.

Every fact ddp-doctor knows about an EC2 / SageMaker instance type lives here; the host checks
(checks/gpu.py, checks/sagemaker_launch.py), the job checks (sagemaker/) and the bandwidth
expectations (comm/) read it through :func:`lookup` or the tuples derived below.

A field is ``None`` where the project has no sourced fact: the checks then stay silent rather
than guess (e.g. NVLink is known only for the DOMAIN.md section 1 types).

Sources: GPUs per instance from the EC2 user guide / DOMAIN.md instance table (trn types count
NeuronCores: what torchrun starts one rank per); SMDDP support from the SageMaker developer guide;
EFA lists from sagemaker-training-toolkit; busbw figures as noted on each row.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# The expected busbw figures: healthy all_reduce busbw (GB/s) at large sizes with NCCL, as
# (intra-node, inter-node). Derived from the instance's links (DOMAIN.md section 1) and published
# nccl-tests figures for the same GPUs and fabrics; every row is unverified on AWS hardware by this
# project (no GPU machine was at hand) - they are deliberately conservative, and the warning fires
# only below --comm-min-fraction (default 0.5) of them.


@dataclass(frozen=True)
class InstanceType:
    """What ddp-doctor knows about one instance type (``name`` without SageMaker's "ml.")."""

    name: str
    gpus: int                      # GPUs (trn: NeuronCores) - the ranks torchrun starts per instance
    gpu_model: str | None = None   # known for the DOMAIN.md section 1 types only
    nvlink: bool | None = None     # GPUs joined by NVLink / NVSwitch (None: not recorded)
    efa: bool = False              # the toolkit sets FI_PROVIDER=efa on it
    efa_rdma: bool = False         # ... and FI_EFA_USE_DEVICE_RDMA=1
    smddp: str | None = None       # "supported" | "older" (older SMDDP versions only) | None
    expected_busbw_gbps: tuple[float, float] | None = None  # (intra-node, inter-node), see above
    busbw_note: str = ""           # where the busbw figures come from, and that they are unverified

    @property
    def ml_name(self) -> str:
        """The SageMaker spelling, e.g. "ml.p4d.24xlarge"."""
        return f"ml.{self.name}"

    def expected_busbw(self, scope: str) -> float | None:
        """The busbw a healthy instance reaches for scope "intra-node" or "inter-node", or None."""
        if self.expected_busbw_gbps is None:
            return None
        return self.expected_busbw_gbps[0] if scope == "intra-node" else self.expected_busbw_gbps[1]


_T = InstanceType
# Order matters: the SMDDP lists below keep it in their messages.
TYPES: tuple[InstanceType, ...] = (
    _T("p3.2xlarge", 1), _T("p3.8xlarge", 4),
    _T("p3.16xlarge", 8, "V100", nvlink=True, smddp="older", expected_busbw_gbps=(120.0, 2.5),
       busbw_note="unverified: V100 NVLink hybrid cube mesh; 25 Gbps TCP"),
    _T("p3dn.24xlarge", 8, "V100", nvlink=True, efa=True, smddp="older", expected_busbw_gbps=(120.0, 10.0),
       busbw_note="unverified: V100 NVLink; 100 Gbps, 1 EFA device"),
    _T("p4d.24xlarge", 8, "A100", nvlink=True, efa=True, efa_rdma=True, smddp="supported",
       expected_busbw_gbps=(220.0, 40.0), busbw_note="unverified: A100 NVSwitch; 400 Gbps EFA, GPUDirect RDMA"),
    _T("p4de.24xlarge", 8, "A100", nvlink=True, efa=True, efa_rdma=True, smddp="supported",
       expected_busbw_gbps=(220.0, 40.0), busbw_note="unverified: as p4d (NVSwitch per DOMAIN.md is unverified)"),
    _T("p5.48xlarge", 8, "H100", nvlink=True, efa=True, expected_busbw_gbps=(450.0, 300.0),
       busbw_note="unverified: H100 NVSwitch; 3200 Gbps EFA (both unverified)"),
    _T("p5e.48xlarge", 8), _T("p5en.48xlarge", 8),
    _T("g4dn.xlarge", 1), _T("g4dn.2xlarge", 1), _T("g4dn.4xlarge", 1), _T("g4dn.8xlarge", 1, efa=True),
    _T("g4dn.16xlarge", 1), _T("g4dn.12xlarge", 4, efa=True),
    _T("g5.xlarge", 1), _T("g5.2xlarge", 1), _T("g5.4xlarge", 1), _T("g5.8xlarge", 1), _T("g5.16xlarge", 1),
    _T("g5.12xlarge", 4), _T("g5.24xlarge", 4),
    _T("g5.48xlarge", 8, "A10G", nvlink=False, efa=True, expected_busbw_gbps=(10.0, 10.0),
       busbw_note="unverified: A10G over PCIe (no NVLink); 100 Gbps"),
    _T("trn1.2xlarge", 2), _T("trn1.32xlarge", 32, efa=True, efa_rdma=True), _T("trn1n.32xlarge", 32),
)
del _T

BY_NAME: dict[str, InstanceType] = {t.name: t for t in TYPES}

# Derived lists, in table order (messages quote them).
SMDDP_INSTANCES = tuple(t.ml_name for t in TYPES if t.smddp == "supported")
SMDDP_OLDER_INSTANCES = tuple(t.ml_name for t in TYPES if t.smddp == "older")
EFA_INSTANCES = tuple(t.ml_name for t in TYPES if t.efa)
EFA_RDMA_INSTANCES = tuple(t.ml_name for t in TYPES if t.efa_rdma)


def lookup(name: str | None) -> InstanceType | None:
    """The type named "ml.p4d.24xlarge" or "p4d.24xlarge" (any case, spaces around), or None."""
    if not isinstance(name, str):
        return None
    key = name.strip().lower()
    return BY_NAME.get(key[3:] if key.startswith("ml.") else key)


def lookup_sagemaker(name: str | None) -> InstanceType | None:
    """The type for SageMaker's exact spelling only ("ml.p4d.24xlarge"): what the job API and the
    training container use; anything else is not a SageMaker instance type."""
    if not isinstance(name, str) or not name.startswith("ml."):
        return None
    return BY_NAME.get(name[3:])


def is_gpu_type(instance_type: str) -> bool:
    """A SageMaker GPU type (ml.p*, ml.g*)."""
    return bool(re.match(r"^ml\.(p|g)\d", instance_type or ""))


def is_trn_type(instance_type: str) -> bool:
    """A SageMaker Trainium type (ml.trn*)."""
    return bool(re.match(r"^ml\.trn\d", instance_type or ""))
