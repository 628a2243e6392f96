"""The runner: a check never takes the run down (DDP001 for a crash, DDP002 for a hang)."""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterator

import pytest

from ddp_doctor import check_runner, registry
from ddp_doctor import checks as catalogue
from ddp_doctor.context import RankContext, build_context
from ddp_doctor.facts.host import HostFacts
from ddp_doctor.findings import Problem

DOC = """
    What: a temporary test check.
    Why: tests the runner.
    Fix: default hint from the docstring.
    """


@pytest.fixture
def reg(monkeypatch: pytest.MonkeyPatch) -> dict[str, registry.Check]:
    catalogue.load_catalogue()
    scratch = dict(registry.REGISTRY)
    monkeypatch.setattr(registry, "REGISTRY", scratch)
    monkeypatch.setattr(registry, "LOAD_ERRORS", {})
    return scratch


@pytest.fixture
def ctx() -> RankContext:
    facts = HostFacts(hostname="h", interfaces=("lo",), visible_gpus=0, physical_gpus=None, backends=("gloo",))
    return build_context({"RANK": "2", "WORLD_SIZE": "4"}, facts, sm_root="/nonexistent/ddp-doctor-tests")


def add(reg: dict[str, registry.Check], func: Callable[..., Any], *, severity: str = "error",
        timeout: float = 2.0, stage: str = "local") -> str:
    cid = next(f"DDP{n}" for n in range(999, 899, -1) if f"DDP{n}" not in reg)
    func.__doc__ = DOC
    registry.check(cid, category="host", severity=severity, title=f"test {func.__name__}",
                   stage=stage, timeout=timeout)(func)
    return cid


def test_problem_becomes_finding(reg: dict[str, registry.Check], ctx: RankContext) -> None:
    def finds(c: RankContext) -> Iterator[Problem]:
        yield Problem(f"rank {c.rank} saw it", evidence={"x": 1})

    cid = add(reg, finds)
    [f] = check_runner.run_stage("local", (ctx,), ctx.rank, select=[cid])
    assert (f.id, f.category, f.severity, f.title) == (cid, "host", "error", "test finds")
    assert f.message == "rank 2 saw it" and f.hint == "default hint from the docstring."
    assert f.ranks == [2] and f.evidence == {"x": 1} and f.phase == "preflight"


def test_raising_check_becomes_ddp001_and_others_still_run(reg: dict[str, registry.Check], ctx: RankContext) -> None:
    def explodes(c: RankContext) -> Iterator[Problem]:
        raise ZeroDivisionError("boom in a check")
        yield  # pragma: no cover

    def fine(c: RankContext) -> Iterator[Problem]:
        yield Problem("still ran")

    bad = add(reg, explodes)
    good = add(reg, fine)
    findings = check_runner.run_stage("local", (ctx,), ctx.rank, select=[bad, good])
    by_id = {f.id: f for f in findings}
    crash = by_id["DDP001"]
    assert crash.category == "internal" and crash.severity == "error" and crash.ranks == [2]
    assert bad in crash.message and "ZeroDivisionError" in crash.message and "boom in a check" in crash.message
    assert crash.evidence["check"] == bad
    tb = crash.evidence["traceback"]
    assert "Traceback" in tb and "explodes" in tb and "ZeroDivisionError" in tb
    assert by_id[good].message == "still ran"


def test_check_returning_list_or_none(reg: dict[str, registry.Check], ctx: RankContext) -> None:
    def returns_list(c: RankContext) -> list[Problem | None]:
        return [Problem("a"), None, Problem("b")]

    def returns_none(c: RankContext) -> None:
        return None

    a = add(reg, returns_list)
    b = add(reg, returns_none)
    findings = check_runner.run_stage("local", (ctx,), ctx.rank, select=[a, b])
    assert [f.message for f in findings] == ["a", "b"]


