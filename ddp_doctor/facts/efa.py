"""What this host shows of EFA and of the network NCCL uses on AWS: the instance type on any
launcher, the EFA devices, libfabric's EFA provider, the aws-ofi-nccl plugin where NCCL looks for
it, the locked-memory limit, and the network NCCL says it chose in its own INFO output.

Every reader is a plain function of an environment mapping and a root directory, so tests build
any host (a p4d with 4 EFA devices, a p5 with 32, a container that was not given its devices)
without one. Nothing here calls the network: the instance type comes from SageMaker's variables,
an explicit setting, or the DMI product name, never from the instance metadata service.

Test seam: DDP_DOCTOR_SYS_ROOT (in the environment mapping handed in) names a directory that
stands for "/" when reading /sys, /dev, /etc/ld.so.conf* and the plugin directories under /opt.
It exists for tests (a fake sysfs/dev tree under tmp_path); leave it unset on real hosts.

Sources: EFA devices appear as /sys/class/infiniband/<dev> bound to the "efa" driver and as
/dev/infiniband/uverbs* (EC2 user guide; `ls /dev/infiniband/uverbs*` is AWS's own check,
aws/aws-ofi-nccl#803). `fi_info -p efa -t FI_EP_RDM` lists libfabric's EFA provider (EC2 user
guide, "Get started with EFA and NCCL"); on a host without one it fails with -61 (FI_ENODATA,
ofiwg/libfabric#10794). The DMI product name on EC2 Nitro instances is the instance type (read
by awslabs/aws-c-common source/linux/system_info.c for its instance-type detection, e.g.
"p4d.24xlarge" in awslabs/aws-crt-python#515).
"""
from __future__ import annotations

import glob
import os
import re
import resource
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ddp_doctor.facts.own_env import default_own, set_own

SYS_ROOT_ENV = "DDP_DOCTOR_SYS_ROOT"        # test seam: a directory standing for "/" (tests only)
INSTANCE_TYPE_ENV = "DDP_DOCTOR_INSTANCE_TYPE"  # say the instance type where nothing else can
DMI_PRODUCT_NAME = "/sys/devices/virtual/dmi/id/product_name"
IB_CLASS_DIR = "/sys/class/infiniband"
UVERBS_GLOB = "/dev/infiniband/uverbs*"
FI_INFO_TIMEOUT_S = 5.0
# Where the EFA installer puts fi_info; searched after PATH.
FI_INFO_DIRS = ("/opt/amazon/efa/bin",)
# The library names NCCL loads as its network plugin (aws-ofi-nccl installs libnccl-net.so, newer
# releases also libnccl-net-ofi.so / libnccl-net-aws-ofi.so) ...
PLUGIN_NAMES = ("libnccl-net.so", "libnccl-net-ofi.so", "libnccl-net-aws-ofi.so")
# ... the directories the aws-ofi-nccl builds and installers use (found there but not on the
# loader's path means NCCL will not load it) ...
PLUGIN_DIRS = ("/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib64", "/opt/aws-ofi-nccl/lib",
               "/usr/local/lib")
# ... and the loader's default directories (dlopen searches them after LD_LIBRARY_PATH and ld.so.conf).
LOADER_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64", "/usr/lib/x86_64-linux-gnu",
               "/usr/lib/aarch64-linux-gnu")
NCCL_LOG_MAX_BYTES = 8 << 20


def sys_root(env: Mapping[str, str]) -> str:
    """The directory standing for "/" (DDP_DOCTOR_SYS_ROOT, tests only; "/" otherwise)."""
    return env.get(SYS_ROOT_ENV) or "/"


def _at(root: str, path: str) -> str:
    return path if root in ("", "/") else os.path.join(root, path.lstrip("/"))


def _read(path: str, limit: int = 4096) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(limit)
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------
# The instance type, on any launcher

@dataclass(frozen=True)
class InstanceTypeSeen:
    name: str      # as the source spells it ("ml.p4d.24xlarge" on SageMaker, "p4d.24xlarge" in DMI)
    source: str    # where it came from, for messages


