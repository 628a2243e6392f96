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

Hooks, in the order pytest calls them: pytest_addoption, pytest_configure, pytest_configure_node
(xdist controller), pytest_collection_modifyitems, pytest_xdist_node_collection_finished (xdist
controller), pytest_runtest_setup, pytest_pyfunc_call, pytest_terminal_summary, pytest_unconfigure.
"""
from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest

MARKER = "distributed"
PREFLIGHT_NODEID = "ddp_doctor::preflight"
DEFAULT_WORLD_SIZE = 2
DEFAULT_TIMEOUT = 120.0
DEFAULT_PREFLIGHT_TIMEOUT = 20.0
BACKENDS = ("auto", "gloo", "nccl")
ON_FAILURE = ("skip", "deselect", "run")
LAUNCHER_PREFIXES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                     "GROUP_WORLD_SIZE", "ROLE_", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_",
                     "OMPI_COMM_WORLD", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                     "DDP_DOCTOR_LAUNCH_DIR")

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
MARKER_DESC = (
    f"{MARKER}(world_size={DEFAULT_WORLD_SIZE}, backend='auto', timeout={DEFAULT_TIMEOUT:g}): run the "
    "test on world_size ranks with an initialised process group (ddp-doctor); backend auto|gloo|nccl; "
    "ask for the `rank` and `world_size` fixtures")


# ---------------------------------------------------------------- settings
@dataclass(frozen=True)
class Setting:
    dest: str
    env: str
    ini: str
    parse: Callable[[str], Any]
    default: Any


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
    v = float(str(text).strip())
    if not v > 0:
        raise ValueError("must be more than 0 seconds")
    return v


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


def resolve(config: pytest.Config, setting: Setting, env: Any = None) -> tuple[Any, str]:
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
    return text if text.startswith("must") else "is not a valid value (" + text + ")"


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


@dataclass(frozen=True)
class MarkSpec:
    world_size: int
    backend: str        # auto | gloo | nccl as written
    timeout: float
    error: str | None = None


def mark_spec(item: pytest.Item, settings: Settings) -> MarkSpec:
    """The marker's arguments, checked; a settings timeout (command line, env, ini) wins."""
    m = item.get_closest_marker(MARKER)
    assert m is not None
    kw = dict(m.kwargs)
    if m.args:
        kw.setdefault("world_size", m.args[0])
    where = f"@pytest.mark.{MARKER}(...) on {item.nodeid}"
    unknown = set(kw) - {"world_size", "backend", "timeout"}
    ws, backend, timeout = kw.get("world_size", DEFAULT_WORLD_SIZE), kw.get("backend", "auto"), kw.get("timeout")
    error = None
    if unknown:
        error = f"{where}: unknown argument(s) {', '.join(sorted(unknown))}; known: world_size, backend, timeout"
    elif not isinstance(ws, int) or isinstance(ws, bool) or ws < 1:
        error = f"{where}: world_size={ws!r} must be a whole number of at least 1"
    elif backend not in BACKENDS:
        error = f"{where}: backend={backend!r} must be one of {', '.join(BACKENDS)}"
    elif timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0):
        error = f"{where}: timeout={timeout!r} must be a number of seconds more than 0"
    if error:
        return MarkSpec(DEFAULT_WORLD_SIZE, "gloo", DEFAULT_TIMEOUT, error)
    t = settings.timeout if settings.timeout is not None else float(timeout or DEFAULT_TIMEOUT)
    return MarkSpec(int(ws), str(backend), t)


# ---------------------------------------------------------------- state
@dataclass
class State:
    settings: Settings
    worker: bool                              # an xdist worker
    exchange: str | None = None               # xdist: directory the controller and workers share
    gpus: int | None = None
    pool: Any = None
    code_cache: dict[str, bytes] = field(default_factory=dict)
    verdict: dict[str, Any] | None = None     # the session preflight's, once known
    preflight_item: bool = False              # the failing/passing item ddp_doctor::preflight exists
    nodes: int = 0
    nodes_collected: int = 0
    private_dir: str | None = None


