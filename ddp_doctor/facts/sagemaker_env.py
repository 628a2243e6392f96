"""SageMaker's view of the job, read from SM_* variables and /opt/ml/input/config.

Pure functions over an environment mapping and a config root (default /opt/ml, overridable with
DDP_DOCTOR_SM_ROOT for tests). Nothing here raises: problems are recorded in `errors` for the
checks to report. Facts follow sagemaker-training-toolkit (environment.py, torch_distributed.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from ddp_doctor.facts.env_values import Invalid, as_int, bounded_json, env_int, env_json, read_text_file

DEFAULT_ROOT = "/opt/ml"
TORCHRUN_PORT = 7777
SMDDP_PORT = 7592
# SM_FRAMEWORK_PARAMS flag -> distribution name, in the order the PyTorch toolkit picks a launcher.
DISTRIBUTION_FLAGS = (
    ("sagemaker_mpi_enabled", "mpi"),
    ("sagemaker_pytorch_ddp_enabled", "pytorchddp"),
    ("sagemaker_distributed_dataparallel_enabled", "smdistributed"),
    ("sagemaker_torch_distributed_enabled", "torch_distributed"),
)
# distribution -> the launcher the toolkit uses for it
EXPECTED_LAUNCHER = {"mpi": "mpirun", "pytorchddp": "mpirun", "smdistributed": "mpirun",
                     "torch_distributed": "torchrun"}


@dataclass(frozen=True)
class SageMakerEnv:
    root: str
    hosts: list[str] | None                 # SM_HOSTS (a JSON list)
    current_host: str | None                # SM_CURRENT_HOST
    num_gpus: int | None                    # SM_NUM_GPUS
    instance_type: str | None
    network_interface: str | None           # SM_NETWORK_INTERFACE_NAME
    framework_params: dict[str, Any]
    training_env: dict[str, Any]
    resource_config: dict[str, Any] | None  # input/config/resourceconfig.json
    hyperparameters: dict[str, Any] | None  # input/config/hyperparameters.json, values decoded
    distribution: str                       # mpi | pytorchddp | smdistributed | torch_distributed | none
    distribution_hosts: list[str]           # instance_groups[].hosts in file order: decides master
    master_hostname: str | None
    processes_per_host: int
    is_hetero: bool
    distribution_groups: list[str] | None
    # source ("SM_HOSTS", "resourceconfig.json", ...) -> what is wrong with it
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def expected_launcher(self) -> str | None:
        return EXPECTED_LAUNCHER.get(self.distribution)

    @property
    def rc_hosts(self) -> list[str] | None:
        h = (self.resource_config or {}).get("hosts")
        return [str(x) for x in h] if isinstance(h, list) else None

    @property
    def rc_current_host(self) -> str | None:
        h = (self.resource_config or {}).get("current_host")
        return str(h) if h is not None else None

    @property
    def this_host(self) -> str | None:
        """The file's current_host wins: under the MPI runner SM_CURRENT_HOST may be the master's."""
        return self.rc_current_host or self.current_host


def config_root(env: Mapping[str, str]) -> str:
    return env.get("DDP_DOCTOR_SM_ROOT") or DEFAULT_ROOT


def present(env: Mapping[str, str], root: str | None = None) -> bool:
    """Is this a SageMaker training container?"""
    if any(k in env for k in ("SM_HOSTS", "SM_CURRENT_HOST", "SM_TRAINING_ENV")):
        return True
    root = root or config_root(env)
    return os.path.isfile(os.path.join(root, "input", "config", "resourceconfig.json"))


def _read_json_file(path: str) -> tuple[Any, str | None]:
    """(the file's JSON, None), or (None, what is wrong): "missing", or "unreadable: ..." for a file
    that cannot be read, decoded, or parsed within bounded_json's size and depth."""
    try:
        return bounded_json(read_text_file(path)), None
    except FileNotFoundError:
        return None, "missing"
    except OSError as e:
        return None, f"unreadable: {e.strerror or e}"
    except ValueError as e:
        return None, f"unreadable: {e}"


def _decode_hyperparameters(raw: Any, problems: list[str]) -> dict[str, Any]:
    # Every value in hyperparameters.json is a JSON-encoded string ("3", "\"train.py\""). A value that
    # is no JSON stays the string it is; one too large or too deep to read is also noted in `problems`.
    out: dict[str, Any] = {}
    for k, v in (raw or {}).items():
        if isinstance(v, str):
            try:
                out[k] = bounded_json(v)
                continue
            except ValueError as e:
                if not str(e).startswith("not valid JSON"):
                    problems.append(f"the value of {str(k)[:80]!r} is {e}")
        out[k] = v
    return out


RAW_LIMIT = 200  # characters of a raw value quoted in an error (checks/sagemaker_config.py clips alike)


def _clip(raw: str) -> str:
    return raw if len(raw) <= RAW_LIMIT else raw[:RAW_LIMIT] + "..."


def _str_list(value: Any) -> list[str] | None:
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return list(value)
    return None


def _read_hosts(env: Mapping[str, str], errors: dict[str, str]) -> list[str] | None:
    """SM_HOSTS as a list of host names, or None when unset or malformed (then noted in `errors`): the
    host list every host-count check compares against."""
    hosts_raw = env_json(env, "SM_HOSTS")
    hosts = _str_list(hosts_raw)
    if isinstance(hosts_raw, Invalid):
        errors["SM_HOSTS"] = (f"SM_HOSTS={_clip(hosts_raw.raw)!r} is {hosts_raw.why}; it must be a JSON list "
                              "of host names")
    elif hosts_raw is not None and hosts is None:
        errors["SM_HOSTS"] = (f"SM_HOSTS={_clip(env.get('SM_HOSTS') or '')!r} is a JSON {type(hosts_raw).__name__}, "
                              "not a list of host names")
    return hosts


def _read_num_gpus(env: Mapping[str, str], errors: dict[str, str]) -> int | Invalid | None:
    """SM_NUM_GPUS as read (a negative count turned Invalid and noted in `errors`): kept raw because the
    processes-per-host fallback needs to tell a bad value from an unset one."""
    num_gpus = env_int(env, "SM_NUM_GPUS")
    if isinstance(num_gpus, int) and num_gpus < 0:  # a count: found by fuzzing to pass as clean
        num_gpus = Invalid(env.get("SM_NUM_GPUS", ""), "negative (a GPU count)")
    if isinstance(num_gpus, Invalid):
        errors["SM_NUM_GPUS"] = f"SM_NUM_GPUS={num_gpus.raw!r} is {num_gpus.why}"
    return num_gpus


def _dict_var(env: Mapping[str, str], name: str, errors: dict[str, str]) -> dict[str, Any]:
    """The JSON object in variable `name`, or {} when it is unset or not an object (noted in `errors`):
    SM_FRAMEWORK_PARAMS and SM_TRAINING_ENV are read as dicts whatever the container holds."""
    v = env_json(env, name)
    if isinstance(v, Invalid):
        errors[name] = f"{name} is {v.why}"
        return {}
    if v is not None and not isinstance(v, dict):
        errors[name] = f"{name} is a JSON {type(v).__name__}, not an object"
        return {}
    return v or {}


def _read_resource_config(cfg: str, errors: dict[str, str]) -> dict[str, Any] | None:
    """resourceconfig.json as a dict, or None when missing, unreadable or not an object (noted in
    `errors`): the file names this host and the instance groups that decide the master."""
    path = os.path.join(cfg, "resourceconfig.json")
    rc, rc_err = _read_json_file(path)
    if rc_err:
        errors["resourceconfig.json"] = f"{path} is {rc_err}"
        return None
    if not isinstance(rc, dict):
        errors["resourceconfig.json"] = "resourceconfig.json is not a JSON object"
        return None
    return rc


def _read_hyperparameters(cfg: str, errors: dict[str, str]) -> dict[str, Any] | None:
    """hyperparameters.json with its values decoded, or None when missing or not an object: an
    unreadable file, or values too large or deep to decode, are noted in `errors` (a missing file is not:
    a job may have no hyperparameters)."""
    path = os.path.join(cfg, "hyperparameters.json")
    hp_raw, hp_err = _read_json_file(path)
    if hp_err and hp_err != "missing":
        errors["hyperparameters.json"] = f"{path} is {hp_err}"
        return None
    if not isinstance(hp_raw, dict):
        return None
    problems: list[str] = []
    hyperparameters = _decode_hyperparameters(hp_raw, problems)
    if problems:
        errors["hyperparameters.json"] = (f"{path}: " + "; ".join(problems[:3])
                                          + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""))
    return hyperparameters


