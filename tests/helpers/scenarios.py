"""Scenarios launched for real: each a script under `ddp-doctor run` with its options (2 gloo ranks
unless it says otherwise). The e2e tests launch the ones whose gathering they check;
tests/record_corpus.py launches them all to re-record the replay corpus (helpers/corpus.py) that
the diagnosis tests judge again.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from helpers.procs import DDP, NO_SWEEP, Launch, clean_env, free_port

TESTS = Path(__file__).resolve().parents[1]
SCRIPTS = TESTS / "run_scripts"
FAILURE_SCRIPTS = TESTS / "failure_scripts"
PROBE_SCRIPTS = TESTS / "probe_scripts"
RUN_BOUNDS = ("--timeout", "30", "--hang-timeout", "60")


@dataclass
class Scenario:
    """`script` (under `scripts`, given `args`) under `ddp-doctor run NPROC BOUNDS OPTIONS`; `nproc`
    None: one process, no launcher (the script is the job). `env`: added to the tests' clean
    environment, `unset`: taken out of it, `port`: a variable given a free port at each launch;
    `wrapper`: the command that starts ddp-doctor (a mount namespace); `needs`: why this machine
    cannot launch it (None: it can); `timeout`: the launch's own bound."""
    script: str
    options: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    nproc: int | None = 2
    bounds: tuple[str, ...] = RUN_BOUNDS
    scripts: Path = SCRIPTS
    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    port: str | None = None
    wrapper: tuple[str, ...] = ()
    needs: Callable[[], str | None] | None = None
    timeout: float = 180.0


def _mount_namespaces_work() -> bool:
    try:
        r = subprocess.run(["unshare", "--mount", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm && "
                            "df -k /dev/shm"], capture_output=True, text=True, timeout=10)
        return r.returncode == 0 and "tmpfs" in r.stdout
    except (OSError, subprocess.SubprocessError):
        return False


def needs_small_shm() -> str | None:
    return None if _mount_namespaces_work() else "needs `unshare --mount` and a tmpfs mount (root) to shrink /dev/shm"


def needs_transformers() -> str | None:
    try:
        import accelerate  # noqa: F401
        import transformers  # noqa: F401
        return None
    except ImportError:
        return "needs transformers and accelerate"