STATE = pytest.StashKey[State]()


def _state(config: pytest.Config) -> State:
    return config.stash[STATE]


def visible_gpus(state: State) -> int:
    if state.gpus is None:
        from ddp_doctor.facts.host import visible_gpu_count
        state.gpus = visible_gpu_count()
    return state.gpus


def resolved_backend(spec: MarkSpec, gpus: int) -> str:
    if spec.backend == "auto":
        return "nccl" if gpus >= spec.world_size and gpus > 0 else "gloo"
    return spec.backend


def _private_dir(state: State) -> str:
    if state.private_dir is None:
        state.private_dir = tempfile.mkdtemp(prefix="ddp-doctor-pytest-")
    return state.private_dir


def _pool(state: State) -> Any:
    if state.pool is None:
        from ddp_doctor.pytest_plugin.rank_pool import RankPool
        state.pool = RankPool(os.path.join(_private_dir(state), "forkserver.log"))
    return state.pool


# ---------------------------------------------------------------- hooks
def pytest_addoption(parser: pytest.Parser) -> None:
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
    state = _state(node.config)
    if state.exchange is None:
        state.exchange = tempfile.mkdtemp(prefix="ddp-doctor-xdist-")
    state.nodes += 1
    node.workerinput["ddp_doctor_exchange"] = state.exchange


def _wanted(state: State, dist_items: int) -> bool:
    p = state.settings.preflight
    return p == "true" or (p == "auto" and dist_items > 0)


def _request(config: pytest.Config, items: list[pytest.Item]) -> dict[str, Any]:
    """What the session preflight must cover: the largest gloo world size, whether NCCL is used."""
    state = _state(config)
    gloo_ws, nccl, n = 0, False, 0
    for item in items:
        if item.get_closest_marker(MARKER) is None:
            continue
        n += 1
        spec = mark_spec(item, state.settings)
        item.stash[SPEC] = spec
        if spec.error:
            continue
        backend = resolved_backend(spec, visible_gpus(state)) if spec.backend == "auto" else spec.backend
        if backend == "gloo":
            gloo_ws = max(gloo_ws, spec.world_size)
        else:
            nccl = True
    return {"items": n, "gloo_world_size": gloo_ws, "nccl": nccl}


SPEC = pytest.StashKey[MarkSpec]()


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: count only the tests that will run
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    state = _state(config)
    req = _request(config, items)
    if not _wanted(state, req["items"]):
        if req["items"]:
            _pool(state).start()  # torch loads in the forkserver while the first tests start
        return
    if state.worker:
        if state.exchange:
            wid = config.workerinput.get("workerid", "gw")  # type: ignore[attr-defined]
            _write_json(os.path.join(state.exchange, f"request-{wid}.json"), req)
        items.insert(0, PreflightItem.from_parent(session, name=PREFLIGHT_NODEID, nodeid=PREFLIGHT_NODEID))
        return  # the rank pool starts with the first distributed test, after the preflight
    state.verdict = run_session_preflight(config, req)
    if req["items"]:
        _pool(state).start()  # after the preflight, so the two do not compete for the CPUs
    items.insert(0, PreflightItem.from_parent(session, name=PREFLIGHT_NODEID, nodeid=PREFLIGHT_NODEID))
    _add_suite_properties(config, state.verdict)
    if state.verdict["status"] in ("fail", "error") and state.settings.on_failure == "deselect":
        keep = [i for i in items if i.get_closest_marker(MARKER) is None]
        gone = [i for i in items if i.get_closest_marker(MARKER) is not None]
        if gone:
            config.hook.pytest_deselected(items=gone)
            items[:] = keep


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """xdist controller: once every worker has collected, run the preflight they asked for; the
    verdict is written before any test is scheduled."""
    config = node.config
    state = _state(config)
    state.nodes_collected += 1
    if state.verdict is not None or state.exchange is None or state.nodes_collected < state.nodes:
        return
    reqs = []
    for name in sorted(os.listdir(state.exchange)):
        if name.startswith("request-"):
            try:
                with open(os.path.join(state.exchange, name), encoding="utf-8") as f:
                    reqs.append(json.load(f))
            except (OSError, ValueError):
                continue
    if not reqs and state.settings.preflight != "true":
        return
    req = {"items": sum(r["items"] for r in reqs),
           "gloo_world_size": max([r["gloo_world_size"] for r in reqs] or [0]),
           "nccl": any(r["nccl"] for r in reqs)}
    state.verdict = run_session_preflight(config, req)
    _write_json(os.path.join(state.exchange, "verdict.json"), state.verdict)
    _add_suite_properties(config, state.verdict)