def dmi_product_name(root: str = "/") -> str | None:
    """The DMI product name (the instance type on EC2 Nitro instances), or None."""
    text = _read(_at(root, DMI_PRODUCT_NAME), 256)
    return (text.strip() or None) if text is not None else None


def instance_type(env: Mapping[str, str], *, sagemaker: str | None = None,
                  option: str | None = None) -> InstanceTypeSeen | None:
    """This host's instance type and where it came from, first of: the command line's
    --instance-type (`option`), DDP_DOCTOR_INSTANCE_TYPE, SageMaker's (SM_CURRENT_INSTANCE_TYPE or
    resourceconfig.json, handed in as `sagemaker`), the DMI product name. None when none says.

    Explicit settings come first: they are how a user corrects a host whose DMI says nothing
    useful (some containers hide /sys/devices/virtual/dmi)."""
    for value, source in ((option, "--instance-type"), (env.get(INSTANCE_TYPE_ENV), INSTANCE_TYPE_ENV),
                          (sagemaker, "SageMaker (SM_CURRENT_INSTANCE_TYPE)")):
        if isinstance(value, str) and value.strip():
            return InstanceTypeSeen(value.strip(), source)
    dmi = dmi_product_name(sys_root(env))
    return InstanceTypeSeen(dmi, f"DMI product name ({DMI_PRODUCT_NAME})") if dmi else None


# ---------------------------------------------------------------------------------------------
# EFA devices

@dataclass(frozen=True)
class EfaDevices:
    efa: tuple[str, ...]          # /sys/class/infiniband devices bound to the efa driver
    other: tuple[str, ...]        # RDMA devices bound to another driver (mlx5_0, ...)
    uverbs: tuple[str, ...]       # /dev/infiniband/uverbs* (what a process, or a container, can open)
    sysfs_readable: bool          # /sys/class/infiniband exists


def efa_devices(root: str = "/") -> EfaDevices:
    class_dir = _at(root, IB_CLASS_DIR)
    efa, other = [], []
    try:
        names = sorted(os.listdir(class_dir))
        readable = True
    except OSError:
        names, readable = [], False
    for name in names:
        driver = os.path.join(class_dir, name, "device", "driver")
        target = os.path.basename(os.path.realpath(driver)) if os.path.lexists(driver) else ""
        (efa if target == "efa" else other).append(name)
    uverbs = tuple(sorted(os.path.basename(p) for p in glob.glob(_at(root, UVERBS_GLOB))))
    return EfaDevices(tuple(efa), tuple(other), uverbs, readable)


# ---------------------------------------------------------------------------------------------
# libfabric

@dataclass(frozen=True)
class FiInfo:
    status: str                       # "ok" (ran), "not_found", "timeout", "error" (could not run)
    path: str | None = None
    returncode: int | None = None
    providers: tuple[str, ...] = ()   # one per fi_info entry, e.g. ("efa", "efa")
    domains: tuple[str, ...] = ()
    output: str = ""                  # the first lines, for evidence

    @property
    def has_efa(self) -> bool:
        return any(p.split(";")[0] == "efa" for p in self.providers)


_FI_FIELD = re.compile(r"^\s*(provider|domain):\s*(\S.*?)\s*$")


