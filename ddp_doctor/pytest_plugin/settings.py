"""The plugin's settings: one Setting per knob (option dest, environment variable, ini name,
validator, default), the help texts the command-line option and the ini setting share, and their
resolution: command line, then environment, then ini file (the marker's own arguments come last,
in marker.py). An invalid value is a usage error naming where it came from.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pytest

DEFAULT_WORLD_SIZE = 2
DEFAULT_TIMEOUT = 120.0
DEFAULT_PREFLIGHT_TIMEOUT = 20.0
ON_FAILURE = ("skip", "deselect", "run")

# Help strings, shared by the command-line option and the ini setting.
DDP_DOCTOR_DESC = (
    "session preflight of the runner before the tests: true, false or auto (default: auto, i.e. "
    "when distributed tests are collected). Env DDP_DOCTOR_PYTEST.")
EXPECT_GPUS_DESC = (
    "the GPUs this runner should have; fewer is a preflight failure (DDP590). "
    "Env DDP_DOCTOR_EXPECT_GPUS.")
ON_FAILURE_DESC = (
    "what happens to distributed tests when the preflight fails: skip (default), deselect, or run. "
    "Env DDP_DOCTOR_PREFLIGHT_FAILURE.")
TIMEOUT_DESC = (
    "hard timeout in seconds for every distributed test, over the marker's timeout= "
    f"(default: the marker's, else {DEFAULT_TIMEOUT:g}). Env DDP_DOCTOR_TEST_TIMEOUT.")
PREFLIGHT_TIMEOUT_DESC = (
    "bound in seconds for each wait of the session preflight "
    f"(default {DEFAULT_PREFLIGHT_TIMEOUT:g}). Env DDP_DOCTOR_PREFLIGHT_TIMEOUT.")
REPORT_DESC = (
    "where the session preflight writes its JSON report (default: ddp-doctor-report.json in the "
    "current directory). Env DDP_DOCTOR_REPORT.")
PREFLIGHT_ARGS_DESC = (
    "more options for `ddp-doctor preflight` in the session preflight, as one shell-quoted string "
    "(e.g. \"--skip DDP405 --comm-max-bytes 16M\"). Env DDP_DOCTOR_PREFLIGHT_ARGS.")


@dataclass(frozen=True)
class Setting:
    dest: str
    env: str
    ini: str
    parse: Callable[[str], Any]
    default: Any


# ---------------------------------------------------------------- validators: text -> value, or ValueError
def _bool_or_auto(text: str) -> str:
    t = str(text).strip().lower()
    if t in ("1", "true", "yes", "on"):
        return "true"
    if t in ("0", "false", "no", "off"):
        return "false"
    if t == "auto":
        return "auto"
    raise ValueError("must be true, false or auto")


def _count(text: str) -> int:
    v = int(str(text).strip())
    if v < 0:
        raise ValueError("must be 0 or more")
    return v


def _seconds(text: str) -> float:
    """A bound in seconds, by ddp-doctor's one rule for it (time_limit.usable_timeout: finite, above
    0, at most one day); its reason without the value, which resolve() quotes with its source."""
    from ddp_doctor.time_limit import usable_timeout
    t = str(text).strip()
    try:
        return usable_timeout(t)
    except ValueError as e:
        said = str(e)
        raise ValueError(said[len(repr(t)) + 1:] if said.startswith(f"{t!r} ") else said) from None


def _shell_words(text: str) -> list[str]:
    import shlex
    return shlex.split(str(text))


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        t = str(text).strip().lower()
        if t not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return t
    return parse


SETTINGS = (
    Setting("ddp_doctor", "DDP_DOCTOR_PYTEST", "ddp_doctor", _bool_or_auto, "auto"),
    Setting("ddp_expect_gpus", "DDP_DOCTOR_EXPECT_GPUS", "ddp_expect_gpus", _count, None),
    Setting("ddp_preflight_failure", "DDP_DOCTOR_PREFLIGHT_FAILURE", "ddp_preflight_failure",
            _choice(ON_FAILURE), "skip"),
    Setting("ddp_timeout", "DDP_DOCTOR_TEST_TIMEOUT", "ddp_timeout", _seconds, None),
    Setting("ddp_preflight_timeout", "DDP_DOCTOR_PREFLIGHT_TIMEOUT", "ddp_preflight_timeout", _seconds,
            DEFAULT_PREFLIGHT_TIMEOUT),
    Setting("ddp_report", "DDP_DOCTOR_REPORT", "ddp_report", str, None),
    Setting("ddp_preflight_args", "DDP_DOCTOR_PREFLIGHT_ARGS", "ddp_preflight_args", _shell_words, []),
)


def add_options(parser: pytest.Parser) -> None:
    """Every setting as a command-line option and an ini setting, with the same help."""
    group = parser.getgroup("ddp-doctor", "ddp-doctor distributed tests and runner preflight")
    group.addoption("--ddp-doctor", dest="ddp_doctor", action="store_const", const="true", default=None,
                    help=DDP_DOCTOR_DESC)
    group.addoption("--no-ddp-doctor", dest="ddp_doctor", action="store_const", const="false",
                    help="never run the session preflight")
    group.addoption("--ddp-expect-gpus", dest="ddp_expect_gpus", metavar="N", default=None, help=EXPECT_GPUS_DESC)
    group.addoption("--ddp-preflight-failure", dest="ddp_preflight_failure", metavar="skip|deselect|run",
                    default=None, help=ON_FAILURE_DESC)
    group.addoption("--ddp-timeout", dest="ddp_timeout", metavar="S", default=None, help=TIMEOUT_DESC)
    group.addoption("--ddp-preflight-timeout", dest="ddp_preflight_timeout", metavar="S", default=None,
                    help=PREFLIGHT_TIMEOUT_DESC)
    group.addoption("--ddp-report", dest="ddp_report", metavar="PATH", default=None, help=REPORT_DESC)
    group.addoption("--ddp-preflight-args", dest="ddp_preflight_args", metavar="ARGS", default=None,
                    help=PREFLIGHT_ARGS_DESC)
    parser.addini("ddp_doctor", DDP_DOCTOR_DESC, default=None)
    parser.addini("ddp_expect_gpus", EXPECT_GPUS_DESC, default=None)
    parser.addini("ddp_preflight_failure", ON_FAILURE_DESC, default=None)
    parser.addini("ddp_timeout", TIMEOUT_DESC, default=None)
    parser.addini("ddp_preflight_timeout", PREFLIGHT_TIMEOUT_DESC, default=None)
    parser.addini("ddp_report", REPORT_DESC, default=None)
    parser.addini("ddp_preflight_args", PREFLIGHT_ARGS_DESC, default=None)


def resolve(config: pytest.Config, setting: Setting, env: Mapping[str, str] | None = None) -> tuple[Any, str]:
    """(value, where it came from): command line, then environment, then ini, then default.
    An invalid value is a usage error naming its source."""
    env = os.environ if env is None else env
    flag = "--" + setting.dest.replace("_", "-")
    candidates = [
        (config.getoption(setting.dest, None), f"command line {flag}"),
        (env.get(setting.env) or None, f"environment {setting.env}"),
        (config.getini(setting.ini) or None, f"ini {setting.ini} in {config.inipath or 'the ini file'}"),
    ]
    for raw, source in candidates:
        if raw is None:
            continue
        try:
            return setting.parse(raw), source
        except ValueError as e:
            raise pytest.UsageError(f"ddp-doctor: {source}={raw!r}: {_why(e)}") from None
    return setting.default, "default"


def _why(e: ValueError) -> str:
    text = str(e)
    # a validator's own reason ("must be ...", "is no bound; ..."); else Python's, e.g. int()'s
    return text if text.startswith(("must ", "is ")) else "is not a valid value (" + text + ")"


@dataclass
class Settings:
    preflight: str = "auto"
    expect_gpus: int | None = None
    on_failure: str = "skip"
    timeout: float | None = None
    timeout_source: str = "default"
    preflight_timeout: float = DEFAULT_PREFLIGHT_TIMEOUT
    report: str | None = None
    preflight_args: list[str] = field(default_factory=list)


def read_settings(config: pytest.Config) -> Settings:
    v = {s.dest: resolve(config, s) for s in SETTINGS}
    return Settings(preflight=v["ddp_doctor"][0], expect_gpus=v["ddp_expect_gpus"][0],
                    on_failure=v["ddp_preflight_failure"][0], timeout=v["ddp_timeout"][0],
                    timeout_source=v["ddp_timeout"][1], preflight_timeout=v["ddp_preflight_timeout"][0],
                    report=v["ddp_report"][0], preflight_args=v["ddp_preflight_args"][0])