def _verdict(state: State) -> dict[str, Any] | None:
    if state.verdict is None and state.worker and state.exchange:
        try:
            with open(os.path.join(state.exchange, "verdict.json"), encoding="utf-8") as f:
                state.verdict = json.load(f)
        except (OSError, ValueError):
            return None
    return state.verdict


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker(MARKER) is None or isinstance(item, PreflightItem):
        return
    state = _state(item.config)
    spec = item.stash.get(SPEC, None) or mark_spec(item, state.settings)
    item.stash[SPEC] = spec
    if spec.error:
        pytest.fail(spec.error, pytrace=False)
    v = _verdict(state)
    if v is not None and v["status"] in ("fail", "error") and state.settings.on_failure != "run":
        pytest.skip(f"runner preflight failed: {v['line']}")
    gpus = visible_gpus(state)
    if resolved_backend(spec, gpus) == "nccl" and gpus < spec.world_size:
        pytest.skip(f"backend nccl with world_size={spec.world_size} needs {spec.world_size} GPU(s); "
                    f"{gpus} visible")
    if not isinstance(item, pytest.Function):
        pytest.fail(f"@pytest.mark.{MARKER} works on test functions only, not {type(item).__name__}",
                    pytrace=False)


class _RankValue:
    """What the `rank` / `world_size` fixtures hold in the pytest process of a distributed test;
    each rank gets its own number instead."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<{self.what}: set in each rank>"


RANK = _RankValue("rank")
WORLD_SIZE = _RankValue("world_size")


@pytest.fixture
def rank(request: pytest.FixtureRequest) -> Any:
    """This rank's number in a `@pytest.mark.distributed` test (0 in an ordinary test)."""
    return RANK if request.node.get_closest_marker(MARKER) is not None else 0


@pytest.fixture
def world_size(request: pytest.FixtureRequest) -> Any:
    """The number of ranks of a `@pytest.mark.distributed` test (1 in an ordinary test)."""
    return WORLD_SIZE if request.node.get_closest_marker(MARKER) is not None else 1


@pytest.fixture
def ddp_doctor() -> Any:
    """Runs ddp-doctor's local checks in this process when called: `findings = ddp_doctor()`
    (see ddp_doctor.testing.LocalChecks)."""
    from ddp_doctor.testing import LocalChecks
    return LocalChecks()


