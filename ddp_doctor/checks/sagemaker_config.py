"""Local checks that SageMaker's own configuration agrees with itself (DDP201-DDP206, DDP214): the
SM_* variables and /opt/ml/input/config are readable, list this host, agree with each other, and
describe one consistent cluster (hosts unique and sorted, instance groups within the hosts, the
master and a host outside the distribution instance groups pointed out). The helpers that read the
cluster SageMaker built (dist_hosts, multi_host, takes_part) live here and are shared with
checks/sagemaker_launch.py.

Every check does nothing outside SageMaker (ctx.sagemaker is None). Facts follow
sagemaker-training-toolkit (environment.py, torch_distributed.py, smdataparallel.py).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterator, Mapping, Sequence

from ddp_doctor.context import RankContext
from ddp_doctor.facts.sagemaker_env import SageMakerEnv
from ddp_doctor.findings import Problem
from ddp_doctor.registry import check

RAW_LIMIT = 200  # characters of a raw value quoted in a message
HOSTS_SHOWN = 8  # host names a message quotes; the others are counted ("+K more")
HOSTS_KEPT = 100  # host names a finding's evidence keeps (a job may have thousands of hosts)


def _clip(raw: str) -> str:
    return raw if len(raw) <= RAW_LIMIT else raw[:RAW_LIMIT] + "..."


def hosts_text(hosts: Sequence[str] | None) -> str:
    """A host list for a message: a short one as Python shows it (['algo-1', 'algo-2']), a long one
    as its first HOSTS_SHOWN names and how many more (['algo-1', ..., 'algo-8', +7992 more])."""
    hosts = list(hosts or [])
    if len(hosts) <= HOSTS_SHOWN:
        return str(hosts)
    return f"{str(hosts[:HOSTS_SHOWN])[:-1]}, +{len(hosts) - HOSTS_SHOWN} more]"


def host_evidence(lists: Mapping[str, Sequence[str] | None]) -> dict[str, Any]:
    """Host lists for a finding's evidence: each kept to its first HOSTS_KEPT names, with
    "<key>_count" (the full length) beside one that was cut."""
    out: dict[str, Any] = {}
    for key, hosts in lists.items():
        out[key] = None if hosts is None else list(hosts[:HOSTS_KEPT])
        if hosts is not None and len(hosts) > HOSTS_KEPT:
            out[f"{key}_count"] = len(hosts)
    return out


def dist_hosts(sm: SageMakerEnv) -> list[str]:
    return list(sm.distribution_hosts)


def multi_host(sm: SageMakerEnv) -> bool:
    return len(sm.distribution_hosts) > 1


def takes_part(sm: SageMakerEnv) -> bool:
    """False for a host outside the distribution instance groups of a heterogeneous cluster."""
    return not (sm.is_hetero and sm.this_host is not None and sm.distribution_hosts
                and sm.this_host not in sm.distribution_hosts)


# -- the config itself ------------------------------------------------------------------------

def _rc_shape_errors(rc: dict[str, Any]) -> Iterator[str]:
    """Structural problems of a resourceconfig.json that parsed to an object."""
    hosts = rc.get("hosts")
    if not (isinstance(hosts, list) and hosts and all(isinstance(h, str) for h in hosts)):
        yield f"resourceconfig.json: hosts is {_clip(repr(hosts))}, not a non-empty list of host names"
    if not isinstance(rc.get("current_host"), str):
        yield f"resourceconfig.json: current_host is {_clip(repr(rc.get('current_host')))}, not a host name"
    groups = rc.get("instance_groups")
    if groups is None:
        return
    if not isinstance(groups, list):
        yield f"resourceconfig.json: instance_groups is {_clip(repr(groups))}, not a list"
        return
    for i, g in enumerate(groups):
        gh = g.get("hosts") if isinstance(g, dict) else None
        if not (isinstance(gh, list) and all(isinstance(h, str) for h in gh)):
            yield f"resourceconfig.json: instance_groups[{i}] is {_clip(repr(g))}, not an object with a hosts list"


CONFIG_HINTS = {
    "SM_HOSTS": 'SM_HOSTS is JSON: read it with hosts = json.loads(os.environ["SM_HOSTS"]) (a list such as '
                '["algo-1","algo-2"]); if you set it yourself, write it as JSON: SM_HOSTS=\'["algo-1","algo-2"]\'.',
    "SM_NUM_GPUS": "SageMaker sets SM_NUM_GPUS to the number of GPUs as a whole number; do not override it.",
    "resourceconfig.json": "SageMaker writes /opt/ml/input/config/resourceconfig.json in every training container; "
                           "outside one (a local emulation) write it yourself, or point DDP_DOCTOR_SM_ROOT at a "
                           "directory holding input/config/resourceconfig.json.",
    "hyperparameters.json": "Every value in hyperparameters.json is a JSON-encoded string; let the estimator's "
                            "hyperparameters={...} write it.",
}
JSON_OBJECT_HINT = "The toolkit writes {name} as a JSON object; code that overrides it must write json.dumps(a_dict)."


@check("DDP201", category="topology", severity="error", title="SageMaker configuration unreadable",
       severities=("warning",))
def sagemaker_config_readable(ctx: RankContext) -> Iterator[Problem]:
    """
    What: A SageMaker variable or config file could not be read as what SageMaker writes: SM_HOSTS
    not a JSON list, SM_NUM_GPUS not a number, SM_FRAMEWORK_PARAMS or SM_TRAINING_ENV not a JSON
    object, resourceconfig.json missing, invalid, or without a hosts list and current_host.
    Why: Scripts and launchers derive the host list, the master and the node rank from these; a
    script that reads `int(os.environ["SM_HOSTS"])` or splits it on commas crashes or computes a
    wrong world.
    Fix: Parse SM_* values as JSON (`json.loads(os.environ["SM_HOSTS"])` is a list), and do not
    override the variables or files SageMaker provides.
    Severity: error for a file or SM_* variable that is unreadable or malformed; a warning when only
    resourceconfig.json is missing (SM_* variables still describe the job).
    """
    sm = ctx.sagemaker
    if sm is None:
        return
    for source, why in sorted(sm.errors.items()):
        raw = ctx.env.get(source) if source.startswith("SM_") else None
        message = why if raw is None or repr(_clip(raw)) in why else f"{why} (value: {_clip(raw)!r})"
        severity = "warning" if source == "resourceconfig.json" and why.endswith(" is missing") else None
        hint = CONFIG_HINTS.get(source) or JSON_OBJECT_HINT.format(name=source)
        yield Problem(message=message, hint=hint, severity=severity,
                      evidence={"source": source, "value": _clip(raw) if raw is not None else None})
    if sm.resource_config is not None:
        for message in _rc_shape_errors(sm.resource_config):
            yield Problem(message=message, hint=CONFIG_HINTS["resourceconfig.json"],
                          evidence={"source": "resourceconfig.json"})


@check("DDP202", category="topology", severity="error", title="This host is not in the host list")
def current_host_listed(ctx: RankContext) -> Iterator[Problem]:
    """
    What: SM_CURRENT_HOST is not in SM_HOSTS, or resourceconfig.json's current_host is not in its
    hosts.
    Why: The node rank is this host's position in the host list; a host that is not listed has no
    rank, and the toolkit's `hosts.index(current_host)` fails before training starts.
    Fix: Do not override SM_CURRENT_HOST, SM_HOSTS or resourceconfig.json; SageMaker writes them
    consistently in every training container.
    """
    sm = ctx.sagemaker
    if sm is None:
        return
    if sm.hosts is not None and sm.current_host is not None and sm.current_host not in sm.hosts:
        yield Problem(message=f"SM_CURRENT_HOST={sm.current_host!r} is not in SM_HOSTS={hosts_text(sm.hosts)}",
                      evidence={"current_host": sm.current_host, **host_evidence({"hosts": sm.hosts})})
    rc_hosts, rc_host = sm.rc_hosts, sm.rc_current_host
    if rc_hosts is not None and rc_host is not None and rc_host not in rc_hosts:
        yield Problem(message=f"resourceconfig.json current_host={rc_host!r} is not in its hosts "
                              f"{hosts_text(rc_hosts)}",
                      evidence={"current_host": rc_host, **host_evidence({"hosts": rc_hosts})})


@check("DDP203", category="launcher_env", severity="error", title="SM_* variables disagree with resourceconfig.json",
       severities=("warning",))
def sm_variables_match_config(ctx: RankContext) -> Iterator[Problem]:
    """
    What: SM_HOSTS holds other hosts than resourceconfig.json's hosts, or SM_CURRENT_HOST differs
    from its current_host.
    Why: SageMaker derives the SM_* variables from resourceconfig.json; when they differ, a script
    reading the variables computes another world (size, master, node rank) than the launcher uses.
    Under mpirun every rank sees the master's SM_CURRENT_HOST (sagemaker-training-toolkit#158).
    Fix: Read this host from /opt/ml/input/config/resourceconfig.json (current_host) rather than
    SM_CURRENT_HOST, and do not override SM_HOSTS.
    Severity: error when the host lists differ; a warning when only SM_CURRENT_HOST differs under
    mpirun, which every rank inherits from the master (a known toolkit quirk; the file's value is
    used).
    """
    sm = ctx.sagemaker
    if sm is None:
        return
    rc_hosts, rc_host = sm.rc_hosts, sm.rc_current_host
    # Order is DDP204's business; here only the membership.
    if sm.hosts is not None and rc_hosts is not None and sorted(sm.hosts) != sorted(rc_hosts):
        differ = ""
        if max(len(sm.hosts), len(rc_hosts)) > HOSTS_SHOWN:  # long lists: where they differ, not only how they start
            only_sm, only_rc = sorted(set(sm.hosts) - set(rc_hosts)), sorted(set(rc_hosts) - set(sm.hosts))
            differ = "".join([f"; only in SM_HOSTS: {hosts_text(only_sm)}" if only_sm else "",
                              f"; only in resourceconfig.json: {hosts_text(only_rc)}" if only_rc else ""])
        yield Problem(message=f"SM_HOSTS={hosts_text(sm.hosts)} but resourceconfig.json hosts are "
                              f"{hosts_text(rc_hosts)}{differ}",
                      evidence=host_evidence({"SM_HOSTS": sm.hosts, "resourceconfig_hosts": rc_hosts}))
    if sm.current_host is not None and rc_host is not None and sm.current_host != rc_host:
        if ctx.launcher.name == "mpirun":
            yield Problem(
                message=f"SM_CURRENT_HOST={sm.current_host!r} but resourceconfig.json current_host={rc_host!r}: "
                        "under mpirun every rank sees the master's SM_CURRENT_HOST "
                        "(sagemaker-training-toolkit#158); ddp-doctor uses the file's value",
                severity="warning",
                evidence={"SM_CURRENT_HOST": sm.current_host, "resourceconfig_current_host": rc_host})
        else:
            yield Problem(
                message=f"SM_CURRENT_HOST={sm.current_host!r} but resourceconfig.json current_host={rc_host!r}",
                evidence={"SM_CURRENT_HOST": sm.current_host, "resourceconfig_current_host": rc_host})


@check("DDP204", category="topology", severity="error", title="Host list has duplicates or is unsorted",
       severities=("warning",))
def hosts_unique_sorted(ctx: RankContext) -> Iterator[Problem]:
    """
    What: resourceconfig.json's hosts (or SM_HOSTS, without the file) name a host twice, or are not
    in the lexicographic order SageMaker writes (algo-10 before algo-2).
    Why: A host listed twice counts twice in the world size, so the job waits for ranks that never
    come; a list in another order than SageMaker's means the file was written by hand and may not
    describe the cluster the job runs on.
    Fix: Do not edit resourceconfig.json or SM_HOSTS; in a local emulation write hosts once each,
    sorted as strings.
    Severity: error when a host is listed twice; a warning when the hosts are only unsorted.
    """
    sm = ctx.sagemaker
    if sm is None:
        return
    source, hosts = ("resourceconfig.json hosts", sm.rc_hosts) if sm.rc_hosts is not None else ("SM_HOSTS", sm.hosts)
    if not hosts:
        return
    dupes = sorted(h for h, n in Counter(hosts).items() if n > 1)
    if dupes:
        more = len(dupes) - HOSTS_SHOWN
        shown = ", ".join(dupes[:HOSTS_SHOWN]) + (f" (+{more} more)" if more > 0 else "")
        yield Problem(message=f"{source} {hosts_text(hosts)} name {shown} more than once",
                      evidence={"source": source, **host_evidence({"hosts": hosts, "duplicates": dupes})})
    elif hosts != sorted(hosts):
        yield Problem(message=f"{source} {hosts_text(hosts)} are not sorted; SageMaker writes "
                              f"{hosts_text(sorted(hosts))}",
                      severity="warning", evidence={"source": source, **host_evidence({"hosts": hosts})})


@check("DDP205", category="topology", severity="error", title="Instance groups do not match the hosts")
def instance_groups_consistent(ctx: RankContext) -> Iterator[Problem]:
    """
    What: An instance group in resourceconfig.json lists a host that is not in its hosts, or
    SM_DISTRIBUTION_INSTANCE_GROUPS names a group that does not exist.
    Why: The toolkit takes the distribution hosts, and so the master and the node ranks, from the
    instance groups; a host outside the cluster is never reached and the job hangs at rendezvous.
    Fix: Do not edit resourceconfig.json; in the estimator, name in `instance_groups` and
    `distribution={..., "instance_groups": [...]}` only groups that exist.
    """
    sm = ctx.sagemaker
    if sm is None or sm.resource_config is None:
        return
    groups = sm.resource_config.get("instance_groups")
    hosts = sm.rc_hosts
    if not isinstance(groups, list):
        return  # shape problems are DDP201's
    names = []
    known = set(hosts or ())
    for g in groups:
        if not isinstance(g, dict):
            continue
        names.append(g.get("instance_group_name"))
        gh = g.get("hosts")
        if hosts is None or not isinstance(gh, list):
            continue
        extra = [h for h in gh if not isinstance(h, str) or h not in known]
        if extra:
            yield Problem(
                message=f"instance group {_clip(repr(g.get('instance_group_name')))} lists {hosts_text(extra)}, "
                        f"not in hosts {hosts_text(hosts)}",
                evidence={"group": g.get("instance_group_name"), **host_evidence({"extra": extra, "hosts": hosts})})
    if sm.is_hetero and sm.distribution_groups:
        missing = [n for n in sm.distribution_groups if n not in names]
        if missing:
            yield Problem(
                message=f"SM_DISTRIBUTION_INSTANCE_GROUPS names {missing}, but the instance groups are {names}",
                evidence={"distribution_groups": sm.distribution_groups, "groups": names})


@check("DDP206", category="topology", severity="info", title="Master is not the first host by name")
def master_not_first_sorted(ctx: RankContext) -> Iterator[Problem]:
    """
    What: resourceconfig.json's instance_groups list the hosts in another order than their names
    sort; that order, not the names, decides the master and the node ranks.
    Why: The toolkit makes distribution_hosts[0] the master and gives each host its index as node
    rank; code that assumes algo-1 is the master, or derives ranks from SM_HOSTS or the algo-N
    suffix, points ranks at the wrong host and hangs at rendezvous.
    Fix: Take the master from `json.loads(os.environ["SM_TRAINING_ENV"])["master_hostname"]` (or
    MASTER_ADDR under torchrun) and the node rank from GROUP_RANK; never assume algo-1.
    """
    sm = ctx.sagemaker
    if sm is None or not multi_host(sm):
        return
    dh = dist_hosts(sm)
    if dh == sorted(dh):
        return
    here = sm.this_host
    where = f"; this host {here} is node {dh.index(here)}" if here in dh else ""
    yield Problem(
        message=f"instance_groups list the hosts as {hosts_text(dh)}: the master is {dh[0]} (not {min(dh)}) and "
                f"node ranks follow this order{where}",
        evidence={**host_evidence({"distribution_hosts": dh}), "master": dh[0], "this_host": here})


@check("DDP214", category="topology", severity="info", title="Host outside the distribution instance groups")
def host_outside_distribution(ctx: RankContext) -> Iterator[Problem]:
    """
    What: In a heterogeneous cluster (SM_IS_HETERO), this host belongs to no instance group named
    in the distribution, so it takes no part in the distributed training.
    Why: Only the distribution groups' hosts get ranks; work placed here (e.g. data preprocessing)
    runs outside the process group.
    Fix: Nothing if intended; otherwise add this host's group to the distribution's
    `instance_groups` in the estimator.
    """
    sm = ctx.sagemaker
    if sm is None or takes_part(sm):
        return
    yield Problem(message=f"this host {sm.this_host} is not in the distribution hosts {hosts_text(dist_hosts(sm))} "
                          f"(SM_DISTRIBUTION_INSTANCE_GROUPS={hosts_text(sm.distribution_groups)})",
                  evidence={"this_host": sm.this_host, **host_evidence({"distribution_hosts": dist_hosts(sm),
                                                                       "distribution_groups": sm.distribution_groups})})