def _distribution(framework_params: Mapping[str, Any]) -> str:
    """The distribution the toolkit would launch ("none" without one): the first flag set, in the order
    the PyTorch toolkit tests them."""
    for flag, dist_name in DISTRIBUTION_FLAGS:
        if framework_params.get(flag) in (True, "true", "True", 1):
            return dist_name
    return "none"


def _distribution_hosts(rc: dict[str, Any] | None, is_hetero: bool, dgroups: list[str] | None,
                        training_env: Mapping[str, Any], hosts: list[str] | None) -> list[str]:
    """The hosts that take part in the distribution, in the order that makes the first the master: those
    of the (distribution) instance groups in file order as the toolkit reads them, else the first host
    list found in SM_TRAINING_ENV, resourceconfig.json or SM_HOSTS."""
    distribution_hosts: list[str] = []
    groups = (rc or {}).get("instance_groups")
    if isinstance(groups, list) and groups:
        for g in groups:
            if not isinstance(g, dict):
                continue
            if is_hetero and dgroups is not None and g.get("instance_group_name") not in dgroups:
                continue
            group_hosts = g.get("hosts")
            if isinstance(group_hosts, list):  # a string or number here is a broken file (DDP201)
                distribution_hosts.extend(str(h) for h in group_hosts)
    if not distribution_hosts:
        distribution_hosts = (_str_list(training_env.get("distribution_hosts"))
                              or _str_list((rc or {}).get("hosts")) or hosts or [])
    return distribution_hosts