def unpicklable(kwargs: dict[str, Any]) -> tuple[str, str] | None:
    """(fixture name, why) of the first value that cannot be sent to the ranks, or None."""
    for name, value in kwargs.items():
        try:
            pickle.dumps(value)
        except Exception as e:  # noqa: BLE001 - pickle raises many kinds
            return name, f"{type(value).__module__}.{type(value).__qualname__}: {type(e).__name__}: {e}"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if pyfuncitem.get_closest_marker(MARKER) is None:
        return None
    config = pyfuncitem.config
    state = _state(config)
    spec = pyfuncitem.stash.get(SPEC, None) or mark_spec(pyfuncitem, state.settings)
    backend = resolved_backend(spec, visible_gpus(state))
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {n: pyfuncitem.funcargs[n] for n in names}
    rank_args = [n for n, v in kwargs.items() if v is RANK]
    ws_args = [n for n, v in kwargs.items() if v is WORLD_SIZE]
    for n in rank_args + ws_args:
        del kwargs[n]
    payload, bad = b"", None
    try:
        payload = pickle.dumps(kwargs)
    except Exception as e:  # noqa: BLE001
        bad = unpicklable(kwargs) or ("?", f"{type(e).__name__}: {e}")
    if bad is not None:
        pytest.fail(f"fixture {bad[0]!r} cannot be sent to the ranks ({bad[1]}). Fixtures of a "
                    f"@pytest.mark.{MARKER} test are resolved once in the pytest process and pickled "
                    f"to each rank: return something picklable (a path, a config), or create the "
                    f"object inside the test.", pytrace=False)
    path = str(pyfuncitem.path)
    if path not in state.code_cache:
        from ddp_doctor.pytest_plugin.rank_pool import compile_module
        state.code_cache[path] = compile_module(path, config)
    cls = pyfuncitem.cls
    run_dir = _run_dir(config, pyfuncitem.name)
    rank_spec = {
        "world_size": spec.world_size, "backend": backend, "timeout": spec.timeout, "dir": run_dir,
        "module": pyfuncitem.module.__name__, "path": path, "code": state.code_cache[path],
        "qualname": pyfuncitem.function.__qualname__, "cls": cls.__qualname__ if cls is not None else None,
        "kwargs": payload, "rank_arg": rank_args, "world_size_arg": ws_args,
        "env": {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)},
        "cwd": os.getcwd(), "sys_path": list(sys.path),
    }
    from ddp_doctor.pytest_plugin.rank_pool import classify
    res = _pool(state).run(rank_spec, spec.timeout)
    verdict = classify(res)
    for r, end in sorted(res.ends.items()):
        if end.stdout:
            pyfuncitem.add_report_section("call", f"stdout (rank {r})", end.stdout)
        if end.stderr:
            pyfuncitem.add_report_section("call", f"stderr (rank {r})", end.stderr)
    pyfuncitem.user_properties.append(("ddp_doctor_ranks", f"{spec.world_size} x {backend}"))
    for note in verdict.notes:
        pyfuncitem.user_properties.append(("ddp_doctor_note", note))
        pyfuncitem.add_report_section("call", "ddp-doctor", note)
    if verdict.outcome == "failed":
        pytest.fail(verdict.text, pytrace=False)
    if verdict.outcome == "skipped":
        pytest.skip(verdict.summary)
    return True


