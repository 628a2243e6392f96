"""How the suite is spread over pytest-xdist's workers (`--dist loadgroup`, the README's command).

Each test module is one group: its module-scoped launches are shared by its tests, so it runs on
one worker. The modules that read a shared scenario of helpers/launches.py are one group with each
other, so one worker launches it once. Groups are handed out heaviest first, by the seconds each
module took in a whole run (tests/durations.json): a long module started last would leave the other
worker idle while it runs alone (longest-first scheduling). xdist's own reorder, by number of
tests, is turned off in pyproject.toml's addopts. A module the file does not know is given
NEW_MODULE seconds; `--record-durations tests/durations.json` writes the file again from a run.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from helpers.launches import SCENARIOS

TESTS = Path(__file__).resolve().parents[1]
DURATIONS = TESTS / "durations.json"
NEW_MODULE = 10.0  # seconds: about the median e2e module, so a new one is neither first nor last


def module_of(nodeid: str) -> str:
    """The module's path under tests/ ("training/test_run_e2e.py") of a test id."""
    path = nodeid.split("::", 1)[0]
    return path[len("tests/"):] if path.startswith("tests/") else path


def shared_groups() -> dict[str, str]:
    """module -> its group, for the modules that read a shared scenario (joined transitively)."""
    group: dict[str, str] = {}
    for scenario in SCENARIOS.values():
        names = {group.get(m, m) for m in scenario.readers}
        name = min(names)
        for m, g in list(group.items()):
            if g in names:
                group[m] = name
        for m in scenario.readers:
            group[m] = name
    return group


def arrange(items: list[pytest.Item], durations: dict[str, float] | None = None) -> None:
    """Mark each item with its group and put the groups in order, heaviest first; within a group
    the collection's order stays."""
    if durations is None:
        durations = read_durations()
    shared = shared_groups()
    weight: dict[str, float] = defaultdict(float)
    first: dict[str, int] = {}
    seen: set[str] = set()
    groups = []
    for i, item in enumerate(items):
        module = module_of(item.nodeid)
        group = shared.get(module, module)
        item.add_marker(pytest.mark.xdist_group(group))
        groups.append(group)
        first.setdefault(group, i)
        if module not in seen:
            seen.add(module)
            weight[group] += durations.get(module, NEW_MODULE)
    order = sorted(range(len(items)), key=lambda i: (-weight[groups[i]], first[groups[i]], i))
    items[:] = [items[i] for i in order]


def read_durations() -> dict[str, float]:
    try:
        with open(DURATIONS, encoding="utf-8") as f:
            data = json.load(f)
        return {str(k): float(v) for k, v in data.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


class DurationRecorder:
    """`--record-durations PATH`: each module's seconds (setup, call and teardown of its tests),
    written when the session ends, in the process that sees every test's report (xdist's controller)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: Any) -> None:
        self.seconds[module_of(report.nodeid)] += float(report.duration or 0.0)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput") or not self.seconds:
            return  # a worker: the controller writes
        data = {m: round(s, 1) for m, s in sorted(self.seconds.items())}
        Path(self.path).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
