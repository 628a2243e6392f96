"""The check catalogue: stable IDs, documentation sections, selection, plugin modules."""
from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from ddp_doctor import registry, runner
from ddp_doctor.context import build_context
from ddp_doctor.facts.host import HostFacts
from ddp_doctor.findings import CATEGORIES, SEVERITIES, Problem


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, registry.Check]]:
    """A copy of the full catalogue that tests may add to; the real one is restored afterwards."""
    registry.load_catalogue()  # import every module first, so its entries land in the real registry
    scratch = dict(registry.REGISTRY)
    monkeypatch.setattr(registry, "REGISTRY", scratch)
    monkeypatch.setattr(registry, "LOAD_ERRORS", {})
    monkeypatch.setattr(registry, "RETIRED", dict(registry.RETIRED))
    yield scratch


def free_id(reg: dict[str, registry.Check]) -> str:
    for n in range(999, 899, -1):
        cid = f"DDP{n}"
        if cid not in reg and cid not in registry.RETIRED:
            return cid
    raise AssertionError("no free test ID in DDP900-DDP999")


DOC = """
    What: a test check.
    Why: tests.
    Fix: nothing.
    """


# ---------------------------------------------------------------- the catalogue itself

def test_every_entry_is_well_formed() -> None:
    cat = registry.load_catalogue()
    assert len(cat) >= 10
    for cid, entry in cat.items():
        assert cid == entry.id
        assert re.fullmatch(r"DDP\d{3}", cid), cid
        assert entry.category in CATEGORIES, cid
        assert entry.severity in SEVERITIES, cid
        assert entry.stage in registry.STAGES, cid
        assert entry.title.strip(), cid
        sections = entry.sections
        for name in ("What", "Why", "Fix"):
            assert sections.get(name, "").strip(), f"{cid} has an empty {name} section"
        assert entry.hint == sections["Fix"]
        if entry.stage == "event":
            assert entry.func is None
        else:
            assert callable(entry.func) and entry.timeout > 0, cid


def test_ids_unique_and_not_retired() -> None:
    cat = registry.load_catalogue()
    ids = [c.id for c in cat.values()]
    assert len(ids) == len(set(ids))
    assert not set(ids) & set(registry.RETIRED)
    for rid in registry.RETIRED:
        assert re.fullmatch(r"DDP\d{3}", rid)


def test_machinery_events_are_catalogued() -> None:
    cat = registry.load_catalogue()
    for cid in ("DDP001", "DDP002", "DDP003", "DDP310", "DDP311", "DDP312", "DDP313", "DDP320", "DDP322"):
        assert cid in cat
        assert cat[cid].stage == "event"
    assert cat["DDP001"].category == "internal"


def test_to_dict_has_sections() -> None:
    d = registry.get("DDP320").to_dict()
    assert d["id"] == "DDP320" and d["stage"] == "event"
    assert set(d) >= {"id", "category", "severity", "title", "stage", "what", "why", "fix"}


def test_parse_sections_multiline() -> None:
    s = registry.parse_sections("""
        What: first line
          continues here.
        Why: because.
        Fix:
          do this
          and that.
        """)
    assert s == {"What": "first line continues here.", "Why": "because.", "Fix": "do this and that."}


# ---------------------------------------------------------------- registration rules

def test_duplicate_id_raises(scratch_registry: dict[str, registry.Check]) -> None:
    taken = next(iter(sorted(scratch_registry)))
    with pytest.raises(ValueError, match="already taken"):
        registry.check(taken, category="host", severity="error", title="dup")(lambda ctx: iter(()))
    with pytest.raises(ValueError, match="already taken"):
        registry.declare(taken, category="host", severity="error", title="dup", doc=DOC)


def test_retired_id_cannot_be_registered(scratch_registry: dict[str, registry.Check]) -> None:
    cid = free_id(scratch_registry)
    registry.RETIRED[cid] = "retired for a test"
    with pytest.raises(ValueError, match="never reused"):
        registry.declare(cid, category="host", severity="error", title="t", doc=DOC)
    assert cid not in registry.REGISTRY


@pytest.mark.parametrize("kwargs,match", [
    ({"id": "DDP12"}, "DDPnnn"),
    ({"id": "ddp123"}, "DDPnnn"),
    ({"id": "DDP1234"}, "DDPnnn"),
    ({"category": "weather"}, "category"),
    ({"severity": "fatal"}, "severity"),
])
def test_invalid_entries_raise(scratch_registry: dict[str, registry.Check], kwargs: dict[str, str],
                               match: str) -> None:
    args = {"id": free_id(scratch_registry), "category": "host", "severity": "error", "title": "t", **kwargs}
    before = dict(scratch_registry)
    with pytest.raises(ValueError, match=match):
        registry.declare(args.pop("id"), doc=DOC, **args)
    assert scratch_registry == before


def test_unknown_stage_raises(scratch_registry: dict[str, registry.Check]) -> None:
    with pytest.raises(ValueError, match="stage"):
        registry.check(free_id(scratch_registry), category="host", severity="error", title="t",
                       stage="later")(lambda ctx: iter(()))


