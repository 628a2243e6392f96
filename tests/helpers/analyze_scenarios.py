"""Jobs launched without ddp-doctor (plain torchrun, mpirun, `python script.py`) whose artifacts
`ddp-doctor analyze` reads, each failure also launched under `ddp-doctor run` for the root cause the
analysis must name alike. tests/record_corpus.py launches them all and keeps what they left
(tests/corpus/analyze/NAME/, helpers/corpus.py) for tests/postmortem/test_analyze_recorded.py;
tests/postmortem/test_analyze_e2e.py launches a few to analyze a fresh tree.

Under a base directory a plain job leaves NAME/console.log (its console: the ranks' lines and the
agent's summary in one stream, as a terminal or a job's log has them), NAME-logs (torchrun's
--log-dir tree) and NAME-dumps (each rank's flight recorder); its run under ddp-doctor leaves
NAME.json with NAME.evidence.json beside it.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from helpers.procs import DDP, Launch, clean_env, free_port

SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"
WRAPPERS = Path(__file__).resolve().parents[1] / "postmortem" / "scripts"
FR_DUMPING = WRAPPERS / "fr_dumping.py"
RECORDED = WRAPPERS / "recorded.py"
MPI_ENV = WRAPPERS / "mpi_env.py"

# name -> (script, extra environment, `run`'s extra options)
SHAPES: dict[str, tuple[str, dict[str, str], list[str]]] = {
    "raises": ("rank1_raises.py", {}, []),
    "segfault": ("rank1_segfaults.py", {}, []),
    "killed": ("rank_oom_killed.py", {"OOM_RANK": "0"}, []),
    "worker": ("rank1_worker_raises.py", {}, []),  # raised in a DataLoader worker, wrapped by the loop
    "after_group": ("rank1_fails_after_the_group.py", {}, []),  # raised after destroy_process_group
    "exited": ("rank1_sys_exit.py", {}, []),  # rank 1's sys.exit(3): no Python error, only a status
    "ok": ("ok_allreduce.py", {}, []),
}
FAILED = [s for s in SHAPES if s != "ok"]
# what the --log-dir tree alone shows: the traceback (the same root cause), or nothing of the
# ending (a kill, a crash without faulthandler, an exit status: only the launcher's summary says)
TREE_ALONE = {"raises": "same", "worker": "same", "after_group": "same", "segfault": "DDP950", "killed": "DDP950",
              "exited": "DDP953"}
# the shapes only a ledger tells apart: under plain torchrun each rank writes its flight recorder
# with torch's own dump call when it raises, ends or is stopped (postmortem/scripts/fr_dumping.py),
# and the process group's timeout (the script's own init_process_group(timeout=...)) ends a hang
LEDGER_SHAPES: dict[str, tuple[str, dict[str, str], list[str]]] = {
    "uneven": ("uneven_inputs.py", {}, []),
    "sizes": ("size_mismatch.py", {}, []),
    "barrier_in_block": ("barrier_in_rank0_block.py", {}, ["--hang-timeout", "6"]),
    "rank0_only": ("rank0_only_allreduce.py", {}, ["--hang-timeout", "6"]),
    "nan_break": ("leaves_loop_on_nan.py", {}, ["--hang-timeout", "6"]),
    "eval_rank0": ("rank0_evaluates_after_training.py", {}, ["--hang-timeout", "6"]),
    "slow_checkpoint": ("slow_checkpoint.py", {}, []),  # the group's own timeout (5 s) ends the wait
    "blocked_on_queue": ("rank1_blocks_on_queue.py", {}, ["--hang-timeout", "6"]),
}
# init's arguments: run judges the calls it recorded; analyze, what each rank's init waited for
# when the group's timeout (PG_TIMEOUT, as the script's own would) ended it
INIT_SHAPES: dict[str, tuple[str, dict[str, str], list[str]]] = {
    "handset_rank": ("handset_rank.py", {}, []),
    "env_world": ("env_world_size.py", {}, []),
}
# "raises" under other launches (torchrun --redirects 3 with @record, plain mpirun --tag-output),
# and a job of torch.multiprocessing.spawn started as `python script.py`
OTHERS = ("raises_recorded", "raises_mpirun", "spawn")
NAMES = [*SHAPES, *LEDGER_SHAPES, *INIT_SHAPES, *OTHERS]
# the run under ddp-doctor whose verdict a job's analysis must give: its own, or that of the same
# failure launched by torchrun; "ok" has none (its analysis can only say that nothing failed)
LIVE = {**{n: n for n in NAMES if n not in ("ok", "raises_recorded", "raises_mpirun")},
        "raises_recorded": "raises", "raises_mpirun": "raises"}
# what a plain job left, under a base directory; "printed" (EXIT_TOGETHER_DIR) is the script's own
ARTIFACTS = {"console": "{name}/console.log", "logs": "{name}-logs", "dumps": "{name}-dumps"}


def artifacts(base: Path, name: str) -> dict[str, Path]:
    """Where the plain job `name` left each of its artifacts under `base` (those it left only)."""
    found = {kind: base / where.format(name=name) for kind, where in ARTIFACTS.items()}
    return {kind: p for kind, p in found.items() if p.exists()}


def launchable(name: str) -> bool:
    """Whether this machine can launch the job (mpirun is not everywhere)."""
    return name != "raises_mpirun" or shutil.which("mpirun") is not None


def launches(name: str, base: Path) -> dict[str, Launch]:
    """The launches of one job under `base`: "torchrun-NAME", the plain job (whatever launcher), and
    "run-NAME", the same script under `ddp-doctor run` (for the jobs LIVE names after themselves)."""
    if name == "spawn":  # one process's console, both ways
        spawn = str(SCRIPTS / "spawn_child_fails.py")
        return {"run-spawn": Launch([*DDP, "run", "--timeout", "30", "--report", str(base / "spawn.json"), spawn],
                                    clean_env(TEST_PORT=str(free_port())), str(base)),
                "torchrun-spawn": Launch(["sh", "-c", '"$@" > console.log 2>&1', "sh", sys.executable, spawn],
                                         clean_env(TEST_PORT=str(free_port())), str(_mkdir(base / "spawn")))}
    raises = str(SCRIPTS / SHAPES["raises"][0])
    if name == "raises_recorded":  # no tee: the ranks' output only in the tree; each rank's error.json
        return {"torchrun-raises_recorded": Launch(
            ["sh", "-c", '"$@" > console.log 2>&1', "sh", sys.executable, "-m", "torch.distributed.run",
             "--standalone", "--nproc-per-node", "2", "--log-dir", str(base / "raises_recorded-logs"),
             "--redirects", "3", str(RECORDED), raises], clean_env(), str(_mkdir(base / "raises_recorded")))}
    if name == "raises_mpirun":  # the script's environment set as a team's launch script does
        return {"torchrun-raises_mpirun": Launch(
            ["sh", "-c", '"$@" > console.log 2>&1', "sh", "mpirun", "-np", "2", "--oversubscribe", "--tag-output",
             "-x", "MASTER_PORT", sys.executable, str(MPI_ENV), raises],
            clean_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", MASTER_PORT=str(free_port())),
            str(_mkdir(base / "raises_mpirun")))}
    script, extra, run_extra = {**SHAPES, **LEDGER_SHAPES, **INIT_SHAPES}[name]
    env = clean_env(**extra)
    out = {}
    if name in LIVE:
        out[f"run-{name}"] = Launch([*DDP, "run", "--nproc-per-node", "2", "--timeout", "30", *run_extra,
                                     "--report", str(base / f"{name}.json"), str(SCRIPTS / script)], env, str(base))
    target = [str(SCRIPTS / script)]
    if name in LEDGER_SHAPES or name in INIT_SHAPES:
        target = [str(FR_DUMPING), *target]
        env = {**env, "FR_DUMP_DIR": str(_mkdir(base / f"{name}-dumps")), "TORCH_FR_BUFFER_SIZE": "2000",
               "PG_TIMEOUT": "8"}
    if name in INIT_SHAPES:  # each rank's own timeout printed before torchrun stops the other
        env = {**env, "EXIT_TOGETHER_DIR": str(_mkdir(base / f"{name}-printed"))}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "--log-dir", str(base / f"{name}-logs"), "--tee", "3", *target]
    # one stream, as a terminal or a job's log has it: the ranks' lines and the agent's summary interleaved
    out[f"torchrun-{name}"] = Launch(["sh", "-c", '"$@" > console.log 2>&1', "sh", *torchrun], env,
                                     str(_mkdir(base / name)))
    return out


def _mkdir(p: Path) -> Path:
    p.mkdir()
    return p