def parse_fi_info(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(providers, domains) of `fi_info` output ("provider: efa", "    domain: rdmap16s27-rdm")."""
    providers, domains = [], []
    for line in text.splitlines():
        m = _FI_FIELD.match(line)
        if m:
            (providers if m.group(1) == "provider" else domains).append(m.group(2))
    return tuple(providers), tuple(domains)


def find_fi_info(env: Mapping[str, str]) -> str | None:
    root = sys_root(env)
    dirs = [d for d in (env.get("PATH") or "").split(os.pathsep) if d]
    dirs += [_at(root, d) for d in FI_INFO_DIRS]
    return shutil.which("fi_info", path=os.pathsep.join(dirs))


def fi_info_efa(env: Mapping[str, str], timeout: float = FI_INFO_TIMEOUT_S) -> FiInfo:
    """Run `fi_info -p efa -t FI_EP_RDM` with the rank's environment, bounded by `timeout`.
    fi_info missing is "not_found" (unknown, not an error by itself)."""
    path = find_fi_info(env)
    if path is None:
        return FiInfo("not_found")
    try:
        done = subprocess.run([path, "-p", "efa", "-t", "FI_EP_RDM"], capture_output=True, text=True,
                              timeout=timeout, env=dict(env), stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return FiInfo("timeout", path)
    except OSError as e:
        return FiInfo("error", path, output=f"{type(e).__name__}: {e}")
    out = (done.stdout or "") + (done.stderr or "")
    providers, domains = parse_fi_info(done.stdout or "")
    return FiInfo("ok", path, done.returncode, providers, domains, "\n".join(out.strip().splitlines()[:12]))


# ---------------------------------------------------------------------------------------------
# The aws-ofi-nccl plugin

@dataclass(frozen=True)
class NetPlugin:
    requested: str | None                 # NCCL_NET_PLUGIN, when set
    names: tuple[str, ...]                # library names NCCL would try
    loadable: tuple[str, ...]             # found in a directory the loader searches
    elsewhere: tuple[str, ...]            # found only in a directory the loader does not search
    searched: tuple[str, ...] = field(default=())  # the loader's directories, in order

    @property
    def disabled(self) -> bool:
        return (self.requested or "").strip().lower() == "none"


def _ld_conf_dirs(root: str) -> list[str]:
    """Directories listed in /etc/ld.so.conf and /etc/ld.so.conf.d/*.conf (include lines followed)."""
    out: list[str] = []
    files = [_at(root, "/etc/ld.so.conf")] + sorted(glob.glob(_at(root, "/etc/ld.so.conf.d/*.conf")))
    for path in files:
        for line in (_read(path, 65536) or "").splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("include") and line.startswith("/"):
                out.append(line)
    return out


def plugin_names(env: Mapping[str, str]) -> tuple[str, ...]:
    """The library names NCCL tries: NCCL_NET_PLUGIN=X means libnccl-net-X.so (or X itself when it
    is a library name or path); unset means libnccl-net.so, which aws-ofi-nccl installs."""
    req = (env.get("NCCL_NET_PLUGIN") or "").strip()
    if not req:
        return PLUGIN_NAMES
    if req.lower() == "none":
        return ()
    if "/" in req or req.endswith(".so") or ".so." in req:
        return (req,)
    return (f"libnccl-net-{req}.so", req)


def find_net_plugin(env: Mapping[str, str]) -> NetPlugin:
    root = sys_root(env)
    names = plugin_names(env)
    searched: list[str] = []
    for d in [*(env.get("LD_LIBRARY_PATH") or "").split(os.pathsep), *_ld_conf_dirs(root), *LOADER_DIRS]:
        if d and d not in searched:
            searched.append(d)
    loadable: list[str] = []
    elsewhere: list[str] = []
    for name in names:
        if name.startswith("/"):
            if os.path.exists(_at(root, name)):
                loadable.append(name)
            continue
        for d in searched:
            if os.path.exists(_at(root, os.path.join(d, name))):
                loadable.append(os.path.join(d, name))
        for d in PLUGIN_DIRS:
            p = os.path.join(d, name)
            if d not in searched and os.path.exists(_at(root, p)):
                elsewhere.append(p)
    return NetPlugin((env.get("NCCL_NET_PLUGIN") or None), names, tuple(loadable), tuple(elsewhere),
                     tuple(searched))


# ---------------------------------------------------------------------------------------------
# Locked memory

def memlock_limit() -> tuple[int | None, int | None]:
    """(soft, hard) RLIMIT_MEMLOCK in bytes; None means unlimited."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    inf = resource.RLIM_INFINITY
    return (None if soft == inf else int(soft)), (None if hard == inf else int(hard))


# ---------------------------------------------------------------------------------------------
# NCCL's own INFO output

@dataclass(frozen=True)
class NcclNetwork:
    kind: str | None            # "OFI" (aws-ofi-nccl / libfabric), "Socket", "IB", or None (not said)
    name: str | None            # as NCCL names it: "AWS Libfabric", "Libfabric", "Socket", "IB"
    lines: tuple[str, ...]      # the lines that say so (a few), for messages
    plugin_failed: tuple[str, ...] = ()   # NET/OFI or NET/Plugin warnings seen before it
    provider: str | None = None          # "efa" from "NET/OFI Selected Provider is efa"


_USING = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_VIA = re.compile(r"via NET/([A-Za-z][A-Za-z ]*?)/\d")
_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (\w[\w-]*)")


def network_kind(name: str) -> str | None:
    """"OFI", "Socket" or "IB" for a network name as NCCL or NCCL_NET spells it, else None."""
    low = name.lower()
    if "libfabric" in low or "ofi" in low:
        return "OFI"
    if low.startswith("socket"):
        return "Socket"
    if low.startswith("ib"):
        return "IB"
    return None


def nccl_network(lines: Iterable[str]) -> NcclNetwork:
    """The network NCCL chose, from its INFO output (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET):
    the last "NCCL INFO Using network X" line, else the transport of "via NET/X/0" channel lines,
    else "NET/Socket : Using" (NCCL fell back to its socket transport)."""
    using: list[tuple[str, str]] = []
    via: list[tuple[str, str]] = []
    socket_lines: list[str] = []
    failed: list[str] = []
    provider = None
    for raw in lines:
        line = raw.rstrip("\n")
        m = _USING.search(line)
        if m:
            using.append((m.group(1), line.strip()))
            continue
        m = _VIA.search(line)
        if m:
            via.append((m.group(1).strip(), line.strip()))
        if "NET/Socket : Using" in line:
            socket_lines.append(line.strip())
        m = _PROVIDER.search(line)
        if m:
            provider = m.group(1)
        if "NCCL WARN NET/" in line or "No plugin found" in line or "Could not find: libnccl-net" in line:
            failed.append(line.strip())
    if using:
        name, line = using[-1]
        return NcclNetwork(network_kind(name), name, (line,), tuple(failed[-3:]), provider)
    if via:
        name, line = via[-1]
        return NcclNetwork(network_kind(name), name, (line,), tuple(failed[-3:]), provider)
    if socket_lines:
        return NcclNetwork("Socket", "Socket", (socket_lines[-1],), tuple(failed[-3:]), provider)
    return NcclNetwork(None, None, (), tuple(failed[-3:]), provider)


NCCL_LOG_PATTERN = "nccl-debug.%h.%p.log"  # one file per process: NCCL substitutes the host and pid


def nccl_log_env(env: dict[str, str], directory: str) -> None:
    """NCCL's INFO log of INIT and NET into `directory` rather than the user's output, unless the
    user set NCCL_DEBUG or NCCL_DEBUG_FILE: which network NCCL chose (EFA through aws-ofi-nccl, or
    TCP sockets) is read from it (DDP335). Nothing is logged on gloo. The values are marked as
    ddp-doctor's own (facts/own_env.py), so they are never compared across nodes as the user's."""
    if "NCCL_DEBUG" not in env and "NCCL_DEBUG_FILE" not in env:
        set_own(env, "NCCL_DEBUG", "INFO")
        default_own(env, "NCCL_DEBUG_SUBSYS", "INIT,NET")
        set_own(env, "NCCL_DEBUG_FILE", os.path.join(directory, NCCL_LOG_PATTERN))  # per node: never compared


def expand_nccl_debug_file(pattern: str, *, hostname: str | None = None, pid: int | None = None) -> str:
    """NCCL_DEBUG_FILE's name for one process: %h is the host name, %p the process id."""
    host = hostname if hostname is not None else socket.gethostname()
    return pattern.replace("%h", host).replace("%p", str(os.getpid() if pid is None else pid))


def read_log_lines(path: str, max_bytes: int = NCCL_LOG_MAX_BYTES) -> list[str] | None:
    """The lines of a log file (its last `max_bytes`), or None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return None
    return data.decode("utf-8", errors="replace").splitlines()
