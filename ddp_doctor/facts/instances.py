"""The one table of instance types: GPUs, GPU model, NVLink, EFA, SMDDP support, expected busbw.

Every fact ddp-doctor knows about an EC2 / SageMaker instance type lives here; the host checks
(checks/gpu.py, checks/efa.py, checks/sagemaker_launch.py), the job checks and spec
(checks/sagemaker_job.py, sagemaker/spec.py) and the bandwidth expectations (comm/) read it
through :func:`lookup` or the tuples derived below. A hardware table, filed with the facts so
that none of them reaches up into the platform package for it.

A field is ``None`` where the project has no sourced fact: the checks then stay silent rather
than guess (e.g. NVLink is known only for the p3/p4d/p4de/p5 types of docs/facts.md).

Sources: GPUs per instance from the EC2 user guide (trn types count
NeuronCores: what torchrun starts one rank per); SMDDP support from the SageMaker developer guide;
EFA lists from sagemaker-training-toolkit; EFA device counts in _EFA_DEVICES, each with its
source ("estimate" where no public source confirms it); busbw figures as noted on each row.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

# The expected busbw figures: healthy all_reduce busbw (GB/s) of nccl-tests all_reduce_perf at large sizes
# (256 MiB and up) with NCCL, as (intra-node, inter-node). intra-node: one instance, all its GPUs.
# inter-node: the busbw of all_reduce_perf over all GPUs of 2 or more instances, which the network bounds:
# it is the node's figure, what its network cards carry together (docs/communication.md has the formula
# that turns it into each inter-node group's share). Each row's busbw_note names its public source
# ("source: ...") or says "estimate: ..." with its basis where no published run was found; a figure is
# set at or below the published one (busbw falls with more nodes and smaller sizes), and DDP403 warns only
# below --comm-min-fraction (default 0.5) of it.
_NCCL527 = "https://github.com/NVIDIA/nccl/issues/527"      # nccl-tests on 1-4 p4d.24xlarge, EFA
_P5_DATA = ("https://github.com/crazyguitar/aws-gpu-communication-benchmark (data/nccl_all_reduce.csv, "
            "k8s/nccl_all_reduce_perf.yaml)")                # nccl-tests on 2-32 ml.p5.48xlarge, 32 EFA
_NCCLT212 = "https://github.com/NVIDIA/nccl-tests/issues/212"  # NVIDIA on 8x H100 all_reduce busbw
_NCCL235 = "https://github.com/NVIDIA/nccl/issues/235"      # p3dn.24xlarge over EFA, 2-32 nodes


@dataclass(frozen=True)
class InstanceType:
    """What ddp-doctor knows about one instance type (``name`` without SageMaker's "ml.")."""

    name: str
    gpus: int                      # GPUs (trn: NeuronCores) - the ranks torchrun starts per instance
    gpu_model: str | None = None   # known for the p3/p4d/p4de/p5 types of docs/facts.md only
    nvlink: bool | None = None     # GPUs joined by NVLink / NVSwitch (None: not recorded)
    efa: bool = False              # the toolkit sets FI_PROVIDER=efa on it
    efa_rdma: bool = False         # ... and FI_EFA_USE_DEVICE_RDMA=1
    smddp: str | None = None       # "supported" | "older" (older SMDDP versions only) | None
    expected_busbw_gbps: tuple[float, float] | None = None  # (intra-node, inter-node), see above
    busbw_note: str = ""           # the busbw figures' public source ("source: ...") or "estimate: ..." basis
    efa_devices: int | None = None  # EFA devices a fully configured instance has (see _EFA_DEVICES)
    efa_source: str = ""           # where that count comes from; "estimate: ..." when not confirmed
    network_gbps: int | None = None  # the instance's network (EFA) bandwidth, Gbit/s (see _NETWORK_GBPS)

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
       busbw_note="estimate: intra-node as p3dn.24xlarge (same 8x V100 NVLink hybrid cube mesh); inter-node "
                  "80% of the 25 Gbps (3.1 GB/s) network over TCP sockets (no EFA); no published run found"),
    _T("p3dn.24xlarge", 8, "V100", nvlink=True, efa=True, smddp="older", expected_busbw_gbps=(120.0, 6.0),
       busbw_note=f"source (inter-node): {_NCCL235}: all_reduce over EFA on p3dn.24xlarge, 10 GB/s on 2 nodes, "
                  "6-8 GB/s on 8-32 nodes (100 Gbps, 1 EFA device); estimate (intra-node): V100 NVLink "
                  "(6 links of 25 GB/s per GPU), about half of what NCCL reaches on a p4d's NVSwitch"),
    _T("p4d.24xlarge", 8, "A100", nvlink=True, efa=True, efa_rdma=True, smddp="supported",
       expected_busbw_gbps=(220.0, 30.0),
       busbw_note=f"source: {_NCCL527}: all_reduce_perf at 1 GiB on p4d.24xlarge (EFA, GPUDirect RDMA): "
                  "230.8 GB/s on 1 node; 57.2 GB/s on 2 nodes (tree, above the line rate), 31.8 on 3, 29.6 on "
                  "4 (NCCL 2.9.9; that issue asked whether the 3-4 node figures are low, so they are a floor); "
                  "4 EFA devices of 100 Gbps = 50 GB/s line rate"),
    _T("p4de.24xlarge", 8, "A100", nvlink=True, efa=True, efa_rdma=True, smddp="supported",
       expected_busbw_gbps=(220.0, 30.0),
       busbw_note=f"estimate: the p4d.24xlarge figures ({_NCCL527}): same 8x A100 and 4x 100 Gbps EFA "
                  "network, 80 GB GPUs; no published run of its own found"),
    _T("p5.48xlarge", 8, "H100", nvlink=True, efa=True, expected_busbw_gbps=(370.0, 270.0),
       busbw_note=f"source (inter-node): {_P5_DATA}: all_reduce_perf on ml.p5.48xlarge, 32 EFA devices: "
                  "364 GB/s at 256 MiB and 435 at 1 GiB on 2 nodes, 273-280 on 4, 232-274 on 8, 148-269 on 16 "
                  f"(3200 Gbps = 400 GB/s line rate); source (intra-node): {_NCCLT212}: NCCL's effective "
                  "NVLink bandwidth on 8x H100 is ~370 GB/s (ring), ~480 GB/s busbw with NVLink SHARP at "
                  ">= 1 GiB"),
    _T("p5e.48xlarge", 8), _T("p5en.48xlarge", 8),
    _T("g4dn.xlarge", 1), _T("g4dn.2xlarge", 1), _T("g4dn.4xlarge", 1), _T("g4dn.8xlarge", 1, efa=True),
    _T("g4dn.16xlarge", 1), _T("g4dn.12xlarge", 4, efa=True),
    _T("g5.xlarge", 1), _T("g5.2xlarge", 1), _T("g5.4xlarge", 1), _T("g5.8xlarge", 1), _T("g5.16xlarge", 1),
    _T("g5.12xlarge", 4), _T("g5.24xlarge", 4),
    _T("g5.48xlarge", 8, "A10G", nvlink=False, efa=True, expected_busbw_gbps=(10.0, 10.0),
       busbw_note="estimate: intra-node A10G over PCIe (no NVLink), bounded by PCIe Gen4 x16 and the host; "
                  "inter-node 80% of the 100 Gbps (12.5 GB/s) EFA network; no published run found"),
    _T("trn1.2xlarge", 2), _T("trn1.32xlarge", 32, efa=True, efa_rdma=True), _T("trn1n.32xlarge", 32),
)
del _T

