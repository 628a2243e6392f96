"""``@pytest.mark.distributed(world_size=2, backend="auto", timeout=120)``: the marker's arguments
(MarkSpec, checked; a timeout from the command line, environment or ini wins over the marker's),
the checks before a marked test runs, what the ``rank`` / ``world_size`` fixtures hold, and
running the test: fixtures resolved once here and pickled to ``world_size`` ranks of the rank
pool, each rank's output and the verdict reported back to pytest. A failed or hung test is judged as
`ddp-doctor run` judges a job, from each rank's ending, stack and ledger of collectives
(rank_pool/judge.py).
"""
from __future__ import annotations

import os
import pickle
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import pytest

from ddp_doctor.pytest_plugin.settings import DEFAULT_TIMEOUT, DEFAULT_WORLD_SIZE, Settings
from ddp_doctor.pytest_plugin.state import State, pool_of, visible_gpus
from ddp_doctor.time_limit import usable_timeout

MARKER = "distributed"
BACKENDS = ("auto", "gloo", "nccl")
MARKER_DESC = (
    f"{MARKER}(world_size={DEFAULT_WORLD_SIZE}, backend='auto', timeout={DEFAULT_TIMEOUT:g}): run the "
    "test on world_size ranks with an initialised process group (ddp-doctor); backend auto|gloo|nccl; "
    "ask for the `rank` and `world_size` fixtures")
# Left out of the ranks' environment: a launcher's variables would contradict the test's own ranks.
LAUNCHER_PREFIXES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                     "GROUP_WORLD_SIZE", "ROLE_", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_",
                     "OMPI_COMM_WORLD", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                     "DDP_DOCTOR_LAUNCH_DIR")


def is_distributed(item: pytest.Item) -> bool:
    return item.get_closest_marker(MARKER) is not None


@dataclass(frozen=True)
class MarkSpec:
    world_size: int
    backend: str        # auto | gloo | nccl as written
    timeout: float
    error: str | None = None


SPEC = pytest.StashKey[MarkSpec]()


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
    elif timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                                  or _not_a_bound(timeout)):
        error = f"{where}: timeout={timeout!r} must be a number of seconds more than 0 and at most one day"
    if error:
        return MarkSpec(DEFAULT_WORLD_SIZE, "gloo", DEFAULT_TIMEOUT, error)
    t = settings.timeout if settings.timeout is not None else float(timeout or DEFAULT_TIMEOUT)
    return MarkSpec(int(ws), str(backend), t)


def resolved_backend(spec: MarkSpec, gpus: int) -> str:
    if spec.backend == "auto":
        return "nccl" if gpus >= spec.world_size and gpus > 0 else "gloo"
    return spec.backend


# ---------------------------------------------------------------- before the test
def checked_spec(item: pytest.Item, state: State) -> MarkSpec:
    """The item's MarkSpec (kept in its stash); a bad marker fails the test."""
    spec = item.stash.get(SPEC, None) or mark_spec(item, state.settings)
    item.stash[SPEC] = spec
    if spec.error:
        pytest.fail(spec.error, pytrace=False)
    return spec


def skip_unless_runnable(item: pytest.Item, spec: MarkSpec, state: State) -> None:
    """Skip an NCCL test without enough GPUs; fail a marked item that is not a test function."""
    gpus = visible_gpus(state)
    if resolved_backend(spec, gpus) == "nccl" and gpus < spec.world_size:
        pytest.skip(f"backend nccl with world_size={spec.world_size} needs {spec.world_size} GPU(s); "
                    f"{gpus} visible")
    if not isinstance(item, pytest.Function):
        pytest.fail(f"@pytest.mark.{MARKER} works on test functions only, not {type(item).__name__}",
                    pytrace=False)


