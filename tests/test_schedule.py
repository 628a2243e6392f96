"""The suite's spread over xdist's workers (tests/helpers/schedule.py): a group per module, the
readers of a shared launch in one group, the heaviest groups first, the collection's order kept
within a group."""
from __future__ import annotations

from helpers import schedule
from helpers.launches import SCENARIOS


class Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid
        self.groups: list[str] = []

    def add_marker(self, mark: object) -> None:
        self.groups.append(mark.args[0])  # type: ignore[attr-defined]


def test_groups_go_heaviest_first_and_keep_their_tests_in_order() -> None:
    items = [Item(f"tests/{m}::t{i}") for m in ("a/test_light.py", "b/test_heavy.py", "c/test_new.py")
             for i in range(2)]
    schedule.arrange(items, {"a/test_light.py": 1.0, "b/test_heavy.py": 50.0})  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == ["tests/b/test_heavy.py::t0", "tests/b/test_heavy.py::t1",
                                         "tests/c/test_new.py::t0", "tests/c/test_new.py::t1",
                                         "tests/a/test_light.py::t0", "tests/a/test_light.py::t1"]
    assert all(i.groups == [schedule.module_of(i.nodeid)] for i in items)


def test_the_readers_of_a_shared_launch_are_one_group_weighed_together() -> None:
    for scenario in SCENARIOS.values():
        a, b = scenario.readers[:2]
        items = [Item(f"tests/{a}::t"), Item("tests/z/test_mid.py::t"), Item(f"tests/{b}::t")]
        schedule.arrange(items, {a: 6.0, b: 6.0, "z/test_mid.py": 10.0})  # type: ignore[arg-type]
        assert [schedule.module_of(i.nodeid) for i in items] == [a, b, "z/test_mid.py"]  # 12 s against 10
        assert items[0].groups == items[1].groups != items[2].groups


def test_the_recorded_durations_name_modules_that_exist() -> None:
    known = schedule.read_durations()
    assert known, f"{schedule.DURATIONS} is missing or unreadable"
    gone = sorted(m for m in known if not (schedule.TESTS / m).is_file())
    assert not gone, f"{schedule.DURATIONS} names modules that are gone: {gone} (--record-durations writes it anew)"