def test_check_decorator_keeps_function_and_doc(scratch_registry: dict[str, registry.Check]) -> None:
    cid = free_id(scratch_registry)

    def my_check(ctx: object) -> Iterator[Problem]:
        """
        What: looks at something.
        Why: it matters.
        Fix: change it.
        """
        yield Problem("x")

    assert registry.check(cid, category="gpu", severity="warning", title="mine", timeout=3.0)(my_check) is my_check
    entry = scratch_registry[cid]
    assert entry.func is my_check and entry.stage == "local" and entry.timeout == 3.0
    assert entry.hint == "change it."


# ---------------------------------------------------------------- selection

def test_parse_selectors() -> None:
    assert registry.parse_selectors(["DDP101,network"]) == ["DDP101", "network"]
    assert registry.parse_selectors(["DDP101, network ,", "DDP2"]) == ["DDP101", "network", "DDP2"]
    assert registry.parse_selectors(None) == []
    assert registry.parse_selectors([""]) == []


def test_selected_by_exact_id_prefix_and_category() -> None:
    cat = registry.load_catalogue()
    entry = cat["DDP310"]
    assert entry.category == "network"
    assert registry.selected(entry, ["DDP310"], [])
    assert registry.selected(entry, ["DDP3"], [])
    assert registry.selected(entry, ["ddp31"], [])
    assert registry.selected(entry, ["network"], [])
    assert not registry.selected(entry, ["DDP1"], [])
    assert not registry.selected(entry, ["gpu"], [])
    assert registry.selected(entry, [], [])
    # skip wins over select
    assert not registry.selected(entry, ["network"], ["DDP310"])
    assert not registry.selected(entry, [], ["DDP3"])


def test_checks_for_respects_selection() -> None:
    local = registry.checks_for("local")
    assert local and all(c.stage == "local" for c in local)
    assert [c.id for c in local] == sorted(c.id for c in local)
    only = registry.checks_for("local", ["DDP1"])
    assert only and all(c.id.startswith("DDP1") for c in only)
    by_cat = registry.checks_for("local", ["launcher_env"])
    assert by_cat and all(c.category == "launcher_env" for c in by_cat)
    skipped = registry.checks_for("local", None, ["DDP1"])
    assert not any(c.id.startswith("DDP1") for c in skipped)
    assert len(skipped) + len(only) == len(local)


def test_unknown_selectors() -> None:
    assert registry.unknown_selectors(["DDP101", "network", "DDP3", "ddp1", "internal"]) == []
    # "DDP0999" can never prefix a DDPnnn ID, whatever test plugins were loaded in this process
    assert registry.unknown_selectors(["nonsense", "DDP101", "DDP0999"]) == ["nonsense", "DDP0999"]


# ---------------------------------------------------------------- plugin modules

def _ctx() -> object:
    facts = HostFacts(hostname="h", interfaces=("lo",), visible_gpus=0, physical_gpus=None, backends=("gloo",))
    return build_context({"RANK": "0", "WORLD_SIZE": "1"}, facts, sm_root="/nonexistent/ddp-doctor-tests")


def test_broken_plugin_module_becomes_ddp001(scratch_registry: dict[str, registry.Check], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    name = "ddp_doctor_test_broken_plugin_mod"
    (tmp_path / f"{name}.py").write_text("raise ImportError('needs the frobnicator package')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry.EXTRA_MODULES_ENV, f" {name} , ddp_doctor_test_no_such_module_xyz")
    registry.load_catalogue()
    assert "needs the frobnicator package" in registry.LOAD_ERRORS[name]
    assert registry.LOAD_ERRORS["ddp_doctor_test_no_such_module_xyz"].startswith("ModuleNotFoundError")
    # select only an event so that no real local check runs: the load errors are reported anyway
    findings = runner.run_stage("local", (_ctx(),), 0, select=["DDP001"])
    ids = [f.id for f in findings]
    assert ids == ["DDP001", "DDP001"]
    broken = next(f for f in findings if f.evidence["module"] == name)
    assert "frobnicator" in broken.message and registry.EXTRA_MODULES_ENV in broken.message
    assert broken.ranks == [0] and broken.category == "internal" and broken.severity == "error"
    # only the local stage reports them
    assert runner.run_stage("group", (_ctx(), None), 0, select=["DDP001"]) == []


def test_working_plugin_module_registers_checks(scratch_registry: dict[str, registry.Check], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    cid = free_id(scratch_registry)
    name = "ddp_doctor_test_good_plugin_mod"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f'''
        from ddp_doctor.findings import Problem
        from ddp_doctor.registry import check

        @check("{cid}", category="host", severity="warning", title="plugin check", timeout=2.0)
        def plugin_check(ctx):
            """
            What: a plugin.
            Why: teams add their own.
            Fix: plugin fix.
            """
            yield Problem("plugin saw rank %s" % ctx.rank)
        '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry.EXTRA_MODULES_ENV, name)
    monkeypatch.delitem(sys.modules, name, raising=False)
    try:
        registry.load_catalogue()
        assert cid in scratch_registry and registry.LOAD_ERRORS == {}
        findings = runner.run_stage("local", (_ctx(),), 0, select=[cid])
        assert [(f.id, f.message, f.hint, f.severity) for f in findings] == [
            (cid, "plugin saw rank 0", "plugin fix.", "warning")]
    finally:
        sys.modules.pop(name, None)