def _processes_per_host(env: Mapping[str, str], framework_params: Mapping[str, Any],
                        num_gpus: int | Invalid | None, errors: dict[str, str]) -> int:
    """How many processes the launcher starts per host: the MPI setting when it is positive (a value
    below 1 is noted in `errors`), else one per GPU, else one per Neuron device, else 1."""
    ppn = as_int(framework_params.get("sagemaker_mpi_num_of_processes_per_host"))
    if ppn is not None and ppn < 1:
        errors["SM_FRAMEWORK_PARAMS"] = (f"sagemaker_mpi_num_of_processes_per_host={ppn} is not a positive "
                                         "number of processes per host")
        ppn = None
    if ppn is None:
        ppn = as_int(num_gpus) or as_int(env_int(env, "SM_NUM_NEURONS")) or 1
    return ppn


def read(env: Mapping[str, str], root: str | None = None) -> SageMakerEnv | None:
    """The SageMaker view, or None when this is not a SageMaker container."""
    root = root or config_root(env)
    if not present(env, root):
        return None
    errors: dict[str, str] = {}
    hosts = _read_hosts(env, errors)
    num_gpus = _read_num_gpus(env, errors)
    framework_params = _dict_var(env, "SM_FRAMEWORK_PARAMS", errors)
    training_env = _dict_var(env, "SM_TRAINING_ENV", errors)

    cfg = os.path.join(root, "input", "config")
    rc = _read_resource_config(cfg, errors)
    hyperparameters = _read_hyperparameters(cfg, errors)
    for k, v in (hyperparameters or {}).items():  # toolkit: sagemaker_* hyperparameters are framework params
        if k.startswith("sagemaker_"):
            framework_params.setdefault(k, v)

    is_hetero = str(env.get("SM_IS_HETERO", "false")).lower() == "true"
    dgroups = _str_list(env_json(env, "SM_DISTRIBUTION_INSTANCE_GROUPS"))
    distribution_hosts = _distribution_hosts(rc, is_hetero, dgroups, training_env, hosts)

    return SageMakerEnv(
        root=root, hosts=hosts, current_host=env.get("SM_CURRENT_HOST") or None,
        num_gpus=as_int(num_gpus),
        instance_type=env.get("SM_CURRENT_INSTANCE_TYPE") or (rc or {}).get("current_instance_type")
        or framework_params.get("sagemaker_instance_type"),
        network_interface=env.get("SM_NETWORK_INTERFACE_NAME") or (rc or {}).get("network_interface_name"),
        framework_params=framework_params, training_env=training_env, resource_config=rc,
        hyperparameters=hyperparameters, distribution=_distribution(framework_params),
        distribution_hosts=distribution_hosts, master_hostname=distribution_hosts[0] if distribution_hosts else None,
        processes_per_host=_processes_per_host(env, framework_params, num_gpus, errors),
        is_hetero=is_hetero, distribution_groups=dgroups, errors=errors,
    )
