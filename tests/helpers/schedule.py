"""How the suite is spread over pytest-xdist's workers (`--dist loadgroup`, the README's command).

Each test module is one group: its module-scoped launches are shared by its tests, so it runs on
one worker. The modules that read a shared scenario of helpers/launches.py are one group with each
other, so one worker launches it once (with `--dist loadfile` a scenario two workers needed was
launched twice). xdist hands the groups out as it does files, most tests first.
"""
from __future__ import annotations

import pytest

from helpers.launches import SCENARIOS


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


def mark_groups(items: list[pytest.Item]) -> None:
    """Mark each item with its group (its module, or the shared scenario's readers)."""
    shared = shared_groups()
    for item in items:
        module = module_of(item.nodeid)
        item.add_marker(pytest.mark.xdist_group(shared.get(module, module)))
