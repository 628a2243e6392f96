"""ddp-doctor's pytest plugin (entry point ``pytest11: ddp_doctor``): N-rank distributed tests and a
session preflight of the CI runner.

``@pytest.mark.distributed(world_size=2, backend="auto", timeout=120)`` runs the test function on
``world_size`` fresh rank processes with an initialised process group (``auto``: NCCL when at
least ``world_size`` GPUs are visible, gloo otherwise). Fixtures are resolved once here and pickled
to the ranks; ask for ``rank`` and ``world_size`` to get them. Ranks are forked from one forkserver
with torch preloaded (``ddp_doctor.pytest_plugin.rank_pool``); every wait is bounded and no rank outlives the
test, nor pytest.

The session preflight (``--ddp-doctor``; automatic when distributed tests are collected, unless
``--no-ddp-doctor`` / ``ddp_doctor = false``) runs ``ddp-doctor preflight`` on real ranks once, on
the controller only, before the tests. A broken runner becomes one failing item
``ddp_doctor::preflight`` and every distributed test is skipped (or deselected, or run anyway).

Settings: command line, then environment, then ini file, then the marker (first one set wins);
an invalid value is reported with where it came from. The plugin does nothing at all unless the
marker is used or the preflight is asked for.

This module holds only the hooks and the fixtures (pytest finds both here), the hooks in the order
pytest calls them: pytest_addoption, pytest_configure, pytest_configure_node (xdist controller),
pytest_collection_modifyitems, pytest_xdist_node_collection_finished (xdist controller),
pytest_runtest_setup, pytest_pyfunc_call, pytest_sessionfinish, pytest_terminal_summary,
pytest_unconfigure.
The work is in settings (options, ini, resolution), state (per-session state), marker (the
``distributed`` marker and running a test on its ranks), session_preflight and rank_pool.
"""
from __future__ import annotations

import tempfile
from typing import Any

import pytest

from ddp_doctor.pytest_plugin import session_preflight as preflight
from ddp_doctor.pytest_plugin.marker import (
    MARKER_DESC,
    RANK,
    WORLD_SIZE,
    checked_spec,
    is_distributed,
    run_on_ranks,
    skip_unless_runnable,
)
from ddp_doctor.pytest_plugin.settings import add_options, read_settings
from ddp_doctor.pytest_plugin.state import STATE, State, cleanup, get_state, pool_of


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_DESC)
    worker = hasattr(config, "workerinput")
    state = State(settings=read_settings(config), worker=worker)
    if worker:
        state.exchange = config.workerinput.get("ddp_doctor_exchange")  # type: ignore[attr-defined]
    config.stash[STATE] = state


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: tell each worker where the preflight's verdict will be."""
    state = get_state(node.config)
    if state.exchange is None:
        state.exchange = tempfile.mkdtemp(prefix="ddp-doctor-xdist-")
    state.nodes += 1
    node.workerinput["ddp_doctor_exchange"] = state.exchange


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: count only the tests that will run
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    state = get_state(config)
    req = preflight.request(state, items)
    if not preflight.wanted(state, req["items"]):
        if req["items"]:
            pool_of(state).start()  # torch loads in the forkserver while the first tests start
        return
    if state.worker:
        preflight.send_request(state, config.workerinput.get("workerid", "gw"), req)  # type: ignore[attr-defined]
        preflight.add_item(session, items)
        return  # the rank pool starts with the first distributed test, after the preflight
    state.verdict = preflight.run_session_preflight(state, req)
    if req["items"]:
        pool_of(state).start()  # after the preflight, so the two do not compete for the CPUs
    preflight.add_item(session, items)
    preflight.add_suite_properties(config, state.verdict)
    if preflight.failed(state.verdict) and state.settings.on_failure == "deselect":
        keep = [i for i in items if not is_distributed(i)]
        gone = [i for i in items if is_distributed(i)]
        if gone:
            config.hook.pytest_deselected(items=gone)
            items[:] = keep


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """xdist controller: once every worker has collected, run the preflight they asked for; the
    verdict is written before any test is scheduled."""
    config = node.config
    state = get_state(config)
    state.nodes_collected += 1
    if state.verdict is not None or state.exchange is None or state.nodes_collected < state.nodes:
        return
    req = preflight.merged_requests(state.exchange)
    if req is None:
        if state.settings.preflight != "true":
            return
        req = {"items": 0, "gloo_world_size": 0, "nccl": False}
    state.verdict = preflight.run_session_preflight(state, req)
    preflight.publish_verdict(state)
    preflight.add_suite_properties(config, state.verdict)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if not is_distributed(item) or isinstance(item, preflight.PreflightItem):
        return
    state = get_state(item.config)
    spec = checked_spec(item, state)
    v = preflight.verdict_of(state)
    if preflight.failed(v) and state.settings.on_failure != "run":
        assert v is not None
        pytest.skip(f"runner preflight failed: {v['line']}")
    skip_unless_runnable(item, spec, state)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not is_distributed(pyfuncitem):
        return None
    run_on_ranks(pyfuncitem, get_state(pyfuncitem.config))
    return True


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A session a stop signal ended exits 128 + that signal, as the shell reports a killed command."""
    from ddp_doctor.pytest_plugin.rank_pool.pool import STOPPED_BY
    if STOPPED_BY:
        session.exitstatus = 128 + STOPPED_BY[0]


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, str] | None:
    """The session preflight's pass is counted apart ("1 preflight passed"), never among the tests
    in "N passed"; its failure stays a failure, the first thing reported."""
    if report.nodeid == preflight.PREFLIGHT_NODEID and report.when == "call" and report.passed:
        return "preflight passed", "p", "PREFLIGHT PASSED"
    return None


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = get_state(config)
    if state.verdict is None or state.worker:
        return
    preflight.write_summary(terminalreporter, state.verdict)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is not None:
        cleanup(state)


# ---------------------------------------------------------------- fixtures
@pytest.fixture
def rank(request: pytest.FixtureRequest) -> Any:
    """This rank's number in a `@pytest.mark.distributed` test (0 in an ordinary test)."""
    return RANK if is_distributed(request.node) else 0


@pytest.fixture
def world_size(request: pytest.FixtureRequest) -> Any:
    """The number of ranks of a `@pytest.mark.distributed` test (1 in an ordinary test)."""
    return WORLD_SIZE if is_distributed(request.node) else 1


@pytest.fixture
def ddp_doctor() -> Any:
    """Runs ddp-doctor's local checks in this process when called: `findings = ddp_doctor()`
    (see ddp_doctor.testing.LocalChecks)."""
    from ddp_doctor.testing import LocalChecks
    return LocalChecks()
