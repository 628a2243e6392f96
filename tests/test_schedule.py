"""The suite's spread over xdist's workers (tests/helpers/schedule.py): a group per module, the
readers of a shared launch in one group."""
from __future__ import annotations

from pathlib import Path

from helpers import schedule
from helpers.launches import SCENARIOS


class Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid
        self.groups: list[str] = []

    def add_marker(self, mark: object) -> None:
        self.groups.append(mark.args[0])  # type: ignore[attr-defined]


def test_each_module_is_a_group_and_the_readers_of_a_shared_launch_are_one() -> None:
    for scenario in SCENARIOS.values():
        a, b = scenario.readers[:2]
        items = [Item(f"tests/{a}::t"), Item("tests/z/test_other.py::t"), Item(f"tests/{b}::t"), Item(f"tests/{a}::u")]
        schedule.mark_groups(items)  # type: ignore[arg-type]
        assert items[0].groups == items[2].groups == items[3].groups != items[1].groups
        assert items[1].groups == ["z/test_other.py"]


def test_every_reader_of_a_shared_launch_exists() -> None:
    tests = Path(__file__).resolve().parent
    gone = sorted(m for s in SCENARIOS.values() for m in s.readers if not (tests / m).is_file())
    assert not gone, f"helpers/launches.py names readers that are gone: {gone}"
