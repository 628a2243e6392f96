"""Scenarios launched for real: each a 2-rank gloo script under `ddp-doctor run` with its options.
The e2e tests launch the ones whose gathering they check; tests/record_corpus.py launches them all
to re-record the replay corpus (helpers/corpus.py) that the diagnosis tests judge again.
"""
from __future__ import annotations

from pathlib import Path

from helpers.procs import DDP, Launch, clean_env

SCRIPTS = Path(__file__).resolve().parents[1] / "run_scripts"

# group -> name -> (script, extra options); "cause": failures the collective ledger explains, and
# correct patterns that must stay clean
GROUPS: dict[str, dict[str, tuple[str, list[str]]]] = {
    "cause": {
        "uneven": ("uneven_inputs.py", []),
        "sizes": ("size_mismatch.py", []),
        "slow_checkpoint": ("slow_checkpoint.py", []),
        "rank0_only": ("rank0_only_allreduce.py", ["--hang-timeout", "6"]),
        "handset_rank": ("handset_rank.py", []),
        "env_world": ("env_world_size.py", []),
        "correct": ("correct_patterns.py", []),
        "barrier_in_block": ("barrier_in_rank0_block.py", ["--hang-timeout", "6"]),
        "extra_eval": ("rank0_evaluates_after_training.py", []),
        "nan_break": ("leaves_loop_on_nan.py", ["--hang-timeout", "6"]),
        "metric_abort": ("metric_in_rank0_block.py", []),
        "skipped_abort": ("metric_skipped_on_one_rank.py", []),
        "ran_out": ("uneven_loader_then_barrier.py", ["--hang-timeout", "8"]),
        "eval_helper": ("evaluates_on_rank0_only.py", ["--hang-timeout", "6"]),
        "gather_sizes": ("gathers_rank_sized.py", []),
    },
}


def launch(group: str, name: str, base: Path) -> Launch:
    """The launch of one scenario: its report at base/NAME.json (its evidence beside it), its run
    directory kept under base/NAME-runs."""
    script, extra = GROUPS[group][name]
    return Launch([*DDP, "run", "--nproc-per-node", "2", "--timeout", "30", "--hang-timeout", "60", *extra,
                   "--run-dir", str(base / f"{name}-runs"), "--report", str(base / f"{name}.json"),
                   str(SCRIPTS / script)], clean_env(), str(base))


def line_of(script: str, text: str) -> str:
    """"script.py:N" of the first line of a run script holding `text`."""
    lines = (SCRIPTS / script).read_text().splitlines()
    return f"{script}:{next(i for i, ln in enumerate(lines, 1) if text in ln)}"
