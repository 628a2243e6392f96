"""The planned SageMaker job as the user describes it: JobSpec and how it is read.

What is inside: JobSpec (estimator settings from a dict, a JSON/YAML file or CLI flags, coerced
to their types), SpecError (a spec that cannot be used: exit code 2), load_spec_file, the
distribution names the SDK knows (KNOWN_DISTRIBUTIONS, distribution_name) and
processes_per_instance. No AWS here: see ddp_doctor.sagemaker.aws.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from ddp_doctor.facts.env_values import MAX_JSON_DEPTH, bounded_json, read_text_file
from ddp_doctor.facts.instances import lookup_sagemaker


class SpecError(ValueError):
    """The job description itself cannot be used (a usage error: exit code 2)."""


@dataclass(frozen=True)
class JobSpec:
    """What `estimator.fit()` would be asked to run. Field names follow the SageMaker SDK's
    estimator arguments (security_group_ids, subnets, entry_point, ...)."""

    instance_type: str | None = None
    instance_count: int = 1
    distribution: dict[str, Any] | None = None
    framework_version: str | None = None
    py_version: str | None = None
    entry_point: str | None = None
    role: str | None = None
    subnets: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()          # S3 URIs (a fit() channel dict is accepted too)
    output_path: str | None = None
    region: str | None = None
    profile: str | None = None
    per_device_batch_size: int | None = None
    learning_rate: float | None = None    # the single-device learning rate, for the scaling note

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobSpec":
        if not isinstance(data, Mapping):
            raise SpecError(f"a job spec is a mapping of estimator settings, not {type(data).__name__}")
        names = {f.name for f in fields(cls)}
        aliases = {"input": "inputs", "security_groups": "security_group_ids", "distribution_config": "distribution"}
        values: dict[str, Any] = {}
        unknown = []
        for key, value in data.items():
            name = aliases.get(str(key), str(key)).replace("-", "_")
            if name not in names:
                unknown.append(str(key))
                continue
            values[name] = value
        if unknown:
            raise SpecError(f"unknown job setting(s): {', '.join(sorted(unknown))}; "
                            f"known: {', '.join(sorted(names))}")
        return cls(**_coerce(values))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in fields(self) if f.name != "profile"}

    def merged(self, overrides: Mapping[str, Any]) -> "JobSpec":
        """This spec with the given (non-None) settings replacing its own (CLI flags over --config)."""
        base = self.to_dict()
        base["profile"] = self.profile
        base.update({k: v for k, v in overrides.items() if v is not None})
        return JobSpec.from_dict(base)

    @property
    def distribution_name(self) -> str:
        """smdistributed | pytorchddp | torch_distributed | mpi | none | invalid (see DDP902)."""
        return distribution_name(self.distribution)

    @property
    def efa(self) -> bool:
        row = lookup_sagemaker(self.instance_type)
        return row is not None and row.efa

    @property
    def gpus_per_instance(self) -> int | None:
        """From the instance table only (JobContext.gpus_per_instance also asks EC2)."""
        row = lookup_sagemaker(self.instance_type)
        return row.gpus if row is not None else None


def _as_list(name: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(p.strip() for p in value.split(",") if p.strip())
    if isinstance(value, Mapping):  # fit(inputs={"train": "s3://..."}) or channel -> TrainingInput dict
        out = []
        for v in value.values():
            uri = v.get("s3_data") or v.get("S3Uri") if isinstance(v, Mapping) else v
            out.extend(_as_list(name, uri))
        return tuple(out)
    if isinstance(value, (list, tuple)):
        out = []
        for v in value:
            out.extend(_as_list(name, v))
        return tuple(out)
    raise SpecError(f"{name} must be a string or a list of strings, not {value!r}")


def _coerce(values: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    for name in ("subnets", "security_group_ids", "inputs"):
        if name in out:
            out[name] = _as_list(name, out[name])
    if "distribution" in out and isinstance(out["distribution"], str):
        try:  # bounded: --distribution is text a user typed, any size and depth
            out["distribution"] = bounded_json(out["distribution"]) if out["distribution"].strip() else None
        except ValueError as e:
            raise SpecError(f"distribution is {e}") from None
    for name in ("instance_count", "per_device_batch_size"):
        if out.get(name) is not None:
            try:
                out[name] = int(out[name])
            except (TypeError, ValueError):
                raise SpecError(f"{name} must be a whole number, not {out[name]!r}") from None
    if out.get("learning_rate") is not None:
        try:
            out["learning_rate"] = float(out["learning_rate"])
        except (TypeError, ValueError):
            raise SpecError(f"learning_rate must be a number, not {out['learning_rate']!r}") from None
    for name in ("instance_type", "framework_version", "py_version", "entry_point", "role",
                 "output_path", "region", "profile"):
        if out.get(name) is not None and not isinstance(out[name], str):
            out[name] = str(out[name])
    return out


KNOWN_DISTRIBUTIONS = ("smdistributed", "pytorchddp", "torch_distributed", "mpi")
# Keys the SDK accepts beside the distribution itself.
DISTRIBUTION_EXTRAS = ("instance_groups",)


def _enabled(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("enabled") is True


def distribution_name(dist: Any) -> str:
    if not dist:
        return "none"
    if not isinstance(dist, Mapping):
        return "invalid"
    on = [k for k in KNOWN_DISTRIBUTIONS
          if (k == "smdistributed" and _enabled((dist.get(k) or {}).get("dataparallel")
                                                if isinstance(dist.get(k), Mapping) else None))
          or (k != "smdistributed" and _enabled(dist.get(k)))]
    if len(on) == 1:
        return on[0]
    return "none" if not on and not any(k not in DISTRIBUTION_EXTRAS for k in dist) else "invalid"


def load_spec_file(path: str) -> JobSpec:
    """A JobSpec from a JSON or YAML file (YAML needs PyYAML), in UTF-8 (with or without a BOM) or
    UTF-16/UTF-32 with a BOM (what Windows PowerShell writes), no larger than MAX_JSON_BYTES and
    nested no deeper than MAX_JSON_DEPTH. SpecError, one line naming the file, for anything else."""
    try:
        text = read_text_file(path)
    except OSError as e:
        raise SpecError(f"cannot read --config {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise SpecError(f"cannot read --config {path}: it is {e}") from None
    if path.lower().endswith((".yaml", ".yml")):
        try:
            import yaml  # type: ignore[import-untyped]
        except ImportError:
            raise SpecError(f"--config {path} is YAML, which needs PyYAML (`pip install pyyaml`); "
                            f"or write the same settings as JSON") from None
        try:
            bad = yaml_problem(yaml, text)
            if bad:
                raise SpecError(f"--config {path} cannot be read: it is {bad}")
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise SpecError(f"--config {path} is not valid YAML: {' '.join(str(e).split())}") from None
    else:
        try:
            data = bounded_json(text)
        except ValueError as e:
            raise SpecError(f"--config {path} is {e}") from None
    try:
        return JobSpec.from_dict(data or {})
    except SpecError as e:
        raise SpecError(f"--config {path}: {e}") from None


MAX_YAML_VALUES = 100_000  # values a YAML file may stand for once its aliases are expanded


def yaml_problem(yaml: Any, text: str, max_depth: int = MAX_JSON_DEPTH,
                 max_values: int = MAX_YAML_VALUES) -> str | None:
    """What makes YAML text unsafe to load, read from PyYAML's event stream (its parser keeps a
    stack, it does not recurse, unlike the composer that safe_load runs): nesting deeper than
    `max_depth`, an alias inside the collection it names (a structure that holds itself), or
    aliases that expand to more than `max_values` values (a "billion laughs"). None when it is fine;
    yaml.YAMLError for text that is no YAML."""
    sizes: dict[str, int] = {}
    open_: list[list[Any]] = []  # [anchor, values so far] of each collection being read
    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            open_.append([ev.anchor, 1])
            if len(open_) > max_depth:
                return f"nested more than {max_depth} levels deep"
            continue
        if isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, n = open_.pop()
            if anchor:
                sizes[anchor] = n
        elif isinstance(ev, yaml.AliasEvent):
            if any(a == ev.anchor for a, _ in open_):
                return f"a structure that holds itself (the alias *{ev.anchor} is inside &{ev.anchor})"
            n = sizes.get(ev.anchor, 1)
        elif isinstance(ev, yaml.ScalarEvent):
            n = 1
        else:
            continue
        if open_:
            open_[-1][1] += n
            if open_[-1][1] > max_values:
                return f"more than {max_values} values once its aliases are expanded"
    return None


def processes_per_instance(spec: JobSpec, gpus: int | None) -> int | None:
    dist = spec.distribution or {}
    mpi = dist.get("mpi") if isinstance(dist, Mapping) else None
    if spec.distribution_name == "mpi" and isinstance(mpi, Mapping) and isinstance(mpi.get("processes_per_host"), int):
        return int(mpi["processes_per_host"])
    if spec.distribution_name == "none":
        return 1
    return gpus if gpus else (1 if gpus == 0 else None)