def _run_dir(config: pytest.Config, name: str) -> str:
    factory = getattr(config, "_tmp_path_factory", None)
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:30]
    if factory is not None:
        return str(factory.mktemp(f"ddp-{safe}", numbered=True))
    return tempfile.mkdtemp(prefix=f"ddp-{safe}-")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = _state(config)
    v = state.verdict
    if v is None or state.worker:
        return
    tr = terminalreporter
    tr.section("ddp-doctor runner preflight", sep="-", bold=True,
               red=v["status"] in ("fail", "error"), green=v["status"] == "pass")
    for line in summary_lines(v):
        tr.write_line(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None:
        return
    if state.pool is not None:
        state.pool.close()
    import shutil
    for d in (state.private_dir, None if state.worker else state.exchange):
        if d:
            shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------- the session preflight
class PreflightItem(pytest.Item):
    """`ddp_doctor::preflight`: passes or fails with the session preflight's verdict."""

    def runtest(self) -> None:
        state = _state(self.config)
        v = _verdict(state)
        if v is None:
            pytest.skip("the runner preflight did not run (no verdict from the controller)")
        for line in summary_lines(v):
            self.user_properties.append(("ddp_doctor", line))
        if v["status"] in ("fail", "error"):
            raise PreflightFailed(v)

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        if isinstance(excinfo.value, PreflightFailed):
            return excinfo.value.text()
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, PREFLIGHT_NODEID


class PreflightFailed(Exception):
    def __init__(self, verdict: dict[str, Any]) -> None:
        super().__init__(verdict["line"])
        self.verdict = verdict

    def text(self) -> str:
        v = self.verdict
        parts = [f"runner preflight failed: {v['line']}", ""]
        parts += [r.get("text", "") for r in v["runs"]]
        parts.append(f"\nreport: {v['report']}")
        return "\n".join(p for p in parts if p is not None)


def _write_json(path: str, data: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def preflight_runs(req: dict[str, Any], gpus: int) -> list[tuple[str, int]]:
    """(backend, ranks) to check: NCCL with one rank per GPU when there are GPUs; gloo at the
    largest world size the gloo tests ask for (2 when nothing says otherwise)."""
    runs: list[tuple[str, int]] = []
    if gpus > 0:
        runs.append(("nccl", gpus))
    if req.get("gloo_world_size") or not runs:
        runs.append(("gloo", max(int(req.get("gloo_world_size") or 0), 1) if req.get("items") else DEFAULT_WORLD_SIZE))
    return runs


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_one_preflight(backend: str, nproc: int, report: str, settings: Settings) -> dict[str, Any]:
    """`ddp-doctor preflight` self-launched on `nproc` ranks in a subprocess, bounded."""
    from ddp_doctor.preflight_run.local_launch import _die_with_parent  # its own session, ends when we do
    t = settings.preflight_timeout
    cmd = [sys.executable, "-m", "ddp_doctor", "preflight", "--nproc-per-node", str(nproc),
           "--backend", backend, "--timeout", f"{t:g}", "--report", report, "--json"]
    if settings.expect_gpus is not None:
        cmd += ["--expect-gpus", str(settings.expect_gpus)]
    cmd += settings.preflight_args
    bound = 3 * t + 90
    t0 = time.monotonic()
    try:
        os.remove(report)
    except OSError:
        pass
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_clean_env(), preexec_fn=_die_with_parent)
    timed_out = False
    try:
        _, err = proc.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, err = proc.communicate()
    seconds = time.monotonic() - t0
    rep: dict[str, Any] | None = None
    try:
        with open(report, encoding="utf-8") as f:
            rep = json.load(f)
    except (OSError, ValueError):
        rep = None
    run: dict[str, Any] = {"backend": backend, "world_size": nproc, "exit_code": proc.returncode,
                           "seconds": round(seconds, 2), "report": report, "all_reduce": None,
                           "root_cause": None}
    if rep is not None:
        from ddp_doctor.report.render import render_text
        run["status"] = rep.get("status", "fail")
        cause = rep.get("root_cause")
        run["root_cause"] = cause and {k: cause.get(k) for k in ("id", "title", "message", "ranks")}
        ar = (rep.get("measurements") or {}).get("all_reduce") or []
        if ar:
            big = max(ar, key=lambda m: m.get("bytes", 0))
            run["all_reduce"] = {k: big.get(k) for k in ("bytes", "time_us", "busbw_gbps", "correct")}
        run["text"] = render_text(rep, report_path=report)
    if timed_out:
        run["status"] = "error"
        run["line"] = f"ddp-doctor preflight ({backend}, {nproc} ranks) did not finish within {bound:g} s"
    elif rep is None or proc.returncode not in (0, 3):
        run["status"] = "error" if rep is None else run["status"]
        tail = [x for x in (err or "").strip().splitlines() if x.strip()][-1:] or ["no output"]
        run["line"] = f"ddp-doctor preflight ({backend}, {nproc} ranks) exited with status {proc.returncode}: {tail[0]}"
        run["text"] = (run.get("text") or "") + "\n" + (err or "")[-4000:]
    elif proc.returncode == 3 or run["status"] == "fail":
        c = run["root_cause"] or {}
        run["status"] = "fail"
        run["line"] = f"{c.get('id', '?')} {c.get('title', '')}: {c.get('message', '')} ({backend}, {nproc} ranks)"
    else:
        run["line"] = f"{run['status']} ({backend}, {nproc} ranks)"
    run["line"] = " ".join(run["line"].split())[:300]
    return run


def run_session_preflight(config: pytest.Config, req: dict[str, Any]) -> dict[str, Any]:
    state = _state(config)
    s = state.settings
    base = os.path.abspath(s.report or "ddp-doctor-report.json")
    runs = []
    plan = preflight_runs(req, visible_gpus(state))
    for i, (backend, n) in enumerate(plan):
        path = base if i == 0 else f"{os.path.splitext(base)[0]}.{backend}.json"
        runs.append(run_one_preflight(backend, n, path, s))
    bad = [r for r in runs if r["status"] in ("fail", "error")]
    status = "error" if any(r["status"] == "error" for r in bad) else "fail" if bad else \
        ("warn" if any(r["status"] == "warn" for r in runs) else "pass")
    line = bad[0]["line"] if bad else "; ".join(r["line"] for r in runs)
    return {"status": status, "line": line, "runs": runs, "report": base,
            "expect_gpus": s.expect_gpus, "visible_gpus": visible_gpus(state)}


def summary_lines(v: dict[str, Any]) -> list[str]:
    lines = [f"verdict: {v['status'].upper()}" + (f" - {v['line']}" if v["status"] in ("fail", "error") else "")]
    if v.get("expect_gpus") is not None:
        lines.append(f"GPUs: {v['visible_gpus']} visible, {v['expect_gpus']} expected")
    for r in v["runs"]:
        ar = r.get("all_reduce")
        fig = (f"all_reduce {ar['bytes']} B in {ar['time_us']:.0f} us, busbw {ar['busbw_gbps']:.3f} GB/s, "
               f"{'correct' if ar['correct'] else 'WRONG'}" if ar else "no all_reduce measured")
        lines.append(f"{r['backend']} x {r['world_size']} ranks: {r['status']} in {r['seconds']:.1f} s; {fig}; "
                     f"report {r['report']}")
    return lines


def suite_properties(v: dict[str, Any]) -> list[tuple[str, str]]:
    props = [("ddp_doctor_status", v["status"]), ("ddp_doctor_report", v["report"]),
             ("ddp_doctor_visible_gpus", str(v["visible_gpus"]))]
    if v["status"] in ("fail", "error"):
        props.append(("ddp_doctor_root_cause", v["line"]))
    if v.get("expect_gpus") is not None:
        props.append(("ddp_doctor_expect_gpus", str(v["expect_gpus"])))
    for r in v["runs"]:
        k = f"ddp_doctor_{r['backend']}"
        props += [(f"{k}_world_size", str(r["world_size"])), (f"{k}_status", r["status"]),
                  (f"{k}_seconds", f"{r['seconds']:.2f}")]
        ar = r.get("all_reduce")
        if ar:
            props += [(f"{k}_all_reduce_bytes", str(ar["bytes"])),
                      (f"{k}_all_reduce_time_us", f"{ar['time_us']:.1f}"),
                      (f"{k}_all_reduce_busbw_gbps", f"{ar['busbw_gbps']:.4f}"),
                      (f"{k}_all_reduce_correct", str(bool(ar["correct"])).lower())]
    return props


def _add_suite_properties(config: pytest.Config, v: dict[str, Any]) -> None:
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # pragma: no cover - pytest without junitxml
        return
    xml = config.stash.get(xml_key, None)
    if xml is None:
        return
    for name, value in suite_properties(v):
        xml.add_global_property(name, value)
