"""Fakes for the EFA tests (tests/facts/test_efa.py, tests/checks/test_checks_efa.py): a node's
sysfs/dev tree under a tmp directory (DDP_DOCTOR_SYS_ROOT), a fake `fi_info` on PATH, and NCCL INFO
logs quoted verbatim from public issues (each with its URL; only log-collector timestamps removed).
"""
# ruff: noqa: E501  - log lines are quoted verbatim
from __future__ import annotations

import os
import stat
from pathlib import Path

from ddp_doctor.facts import efa

# `fi_info -p efa` on an EFA host, as posted in https://github.com/ofiwg/libfabric/issues/5689
FI_INFO_EFA_OUTPUT = """\
provider: efa
    fabric: EFA-fe80::39:beff:fe6e:c23
    domain: efa_0-rdm
    version: 2.0
    type: FI_EP_RDM
    protocol: FI_PROTO_EFA
provider: efa
    fabric: EFA-fe80::39:beff:fe6e:c23
    domain: efa_0-dgrm
    version: 2.0
    type: FI_EP_DGRAM
    protocol: FI_PROTO_EFA
provider: efa;ofi_rxd
    fabric: EFA-fe80::39:beff:fe6e:c23
    domain: efa_0-dgrm
    version: 1.0
    type: FI_EP_RDM
    protocol: FI_PROTO_RXD
"""
# Without an EFA device `fi_info -p efa` "will return -61" (FI_ENODATA,
# https://github.com/ofiwg/libfabric/pull/10794); fi_info prints fi_getinfo's error on stderr.
FI_INFO_NONE_STDERR = "fi_getinfo: -61 (No data available)"

# NCCL fell back to sockets on a p4d.24xlarge after aws-ofi-nccl failed to initialise
# (https://github.com/aws/aws-ofi-nccl/issues/889; CloudWatch timestamps removed).
LOG_P4D_SOCKET = """\
ip-10-36-29-253:82:2548 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 4 nics)
ip-10-36-29-253:84:2553 [0] platform_config_endpoint:626 NCCL WARN NET/OFI GDR disabled on GDR-supported instance type p4d.24xlarge
ip-10-36-29-253:84:2553 [0] nccl_net_ofi_domain_get_ep:969 NCCL WARN NET/OFI Creating new endpoint for domain 0x7ef453a99380 failed: Invalid argument
ip-10-36-29-253:84:2553 [0] nccl_net_ofi_create_plugin:335 NCCL WARN NET/OFI aws-ofi-nccl initialization failed
ip-10-36-29-253:84:2553 [0] nccl_net_ofi_init:155 NCCL WARN NET/OFI Initializing plugin failed
ip-10-36-29-253:84:2553 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0
ip-10-36-29-253:84:2553 [0] NCCL INFO NET/IB : No device found.
ip-10-36-29-253:84:2553 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0
ip-10-36-29-253:84:2553 [0] NCCL INFO NET/Socket : Using [0]eth0:10.36.29.253<0>
ip-10-36-29-253:84:2553 [0] NCCL INFO Using non-device net plugin version 0
"""
# The same on SageMaker (algo-1), with NCCL's own verdict line
# (https://github.com/aws/aws-ofi-nccl/issues/715; CloudWatch timestamps removed).
LOG_SAGEMAKER_SOCKET = """\
algo-1:17774:17853 [1] nccl_net_ofi_create_plugin:259 NCCL WARN NET/OFI aws-ofi-nccl initialization failed
algo-1:17774:17853 [1] NCCL INFO NCCL_IB_DISABLE set by environment to 1.
algo-1:17774:17853 [1] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0
algo-1:17774:17853 [1] NCCL INFO NET/Socket : Using [0]eth0:10.0.227.37<0>
algo-1:17774:17853 [1] NCCL INFO Using non-device net plugin version 0
algo-1:17774:17853 [1] NCCL INFO Using network Socket
"""
# mpirun-prefixed lines from an EKS job that fell back to sockets
# (https://github.com/aws/aws-k8s-tester/pull/454).
LOG_MPIRUN_SOCKET = """\
[1,9]<stdout>:bert-mpi-training-worker-1:22:572 [1] nccl_net_ofi_create_plugin:257 NCCL WARN NET/OFI aws-ofi-nccl initialization failed
[1,8]<stdout>:bert-mpi-training-worker-1:21:568 [0] NCCL INFO NET/Socket : Using [0]eth0:192.168.60.235<0>
[1,8]<stdout>:bert-mpi-training-worker-1:21:568 [0] NCCL INFO Using non-device net plugin version 0
[1,8]<stdout>:bert-mpi-training-worker-1:21:568 [0] NCCL INFO Using network Socket
"""
# Healthy p4d.24xlarge nodes on EFA (https://github.com/NVIDIA/nccl/issues/526).
LOG_P4D_EFA = """\
compute-st-p4d24xlarge-12: compute-st-p4d24xlarge-12:2402:2402 [3] NCCL INFO NET/OFI Selected Provider is efa
compute-st-p4d24xlarge-12: compute-st-p4d24xlarge-12:2402:2402 [3] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v4 symbol.
compute-st-p4d24xlarge-12: compute-st-p4d24xlarge-12:2402:2402 [3] NCCL INFO Using network AWS Libfabric
"""
# A healthy P5en (H200) node with a recent aws-ofi-nccl (https://github.com/NVIDIA/nccl/issues/1597).
LOG_P5EN_EFA = """\
8h200-2:6831:6840 [0] NCCL INFO NET/OFI Skipping NCCL_PROTO checks on P5en + RDMA
8h200-2:6831:6840 [0] NCCL INFO PROFILER/Plugin: Could not find: libnccl-profiler.so.
8h200-2:6831:6840 [0] NCCL INFO Using network Libfabric
8h200-3:6310:6318 [0] NCCL INFO NET/OFI Selected Provider is efa (found 16 nics)
"""
# Channel lines only (no "Using network" line), two p4d nodes on EFA
# (https://github.com/aws/aws-ofi-nccl/issues/64).
LOG_CHANNELS_EFA = """\
ip-172-31-13-103:9738:9797 [0] NCCL INFO Channel 01 : 9[101d0] -> 0[101c0] [receive] via NET/AWS Libfabric/0
ip-172-31-6-104:9922:9980 [1] NCCL INFO Channel 01 : 9[101d0] -> 0[101c0] [send] via NET/AWS Libfabric/0
"""


