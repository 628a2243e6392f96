"""The replay corpus: evidence files recorded from real launches of helpers/scenarios.py
(tests/record_corpus.py re-records them), committed as tests/corpus/GROUP/NAME.evidence.json, and
judged again here as `ddp-doctor analyze NAME.evidence.json` judges them: the diagnosis tests read
the verdict of a real run in milliseconds instead of launching it. The e2e tests keep what only a
launch shows (that the evidence is gathered, written, and replays to its verdict)."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1] / "corpus"
REPO = Path(__file__).resolve().parents[2]
CHECKOUT = "/checkout"  # this checkout, as the corpus names it (absolute: frames are judged by their paths)
SCRATCH = "/scratch"  # the directory a recording ran in, as the corpus names it


def path_of(group: str, name: str) -> Path:
    return ROOT / group / f"{name}.evidence.json"


def judged_again(path: str | Path) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """(the exit code, the report, the verdict recorded) of the evidence file at `path`, judged
    again now as `ddp-doctor analyze` judges it."""
    from ddp_doctor.training import evidence_file
    from ddp_doctor.training.job_report import replay
    doc = evidence_file.read(str(path))
    judged = replay(doc)
    return judged.code, judged.report, doc["verdict"]


@functools.lru_cache(maxsize=None)
def replayed(group: str, name: str) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """(the exit code, the report, the verdict recorded) of one recorded run, judged again now."""
    return judged_again(path_of(group, name))


def evidence_of(group: str, name: str) -> dict[str, Any]:
    """What one recorded run's ranks left (the evidence file's "evidence"): their outcomes, with
    the exception each raised as torch worded it."""
    return json.loads(path_of(group, name).read_text(encoding="utf-8"))["evidence"]


def as_recorded(path: str | Path) -> str:
    """A path of this checkout as the corpus names it, and so as a replayed verdict says it."""
    return str(path).replace(str(REPO), CHECKOUT)


def names(group: str) -> list[str]:
    return sorted(p.name[: -len(".evidence.json")] for p in (ROOT / group).glob("*.evidence.json"))


def normalized(text: str, scratch: str) -> str:
    """An evidence file's text with this checkout's path named CHECKOUT and the recording's scratch
    directory SCRATCH: the corpus reads the same wherever it was recorded."""
    return text.replace(scratch.rstrip("/"), SCRATCH).replace(str(REPO), CHECKOUT)


def keep(evidence: Path, group: str, name: str, scratch: str) -> Path:
    """Copy a run's evidence file into the corpus, normalized and indented (reviewable diffs)."""
    doc = json.loads(normalized(evidence.read_text(encoding="utf-8"), scratch))
    out = path_of(group, name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    return out


# The second kind of recording: what a job run without ddp-doctor left (helpers/analyze_scenarios.py),
# as `ddp-doctor analyze` reads it, under ANALYZED/NAME/: console.log, logs/ (torchrun's --log-dir
# tree), dumps/ (each rank's flight-recorder pickle), run.evidence.json (the same failure under
# `ddp-doctor run`, judged again for the verdict the analysis must give) and launch.json (the
# launches' exit statuses, each file's mtime: the analysis orders what it read by them). Paths are
# normalized as an evidence file's are, and given back to a copy made where a test reads it
# (materialized): the analysis reads the run scripts the artifacts name (their rank branches, init's
# arguments), as it would on the machine that ran the job.
ANALYZED = ROOT / "analyze"
KEPT_AS = {"console": "console.log", "logs": "logs", "dumps": "dumps"}  # an artifact's name in the corpus


def analyzed_names() -> list[str]:
    return sorted(p.name for p in ANALYZED.iterdir() if (p / "launch.json").is_file()) if ANALYZED.is_dir() else []


def _rewritten(path: Path, pairs: list[tuple[str, str]]) -> bytes:
    """A file's bytes with each (old, new) of `pairs` replaced in turn: in a flight-recorder dump's
    strings (it is loaded with analyze's own restricted unpickler and pickled again: a pickle
    encodes each string's length), else in its text."""
    raw = path.read_bytes()
    if raw[:1] != b"\x80":
        for old, new in pairs:
            raw = raw.replace(old.encode(), new.encode())
        return raw
    import pickle

    from ddp_doctor.training.run.nccl_dumps import load_why
    data, why = load_why(str(path))
    assert data is not None, f"{path}: {why}"

    def swap(v: Any) -> Any:
        if isinstance(v, str):
            for old, new in pairs:
                v = v.replace(old, new)
            return v
        if isinstance(v, list):
            return [swap(x) for x in v]
        if isinstance(v, dict):
            return {swap(k): swap(x) for k, x in v.items()}
        return v
    return pickle.dumps(swap(data), protocol=2)


def _files(src: Path) -> list[tuple[Path, str]]:
    """(file, its path under `src`: "" for `src` itself) of a file or a tree."""
    if src.is_file():
        return [(src, "")]
    return sorted((f, f.relative_to(src).as_posix()) for f in src.rglob("*") if f.is_file())


def keep_artifacts(name: str, found: dict[str, Path], scratch: str, exits: dict[str, int],
                   evidence: Path | None) -> Path:
    """Replace the corpus's recording of the plain job `name` with what it left (`found`: kind ->
    its file or tree, helpers/analyze_scenarios.artifacts), normalized; `evidence`: its run's."""
    import shutil
    out = ANALYZED / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    pairs = [(scratch.rstrip("/"), SCRATCH), (str(REPO), CHECKOUT)]
    mtimes = {}
    for kind, src in sorted(found.items()):
        for f, rel in _files(src):
            kept = out / KEPT_AS[kind] / rel if rel else out / KEPT_AS[kind]
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_bytes(_rewritten(f, pairs))
            mtimes[kept.relative_to(out).as_posix()] = f.stat().st_mtime
    if evidence is not None:
        doc = json.loads(normalized(evidence.read_text(encoding="utf-8"), scratch))
        (out / "run.evidence.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    launch = {"exit_codes": exits, "mtimes": mtimes}
    (out / "launch.json").write_text(json.dumps(launch, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return out


def launch_of(name: str) -> dict[str, Any]:
    """The recording's launch.json: {"exit_codes": {"torchrun-NAME"/"run-NAME": status}, "mtimes"}."""
    return json.loads((ANALYZED / name / "launch.json").read_text(encoding="utf-8"))


def materialized(name: str, base: Path) -> dict[str, Path]:
    """The recorded artifacts of `name` written under `base` where the job left them under its
    scratch directory (helpers/analyze_scenarios.ARTIFACTS), with their paths and mtimes: kind ->
    path, for the kinds it left."""
    import os

    from helpers.analyze_scenarios import ARTIFACTS
    kept = ANALYZED / name
    pairs = [(SCRATCH, str(base)), (CHECKOUT, str(REPO))]
    mtimes = launch_of(name)["mtimes"]
    out = {}
    for kind, as_kept in KEPT_AS.items():
        if not (kept / as_kept).exists():
            continue
        dest = out[kind] = base / ARTIFACTS[kind].format(name=name)
        for f, rel in _files(kept / as_kept):
            to = dest / rel if rel else dest
            to.parent.mkdir(parents=True, exist_ok=True)
            to.write_bytes(_rewritten(f, pairs))
            t = mtimes[f.relative_to(kept).as_posix()]
            os.utime(to, (t, t))
    return out


@functools.lru_cache(maxsize=None)
def live(name: str) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """(the exit code, the report, the verdict recorded) of the run under ddp-doctor recorded with
    the plain job `name`, judged again now."""
    from ddp_doctor.training import evidence_file
    from ddp_doctor.training.job_report import replay
    doc = evidence_file.read(str(ANALYZED / name / "run.evidence.json"))
    judged = replay(doc)
    return judged.code, judged.report, doc["verdict"]


def unreplayed(group: str, expected: list[str]) -> list[str]:
    """What is wrong with a group's recordings: the scenarios `expected` that are not recorded (or
    recordings of none of them), and each recording whose replay gives another verdict than the one
    it recorded; [] when every scenario replays to its verdict."""
    from ddp_doctor.training.evidence_file import verdict
    recorded = names(group)
    problems = [f"{group}: recorded {recorded}, expected {sorted(expected)}"] if recorded != sorted(expected) else []
    for name in recorded:
        code, rep, was = replayed(group, name)
        if verdict(rep, code) != was:
            problems.append(f"{group}/{name}: replays to {verdict(rep, code)}, recorded {was}")
    return problems