def test_hanging_check_becomes_ddp002_within_its_timeout(reg: dict[str, registry.Check], ctx: RankContext) -> None:
    release = threading.Event()

    def hangs(c: RankContext) -> Iterator[Problem]:
        release.wait(30)
        yield Problem("too late")

    cid = add(reg, hangs, timeout=0.3)
    try:
        [f] = check_runner.run_stage("local", (ctx,), ctx.rank, select=[cid])
    finally:
        release.set()  # let the abandoned daemon thread end
    # ended by its 0.3 s bound (DDP002, the bound it applied), not by the check's end ("too late")
    assert f.id == "DDP002" and f.category == "internal" and f.severity == "warning"
    assert cid in f.message and "0.3 s" in f.message
    assert f.evidence == {"check": cid, "timeout_s": 0.3}
    assert f.ranks == [2]


def test_non_problem_yield_becomes_ddp001(reg: dict[str, registry.Check], ctx: RankContext) -> None:
    def yields_str(c: RankContext) -> Iterator[Any]:
        yield "just a string"
        yield Problem("real one")

    cid = add(reg, yields_str)
    findings = check_runner.run_stage("local", (ctx,), ctx.rank, select=[cid])
    assert [f.id for f in findings] == ["DDP001", cid]
    assert "str" in findings[0].message and "not a Problem" in findings[0].message
    assert findings[0].evidence == {"check": cid}
    assert findings[1].message == "real one"


def test_problem_with_an_unknown_severity_becomes_ddp001(reg: dict[str, registry.Check], ctx: RankContext) -> None:
    def typo(c: RankContext) -> Iterator[Any]:
        yield Problem("bad", severity="warn")  # not error/warning/info
        yield Problem("real one")

    cid = add(reg, typo)
    findings = check_runner.run_stage("local", (ctx,), ctx.rank, select=[cid])
    assert [f.id for f in findings] == ["DDP001", cid]
    assert "'warn'" in findings[0].message and findings[1].message == "real one"


def test_problem_overrides(reg: dict[str, registry.Check], ctx: RankContext) -> None:
    def overrides(c: RankContext) -> Iterator[Problem]:
        yield Problem("downgraded", severity="info")
        yield Problem("own hint", hint="do the specific thing")
        yield Problem("names ranks", ranks=(3, 1))
        yield Problem("no ranks at all", ranks=())

    cid = add(reg, overrides, severity="warning")
    f1, f2, f3, f4 = check_runner.run_stage("local", (ctx,), ctx.rank, select=[cid])
    assert f1.severity == "info" and f1.hint == "default hint from the docstring."
    assert f2.severity == "warning" and f2.hint == "do the specific thing"
    assert f3.ranks == [3, 1] and f3.to_dict()["ranks"] == [1, 3]
    assert f4.ranks == []


def test_rank_none_gives_no_ranks(reg: dict[str, registry.Check], ctx: RankContext) -> None:
    def finds(c: RankContext) -> Iterator[Problem]:
        yield Problem("m")

    cid = add(reg, finds)
    [f] = check_runner.run_stage("local", (ctx,), None, select=[cid], phase="training")
    assert f.ranks == [] and f.phase == "training"


def test_stage_and_skip(reg: dict[str, registry.Check], ctx: RankContext) -> None:
    calls: list[str] = []

    def local_one(c: RankContext) -> Iterator[Problem]:
        calls.append("local")
        yield Problem("l")

    def group_one(c: RankContext, group: Any) -> Iterator[Problem]:
        calls.append(f"group:{group}")
        yield Problem("g")

    lid = add(reg, local_one)
    gid = add(reg, group_one, stage="group")
    assert [f.id for f in check_runner.run_stage("group", (ctx, "G"), 2, select=[lid, gid])] == [gid]
    assert calls == ["group:G"]
    assert check_runner.run_stage("local", (ctx,), 2, select=[lid, gid], skip=[lid]) == []
    assert calls == ["group:G"]