def fake_node(root: Path, *, product: str | None = "p4d.24xlarge", efa_devices: int = 4,
              uverbs: int | None = None, other: tuple[str, ...] = (),
              plugin: str | None = "/opt/amazon/ofi-nccl/lib/libnccl-net.so",
              fi_info: str | None = "efa") -> dict[str, str]:
    """A fake node under `root` (DDP_DOCTOR_SYS_ROOT): DMI product name, EFA devices in
    /sys/class/infiniband bound to the efa driver, /dev/infiniband/uverbs*, the aws-ofi-nccl plugin,
    and a fake `fi_info` in root/bin ("efa": lists the efa provider, "none": fails with -61, "slow":
    never answers). Returns the environment a rank there would have."""
    if product is not None:
        dmi = root / "sys/devices/virtual/dmi/id"
        dmi.mkdir(parents=True, exist_ok=True)
        (dmi / "product_name").write_text(product + "\n")
    drivers = root / "sys/bus/pci/drivers"
    for drv in ("efa", "mlx5_core"):
        (drivers / drv).mkdir(parents=True, exist_ok=True)
    ib = root / "sys/class/infiniband"
    if efa_devices or other:
        ib.mkdir(parents=True, exist_ok=True)
    names = [f"rdmap{16 * (i + 1)}s27" for i in range(efa_devices)]
    for name, drv in [*((n, "efa") for n in names), *((n, "mlx5_core") for n in other)]:
        dev = ib / name / "device"
        dev.mkdir(parents=True)
        os.symlink(drivers / drv, dev / "driver")
    n_uverbs = efa_devices + len(other) if uverbs is None else uverbs
    if n_uverbs:
        (root / "dev/infiniband").mkdir(parents=True, exist_ok=True)
        for i in range(n_uverbs):
            (root / f"dev/infiniband/uverbs{i}").write_text("")
    if plugin:
        lib = root / plugin.lstrip("/")
        lib.parent.mkdir(parents=True, exist_ok=True)
        lib.write_text("")
    bindir = root / "bin"
    bindir.mkdir(exist_ok=True)
    if fi_info is not None:
        body = {"efa": f"cat <<'EOF'\n{FI_INFO_EFA_OUTPUT}EOF\nexit 0\n",
                "none": f"echo '{FI_INFO_NONE_STDERR}' >&2\nexit 61\n",
                "slow": "sleep 30\n"}[fi_info]
        script = bindir / "fi_info"
        script.write_text("#!/bin/sh\n" + body)
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return {efa.SYS_ROOT_ENV: str(root), "PATH": f"{bindir}{os.pathsep}/usr/bin{os.pathsep}/bin",
            "LD_LIBRARY_PATH": "/opt/amazon/ofi-nccl/lib:/usr/local/cuda/lib64"}
