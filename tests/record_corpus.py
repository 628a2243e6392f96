"""Re-record the replay corpus (tests/corpus/, helpers/corpus.py): launch every scenario of
helpers/scenarios.py for real, three at a time, and keep the evidence file each report came with;
group "analyze": launch the jobs of helpers/analyze_scenarios.py (without ddp-doctor, and each
failure under it) and keep what they left for `ddp-doctor analyze`, with the run's evidence.
Run it after a change to what the ranks leave (records, ledgers, probes), to the scenarios, or to
the scripts they launch (the analysis reads them at the lines the artifacts name):

    python tests/record_corpus.py [GROUP ...]      (default: every group)

Each kept file is judged again at once and must give the verdict it recorded, whose exit code must
be the launch's own; a launch that left no evidence file, or one that does not replay, is named and
the exit status is 1; so is a plain job that left nothing. A scenario this machine cannot launch
(a Scenario's `needs`) keeps the recording it had.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import analyze_scenarios, corpus, scenarios  # noqa: E402
from helpers.procs import result_of, run_all  # noqa: E402

from ddp_doctor.training.evidence_file import verdict  # noqa: E402


def record(group: str) -> list[str]:
    """Launch the group's scenarios and keep their evidence; the problems, one line each."""
    problems = []
    names = []
    for name, s in scenarios.GROUPS[group].items():
        why = s.needs() if s.needs else None
        if why:
            print(f"{group}/{name}: {why}: its recording is left as it was", flush=True)
        else:
            names.append(name)
    with tempfile.TemporaryDirectory(prefix=f"ddp-doctor-corpus-{group}-") as tmp:
        base = Path(tmp)
        results = run_all({name: scenarios.launch(group, name, base) for name in names})
        for name in names:
            try:
                res = result_of(results, name)
            except BaseException as e:  # noqa: BLE001 - an overrun: named, the others kept
                problems.append(f"{group}/{name}: the launch failed: {e}")
                continue
            evidence = base / f"{name}.evidence.json"
            if not evidence.is_file():
                problems.append(f"{group}/{name}: no evidence file (exit {res.rc}): {res.output[-500:]}")
                continue
            corpus.keep(evidence, group, name, tmp)
            corpus.replayed.cache_clear()
            code, rep, was = corpus.replayed(group, name)
            root = (rep.get("root_cause") or {}).get("id")
            if verdict(rep, code) != was:  # the corpus must not depend on where it was recorded
                problems.append(f"{group}/{name}: replays to {verdict(rep, code)}, recorded {was}")
            if res.rc != was["exit_code"]:  # the replays' exit code stands for the launch's
                problems.append(f"{group}/{name}: exited {res.rc}, its verdict says {was['exit_code']}")
            print(f"{group}/{name}: exit {res.rc}, {rep.get('status')}, root cause {root}", flush=True)
    return problems


def record_analyze() -> list[str]:
    """Launch the plain jobs (and their runs under ddp-doctor), keep what they left; the problems."""
    from ddp_doctor.postmortem.analyze import analyze
    problems = []
    names = [n for n in analyze_scenarios.NAMES if analyze_scenarios.launchable(n)]
    for n in sorted(set(analyze_scenarios.NAMES) - set(names)):
        print(f"analyze/{n}: its launcher is not installed here: its recording is left as it was", flush=True)
    with tempfile.TemporaryDirectory(prefix="ddp-doctor-corpus-analyze-") as tmp:
        base = Path(tmp)
        per = {n: analyze_scenarios.launches(n, base) for n in names}
        results = run_all({key: job for jobs in per.values() for key, job in jobs.items()})
        for name in names:
            try:
                exits = {key: result_of(results, key).rc for key in per[name]}
            except BaseException as e:  # noqa: BLE001 - an overrun: named, the others kept
                problems.append(f"analyze/{name}: a launch failed: {e}")
                continue
            evidence = base / f"{name}.evidence.json"
            if f"run-{name}" in per[name] and not evidence.is_file():
                out = result_of(results, f"run-{name}").output[-500:]
                problems.append(f"analyze/{name}: the run left no evidence file (exit {exits[f'run-{name}']}): {out}")
                continue
            found = analyze_scenarios.artifacts(base, name)
            if not found:
                problems.append(f"analyze/{name}: the job left nothing (exit {exits[f'torchrun-{name}']})")
                continue
            corpus.keep_artifacts(name, found, tmp, exits, evidence if evidence.is_file() else None)
            with tempfile.TemporaryDirectory(prefix="ddp-doctor-corpus-check-") as check:
                got = corpus.materialized(name, Path(check))
                rep, _ = analyze([str(p) for p in got.values()])
            said = f"analyze/{name}: exits {exits}, analyzed: {(rep.get('root_cause') or {}).get('id')}"
            if evidence.is_file():
                corpus.live.cache_clear()
                code, live, was = corpus.live(name)
                if verdict(live, code) != was:
                    problems.append(f"analyze/{name}: the run replays to {verdict(live, code)}, recorded {was}")
                said += f", run: {(live.get('root_cause') or {}).get('id')}"
            print(said, flush=True)
    return problems


def main(argv: list[str]) -> int:
    known = sorted([*scenarios.GROUPS, "analyze"])
    groups = argv or known
    unknown = [g for g in groups if g not in known]
    if unknown:
        print(f"no such group: {', '.join(unknown)} (groups: {', '.join(known)})", file=sys.stderr)
        return 2
    problems = [p for g in groups for p in (record_analyze() if g == "analyze" else record(g))]
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