# ---------------------------------------------------------------- what the `rank` / `world_size` fixtures hold
class _RankValue:
    """What the `rank` / `world_size` fixtures hold in the pytest process of a distributed test;
    each rank gets its own number instead."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<{self.what}: set in each rank>"


RANK = _RankValue("rank")
WORLD_SIZE = _RankValue("world_size")


# ---------------------------------------------------------------- running the test on its ranks
def unpicklable(kwargs: dict[str, Any]) -> tuple[str, str] | None:
    """(fixture name, why) of the first value that cannot be sent to the ranks, or None."""
    for name, value in kwargs.items():
        try:
            pickle.dumps(value)
        except Exception as e:  # noqa: BLE001 - pickle raises many kinds
            return name, f"{type(value).__module__}.{type(value).__qualname__}: {type(e).__name__}: {e}"
    return None


def _run_dir(config: pytest.Config, name: str) -> str:
    factory = getattr(config, "_tmp_path_factory", None)
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:30]
    if factory is not None:
        return str(factory.mktemp(f"ddp-{safe}", numbered=True))
    return tempfile.mkdtemp(prefix=f"ddp-{safe}-")


def run_on_ranks(pyfuncitem: pytest.Function, state: State) -> None:
    """Run the test function on its ranks; fail or skip it with the verdict."""
    config = pyfuncitem.config
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
    except Exception as e:  # noqa: BLE001 - pickle raises many kinds
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
    from ddp_doctor.pytest_plugin.rank_pool.verdict import stopped_stack
    try:
        res = pool_of(state).run(rank_spec, spec.timeout)
    except KeyboardInterrupt:
        _show_interrupted(config, pool_of(state).interrupted)
        raise
    verdict = classify(res)
    judgement = None
    if verdict.outcome == "failed":
        # the judgement of `ddp-doctor run`, with each rank's ledger and stack (rank_pool/judge.py)
        from ddp_doctor.pytest_plugin.rank_pool.judge import judge_inputs
        judgement = pool_of(state).judge(judge_inputs(res), run_dir)
        verdict = classify(res, judgement)
        if judgement is None:
            verdict.notes.append("ddp-doctor's judgement of this failure could not be made (the rank pool's "
                                 "log is forkserver.log in the session's ddp-doctor-pytest-* temp directory)")
            verdict.text += f"\nnote: {verdict.notes[-1]}"
    for r, end in sorted(res.ends.items()):
        if end.stdout:
            pyfuncitem.add_report_section("call", f"stdout (rank {r})", end.stdout)
        if end.stderr:
            pyfuncitem.add_report_section("call", f"stderr (rank {r})", end.stderr)
        if end.killed is not None:  # each stopped rank's Python stack (a hang, or a peer failed)
            pyfuncitem.add_report_section("call", f"stack when stopped (rank {r})", stopped_stack(end))
    pyfuncitem.user_properties.append(("ddp_doctor_ranks", f"{spec.world_size} x {backend}"))
    cause = (judgement or {}).get("root_cause")
    if cause:
        pyfuncitem.user_properties.append(("ddp_doctor_root_cause", f"{cause['id']}: {cause['message']}"))
    for note in verdict.notes:
        pyfuncitem.user_properties.append(("ddp_doctor_note", note))
        pyfuncitem.add_report_section("call", "ddp-doctor", note)
    if verdict.outcome == "failed":
        pytest.fail(verdict.text, pytrace=False)
    if verdict.outcome == "skipped":
        pytest.skip(verdict.summary)


def _show_interrupted(config: pytest.Config, text: str) -> None:
    """Print past pytest's capture (an interrupted test's captured output is never shown)."""
    if not text:
        return
    capman = config.pluginmanager.getplugin("capturemanager")
    import contextlib
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        sys.stderr.write(f"\n{text}\n")
        sys.stderr.flush()


def _not_a_bound(seconds: float) -> bool:
    """The one rule for a bound in seconds (time_limit.usable_timeout): finite, above 0, at most a day."""
    try:
        usable_timeout(str(seconds))
    except ValueError:
        return True
    return False