# "signatures": tests/failure_scripts, each producing its error for real (checks/test_signatures.py)
SIGNATURE_ENV = {"PYTHONPATH": str(TESTS.parent), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
SHM_WRAP = ("unshare", "--mount", "sh", "-c", 'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "$@"', "sh")


def _signature(script: str, *, nproc: int | None = None, env: dict[str, str] | None = None, **more) -> Scenario:
    """A failure script: one process unless `nproc`, under the default hang bound (none may fire)."""
    return Scenario(script, nproc=nproc, bounds=("--timeout", "20", "--skip", "communication"),
                    scripts=FAILURE_SCRIPTS, env={**SIGNATURE_ENV, **(env or {})}, timeout=120.0, **more)


SHARDING_BOUNDS = ("--timeout", "60", "--hang-timeout", "120")


def _loop(*switches: str) -> Scenario:
    """tests/probe_scripts/loop.py, the correct DDP loop unless a switch plants a mistake."""
    return Scenario("loop.py", NO_SWEEP, args=switches, scripts=PROBE_SCRIPTS)


# group -> name -> scenario. "cause": failures the collective ledger explains, and correct patterns
# that must stay clean (training/test_cause.py); "signatures": known error signatures
# (checks/test_signatures.py); "ddp_parameters", "late_init", "init_everywhere", "probes",
# "sharding", "sampler_rules", "peer_scripts": the training/test_*_e2e.py modules of those names
GROUPS: dict[str, dict[str, Scenario]] = {
    "cause": {
        "uneven": Scenario("uneven_inputs.py"),
        "sizes": Scenario("size_mismatch.py"),
        "slow_checkpoint": Scenario("slow_checkpoint.py"),
        "rank0_only": Scenario("rank0_only_allreduce.py", ("--hang-timeout", "6")),
        "handset_rank": Scenario("handset_rank.py"),
        "env_world": Scenario("env_world_size.py"),
        "correct": Scenario("correct_patterns.py"),
        "barrier_in_block": Scenario("barrier_in_rank0_block.py", ("--hang-timeout", "6")),
        "extra_eval": Scenario("rank0_evaluates_after_training.py"),
        "nan_break": Scenario("leaves_loop_on_nan.py", ("--hang-timeout", "6")),
        "metric_abort": Scenario("metric_in_rank0_block.py"),
        "skipped_abort": Scenario("metric_skipped_on_one_rank.py"),
        "ran_out": Scenario("uneven_loader_then_barrier.py", ("--hang-timeout", "8")),
        "eval_helper": Scenario("evaluates_on_rank0_only.py", ("--hang-timeout", "6")),
        "gather_sizes": Scenario("gathers_rank_sized.py"),
        "send_cycle": Scenario("p2p_send_cycle.py", ("--hang-timeout", "6")),
        "os_exit_0": Scenario("rank1_os_exit_0.py", ("--hang-timeout", "20")),
        "late_to_barrier": Scenario("rank1_late_to_monitored_barrier.py", ("--hang-timeout", "30")),
    },
    "signatures": {
        "env_not_set": _signature("env_not_set.py"),
        "port_in_use": _signature("port_in_use.py"),
        "init_twice": _signature("init_twice.py"),
        "unused_parameter": _signature("unused_parameter.py", nproc=2),
        "collective_timeout": _signature("collective_timeout.py", nproc=2),
        "peer_killed": _signature("peer_killed.py", nproc=2),
        "shm_full": _signature("shm_full.py", wrapper=SHM_WRAP, needs=needs_small_shm),
        # no SageMaker job around it
        "sm_hosts_int": _signature("sm_hosts_int.py", env={"SM_HOSTS": '["algo-1","algo-2"]'},
                                   options=("--skip", "launcher_env,topology,network")),
        "smdistributed_deprecated": _signature("smdistributed_deprecated.py"),
        "smdistributed_missing": _signature("smdistributed_missing.py"),
        "empty_batch": _signature("empty_batch.py", needs=needs_transformers),
        "no_default_group": _signature("no_default_group.py"),
        "rank_env_missing": _signature("rank_env_missing.py"),
        "store_timeout": _signature("store_timeout.py"),
        "model_mismatch": _signature("model_mismatch.py", nproc=2),
        "cuda_unavailable": _signature("cuda_unavailable.py"),
        "nccl_unavailable": _signature("nccl_unavailable.py"),
        "collective_mismatch": _signature("collective_mismatch.py", nproc=2, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}),
    },
    # torch's own parameter names stay out of its message (no TORCH_DISTRIBUTED_DEBUG)
    "ddp_parameters": {mode: Scenario("ddp_unused_parameters.py", args=(mode,), unset=("TORCH_DISTRIBUTED_DEBUG",))
                       for mode in ("head", "branch", "twice")},
    "late_init": {
        "sleeps": Scenario("rank1_late_to_init.py"),
        "loads": Scenario("rank1_loads_before_init.py"),
        "ends": Scenario("rank1_ends_before_init.py"),
        "two_seconds": Scenario("rank1_init_2s_late.py"),
    },
    # one process whose script spawns its own ranks, and launched ranks
    "init_everywhere": {
        name: Scenario(script, nproc=nproc, bounds=("--timeout", "30", "--hang-timeout", "120"), port="TEST_PORT",
                       timeout=240.0)
        for name, script, nproc in [("world_zero", "spawn_world_size_zero.py", None),
                                    ("world_too_large", "spawn_world_too_large.py", None),
                                    ("rank_outside", "spawn_rank_out_of_range.py", None),
                                    ("never_inits", "never_inits.py", 2), ("forms_group", "ok_allreduce.py", 2),
                                    ("port_per_child", "spawn_port_per_child.py", None),
                                    ("rank1_port", "rank1_sets_master_port.py", 2)]},
    # the in-training probes: one mistake planted in a DDP loop each (and none in "correct")
    "probes": {
        "correct": _loop(),
        "own_shard": _loop("--own-shard"),
        "unsharded": _loop("--no-sampler", "--rank-seed", "--samples", "20000", "--max-batches", "10"),
        "set_epoch_straggler_bypass_buffer": _loop("--no-set-epoch", "--slow-rank", "1", "--bypass-ddp",
                                                   "--local-buffer"),
        "ddp_first": _loop("--ddp-first"),
        "init_twice": _loop("--init-twice"),
        "thread_fails": _loop("--thread-fails"),
    },
    # data sharded twice or overlapping (tests/run_scripts/sampler_sharding.py's shapes), and ranks
    # that never formed a process group
    "sharding": {  # accelerate's import takes a while on a busy machine: wider bounds
        **{shape: Scenario("sampler_sharding.py", NO_SWEEP, args=("--shape", shape), bounds=SHARDING_BOUNDS)
           for shape in ("accelerate", "wrapped", "subset", "seed", "rank")},
        "too_few_gpus": Scenario("too_few_gpus.py", NO_SWEEP, bounds=SHARDING_BOUNDS),
        "cpu_shards": Scenario("cpu_skips_ddp_shards_data.py", NO_SWEEP, bounds=SHARDING_BOUNDS),
    },
    # loaders read in full on purpose (a reference model, evaluation) beside a sharded DDP loader,
    # and the same DDP model fed by an unsharded loader
    "sampler_rules": {"reference_eval": Scenario("sampler_reference_and_eval.py", NO_SWEEP),
                      "unsharded": Scenario("sampler_reference_and_eval.py", NO_SWEEP, args=("--unsharded",))},
    # gradients all-reduced by hand, no DDP model: over one unsharded loader, and with no process group
    "peer_scripts": {"by_hand": Scenario("grads_by_hand.py", NO_SWEEP),
                     "no_group": Scenario("grads_by_hand.py", NO_SWEEP, args=("--no-group",))},
}


def launch(group: str, name: str, base: Path) -> Launch:
    """The launch of one scenario: its report at base/NAME.json (its evidence beside it), its run
    directory kept under base/NAME-runs."""
    s = GROUPS[group][name]
    env = clean_env(**s.env)
    for var in s.unset:
        env.pop(var, None)
    if s.port:
        env[s.port] = str(free_port())
    nproc = ["--nproc-per-node", str(s.nproc)] if s.nproc else []
    return Launch([*s.wrapper, *DDP, "run", *nproc, *s.bounds, *s.options,
                   "--run-dir", str(base / f"{name}-runs"), "--report", str(base / f"{name}.json"),
                   str(s.scripts / s.script), *s.args], env, str(base), timeout=s.timeout)


def line_of(script: str, text: str) -> str:
    """"script.py:N" of the first line of a run script holding `text`."""
    lines = (SCRIPTS / script).read_text().splitlines()
    return f"{script}:{next(i for i, ln in enumerate(lines, 1) if text in ln)}"