# EFA devices per instance type: what /sys/class/infiniband (driver "efa") and /dev/infiniband/uverbs*
# show on a node launched with one EFA interface per network card (EC2's EfaInfo.MaximumEfaInterfaces,
# `aws ec2 describe-instance-types --query 'InstanceTypes[].NetworkInfo.EfaInfo'`). name -> (count, source).
# A type not listed here has efa_devices None: the EFA device check (DDP330) stays silent on it.
_UG = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide"
_EFA_DEVICES: dict[str, tuple[int, str]] = {
    "p3dn.24xlarge": (1, "EC2 UG (EFA supported instance types: "
                         f"{_UG}/efa.html)"),
    "p4d.24xlarge": (4, "EC2 UG; NCCL log on a p4d.24xlarge 'NET/OFI Selected provider is "
                        "efa, fabric is efa (found 4 nics)' (https://github.com/aws/aws-ofi-nccl/issues/889)"),
    "p4de.24xlarge": (4, "EC2 UG (same network as p4d.24xlarge)"),
    "p5.48xlarge": (32, "EC2 UG 'EFA configuration for a P5 and P5e instances' "
                        f"requests 32 EFA devices ({_UG}/efa-acc-inst-types.html#efa-for-p5)"),
    "p5e.48xlarge": (32, "EC2 UG 'EFA configuration for a P5 and P5e instances' "
                         f"({_UG}/efa-acc-inst-types.html#efa-for-p5): the P5 layout, 32 network cards"),
    "p5en.48xlarge": (16, "NCCL log on a P5en: 'NET/OFI Selected Provider is efa (found 16 nics)' "
                          "(https://github.com/NVIDIA/nccl/issues/1597)"),
    "g4dn.8xlarge": (1, "estimate: EFA-capable (sagemaker-training-toolkit EFA list), one network card"),
    "g4dn.12xlarge": (1, "estimate: EFA-capable (sagemaker-training-toolkit EFA list), one network card"),
    "g5.48xlarge": (1, "EC2 UG (100 Gbps, 1 EFA device)"),
    "trn1.32xlarge": (8, "estimate: 800 Gbps of EFA (Neuron docs, Trn1 architecture: https://awsdocs-neuron."
                         "readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trn1-arch.html) at "
                         "100 Gbps per device"),
    "trn1n.32xlarge": (16, "estimate: 1600 Gbps of EFA (Neuron docs, Trn1 architecture) at 100 Gbps per device"),
}
TYPES = tuple(replace(t, efa_devices=_EFA_DEVICES[t.name][0], efa_source=_EFA_DEVICES[t.name][1])
              if t.name in _EFA_DEVICES else t for t in TYPES)

# Network bandwidth per instance type, Gbit/s, as AWS states it for the type (what all its EFA devices
# carry together; the inter-node busbw above is bounded by it: 400 Gbps is 50 GB/s).
_P4 = "https://aws.amazon.com/ec2/instance-types/p4/"
_P5 = "https://aws.amazon.com/ec2/instance-types/p5/"
_NETWORK_GBPS: dict[str, tuple[int, str]] = {
    "p3dn.24xlarge": (100, "EC2 UG"),
    "p4d.24xlarge": (400, f"AWS P4 instance page ({_P4}): 400 Gbps EFA"),
    "p4de.24xlarge": (400, f"AWS P4 instance page ({_P4})"),
    "p5.48xlarge": (3200, f"AWS P5 instance page ({_P5}): 3200 Gbps EFA"),
    "p5e.48xlarge": (3200, f"AWS P5 instance page ({_P5})"),
    "p5en.48xlarge": (3200, f"AWS P5 instance page ({_P5}): 3200 Gbps EFAv3"),
    "g5.48xlarge": (100, "EC2 UG"),
    "trn1.32xlarge": (800, "Neuron docs, Trn1 architecture (see the EFA devices above)"),
    "trn1n.32xlarge": (1600, "Neuron docs, Trn1 architecture"),
}
TYPES = tuple(replace(t, network_gbps=_NETWORK_GBPS[t.name][0]) if t.name in _NETWORK_GBPS else t for t in TYPES)
NETWORK_SOURCES: dict[str, str] = {name: src for name, (_, src) in _NETWORK_GBPS.items()}

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
