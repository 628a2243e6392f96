"""The artifacts a job left, found by content: directories are walked, each file is read once,
line by line (a log of any size in bounded memory), and sorted into what it is:

- a flight-recorder dump (torch's pickle, or its JSON form): read with the restricted unpickler
  of training/run/nccl_dumps.py, never a plain pickle.load; the rank is the file name's number;
- torchelastic's error file (`error.json`): the rank from torchrun's tree
  (`attempt_N/<local rank>/error.json`) or from the summary that names the file;
- text: each line's rank prefix says whose it is (postmortem/log_lines.py); a line without one is
  the rank's whose file it is (torchrun's `attempt_N/<local rank>/stdout.log|stderr.log`, a file
  named `rank3.log`), else the launcher's (a console);
- anything else (binary, unreadable, a torchelastic error file that is cut or holds other types than
  torch writes): skipped, and said so (DDP951).

Regular files only: what a walk finds that is not one (a FIFO, a device, a socket) is skipped and
said so, never opened (facts/env_values.not_regular: os.stat alone); stdin ("-") is the one stream
read. Every read is bounded: the first SNIFF bytes tell what a file is, an error file is read up to
MAX_JSON_BYTES, a log of any size in bounded memory (a large one by postmortem/large_text.py).
"""
from __future__ import annotations

import os
import re
import sys
from typing import IO, Iterable, Iterator

from ddp_doctor.facts.env_values import NotRegularFile, not_regular, open_regular
from ddp_doctor.postmortem.artifacts import LOOSE, Artifacts, Source, feed
from ddp_doctor.postmortem.large_text import LINE_BYTES, lines
from ddp_doctor.postmortem.launcher_text import read_error_file
from ddp_doctor.postmortem.log_lines import has_rank_prefix, srun_labelled
from ddp_doctor.postmortem.rank_text import RankText

SNIFF = 8192
SMALL_FILE = 4 << 20  # read line by line whole; a larger file is scanned (postmortem/large_text.py)
MAX_FILES = 100_000  # a walk past this many files stops, and says so
_TREE = re.compile(r"(?:^|[/\\])(?P<node>[^/\\]+)[/\\]attempt_(?P<attempt>\d{1,9})[/\\](?P<local>\d{1,9})[/\\]"
                   r"(?P<name>stdout\.log|stderr\.log|error\.json)$")
_RANK_NAME = re.compile(r"(?:^|[^A-Za-z0-9])rank[_-]?(?P<n>\d{1,7})(?:[^0-9]|$)", re.I)
# SageMaker's hosts are algo-1, algo-2, ...: a host's stream saved as algo-2.log is that host's
_HOST_NAME = re.compile(r"(?P<host>algo-\d+)(?:[-_.][\w.-]*)?\.(?:log|txt)")
# torchelastic's error file starts {"message": {  (a UTF-8 byte-order mark allowed)
_ERROR_FILE_START = re.compile(rb'^(?:\xef\xbb\xbf)?\s*\{\s*"message"\s*:\s*\{')
_DUMP_NAME = re.compile(r"(?P<n>\d{1,7})(?:\.json|\.pkl|\.pickle)?$")


def _run_id(tree: re.Match[str]) -> str:
    """torchrun's run directory is `<run id>_<random>`: one per node per job; the run id is the
    job's (--rdzv-id, or a fresh uuid under --standalone), the same on every node."""
    return tree.group("node").rsplit("_", 1)[0]


def one_job(art: Artifacts, files: list[str]) -> list[str]:
    """The files of one job: torchrun's trees of several run ids are several jobs (the newest is
    read, the others named in art.jobs_left); of a job's restarts, each node's latest attempt
    (the one that ended the job; art.attempts says how many there were)."""
    trees = {p: m for p in files if (m := _TREE.search(p)) is not None}
    if not trees:
        return files
    newest: dict[str, float] = {}
    for p, m in trees.items():
        try:
            newest[_run_id(m)] = max(newest.get(_run_id(m), 0.0), os.path.getmtime(p))
        except OSError:
            continue
    job = max(newest, key=lambda r: newest[r]) if newest else None
    art.jobs_left = sorted(r for r in newest if r != job)
    last: dict[str, int] = {}
    for m in trees.values():
        if _run_id(m) == job:
            node = _node_of(m)
            last[node] = max(last.get(node, 0), int(m.group("attempt")))
    art.attempts = max(last.values(), default=0) + 1
    art.job = job
    return [p for p in files if p not in trees or (_run_id(trees[p]) == job
                                                    and int(trees[p].group("attempt")) == last.get(_node_of(trees[p])))]


def _console(path: str) -> bool:
    """Whether a file is a console: text outside torchrun's tree, not a rank's own file, not a
    dump or an error file (read_one tells them by the same marks)."""
    if path == "-" or _TREE.search(path) or _RANK_NAME.search(os.path.basename(path)):
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF)
    except OSError:
        return False
    return not (head[:1] == b"\x80" or head.lstrip()[:1] == b"{" or b"\x00" in head)


def one_console_job(art: Artifacts, files: list[str]) -> list[str]:
    """The files without the consoles of other jobs (postmortem/console_jobs.py: named in
    art.consoles_left) and without second copies of a console (skipped, and said so)."""
    from ddp_doctor.postmortem import console_jobs
    digests = [d for p in files if _console(p) and (d := console_jobs.digest(p)) is not None]
    if len(digests) < 2:
        return files
    kept, left, copies = console_jobs.one_job(digests)
    if left:
        art.consoles_read, art.consoles_left = kept, left
    for path, of in copies.items():
        art.skipped.append((path, f"a copy of {of}, read once"))
    out = set(left) | set(copies)
    return [p for p in files if p not in out]


def _node_of(tree: re.Match[str]) -> str:
    return tree.string[: tree.start("node") + len(tree.group("node"))]


def walk(paths: Iterable[str], skipped: list[tuple[str, str]] | None = None) -> Iterator[str]:
    """The regular files under each path, in a stable order ("-" is stdin). What is not a regular
    file (a FIFO, a device, a socket) or cannot be stat'ed is never opened: it goes to `skipped`
    with what it is."""
    count = 0
    for p in paths:
        if p == "-":
            yield p
            continue
        if not os.path.isdir(p):
            if _regular(p, skipped):
                yield p
            continue
        for root, dirs, files in os.walk(p):
            dirs.sort()
            for name in sorted(files):
                count += 1
                if count > MAX_FILES:
                    return
                path = os.path.join(root, name)
                if _regular(path, skipped):
                    yield path


def _regular(path: str, skipped: list[tuple[str, str]] | None) -> bool:
    try:
        kind = not_regular(path)
    except OSError as e:  # a dangling link, no permission, gone since the walk saw it
        why = f"unreadable: {e.strerror or e}"
    else:
        if kind is None:
            return True
        why = f"{kind}, not a regular file: not opened"
    if skipped is not None:
        skipped.append((path, why))
    return False


def read_all(paths: Iterable[str], art: Artifacts | None = None) -> Artifacts:
    """Every input read into `art` (a new one by default): a caller that passes its own sees how
    far the reading got when it is interrupted (`read`, `skipped`, `stage`)."""
    art = Artifacts() if art is None else art
    art.stage = "walking the inputs"
    files = list(walk(paths, art.skipped))
    if len(files) >= MAX_FILES:
        art.skipped.append(("(the walk)", f"stopped after {MAX_FILES} files"))
    art.stage = "telling the inputs' jobs apart"
    for path in one_console_job(art, one_job(art, files)):
        art.stage = f"reading {'<stdin>' if path == '-' else path}"
        read_one(art, path)
    art.stage = None
    art.launcher.finish()
    return art


def read_one(art: Artifacts, path: str) -> None:
    if path == "-":
        _read_text(art, "<stdin>", sys.stdin.buffer, kind="console")
        return
    try:
        with open_regular(path) as f:
            head = f.read(SNIFF)
            art.mtimes[path] = os.fstat(f.fileno()).st_mtime
            tree = _TREE.search(path)
            if head[:1] == b"\x80" or (head.lstrip()[:1] == b"{" and b'"entries"' in head):
                _read_dump(art, path)
                return
            if head.lstrip()[:1] == b"{" and b'"message"' in head:
                if _read_error_file(art, path, tree, head):
                    return
            if b"\x00" in head:
                art.skipped.append((path, "binary, not a log, an error file or a flight-recorder dump"))
                return
            f.seek(0)
            kind = "local" if tree else "rank" if _RANK_NAME.search(os.path.basename(path)) else "console"
            _read_text(art, path, f, kind=kind, tree=tree, size=os.fstat(f.fileno()).st_size)
    except NotRegularFile as e:
        art.skipped.append((path, f"{e}: not opened"))
    except OSError as e:
        art.skipped.append((path, f"unreadable: {e.strerror or e}"))


def _read_dump(art: Artifacts, path: str) -> None:
    from ddp_doctor.training.run.nccl_dumps import as_ledger, load_why
    data, why = load_why(path)
    m = _DUMP_NAME.search(os.path.basename(path))
    if data is None:
        art.skipped.append((path, f"not a readable flight-recorder dump: {why}"))
    elif m is None:
        art.skipped.append((path, "a flight-recorder dump whose file name carries no rank number"))
    else:
        art.ledgers[int(m.group("n"))] = as_ledger(path, data, int(m.group("n")))
        art.read.append(path)


def _read_error_file(art: Artifacts, path: str, tree: re.Match[str] | None, head: bytes) -> bool:
    """Whether `path` was taken as torchelastic's error file: read, or skipped (said so) when it is
    one by its start ({"message": {...) but cut, too large, or holding other types than torch
    writes. A file of JSON lines that merely starts so is text (False)."""
    from ddp_doctor.facts.env_values import bounded_json, read_text_file
    try:
        data = bounded_json(read_text_file(path))
    except OSError as e:
        art.skipped.append((path, f"unreadable: {e.strerror or e}"))
        return True
    except ValueError as e:
        if not _ERROR_FILE_START.match(head) or _json_lines(head):
            return False
        art.skipped.append((path, f"a torchelastic error file that could not be read: it is {e}"))
        return True
    try:
        ef = read_error_file(path, data)
    except ValueError as e:
        art.skipped.append((path, f"a torchelastic error file that could not be read: {e}"))
        return True
    if ef is None:
        return False
    key: object = (_node(path, tree), int(tree.group("local"))) if tree else path
    art.error_files[key] = ef
    art.read.append(path)
    return True


def _json_lines(head: bytes) -> bool:
    """Whether a file's first bytes are JSON lines (a structured log): a first line that is a whole
    JSON value, and more after it. torch writes its error file as one JSON document."""
    from ddp_doctor.facts.env_values import bounded_json
    first, newline, rest = head.partition(b"\n")
    if not newline or not rest.strip():
        return False
    try:
        bounded_json(first.decode("utf-8", errors="replace"))
    except ValueError:
        return False
    return True


def _node(path: str, tree: re.Match[str] | None) -> str:
    """torchrun's run directory (one agent, one node, one run) for a file of its tree."""
    return _node_of(tree) if tree else path


def _read_text(art: Artifacts, path: str, f: IO[bytes], *, kind: str, tree: re.Match[str] | None = None,
               size: int | None = None) -> None:
    src = Source(path=path, node=_node(path, tree) if tree else path, kind=kind,
                 own_local=int(tree.group("local")) if tree else None)
    sample = []  # srun's labels, and whether lines carry ranks, are known from a file's first lines
    # a file up to SMALL_FILE is bounded by its size; stdin and a large file by LINE_BYTES a line
    line_bytes = -1 if size is not None and size <= SMALL_FILE else LINE_BYTES
    while len(sample) < 50 and (raw := f.readline(line_bytes)):
        sample.append(raw.decode("utf-8", errors="replace"))
    src.labelled = srun_labelled(sample)
    named_host = _HOST_NAME.fullmatch(os.path.basename(path))
    src.host = named_host.group("host") if named_host else None
    if kind == "rank" and (src.labelled or any(has_rank_prefix(s) for s in sample)):
        src.kind = "console"  # a console whose name holds "rank3": its lines say whose they are
    named = _RANK_NAME.search(os.path.basename(path))
    src.own_rank = int(named.group("n")) if src.kind == "rank" and named else None
    if src.own_local is not None:  # the rank's file is here, even empty (it printed nothing)
        src.text(("local", src.node, src.own_local))
    elif src.own_rank is not None:
        src.text(("rank", src.own_rank))
    launcher_before = art.launcher.state()
    if size is not None and size > SMALL_FILE:
        from ddp_doctor.postmortem.large_text import scan_large
        scan_large(art, src, f, size)
    else:
        for text in sample:
            art.seq += 1
            feed(art, src, text, art.seq)
        for raw in (f if line_bytes < 0 else lines(f)):
            art.seq += 1
            feed(art, src, raw.decode("utf-8", errors="replace"), art.seq)
        for t in src.texts.values():
            t.finish()
    loose = src.texts.pop(LOOSE, None)
    if loose is not None and loose.lines and not src.texts and art.launcher.state() == launcher_before:
        # no line named a rank and no launcher summarised ranks: one process's output, rank 0 of 1
        src.texts[("rank", 0)] = loose
        art.lone.append(path)
    for key, t in src.texts.items():
        t.sources.add(src.node)
        target = art.rank_text(key[1]) if key[0] == "rank" else art.local_texts.setdefault((key[1], key[2]), RankText())
        target.merge(t)
    art.read.append(path)
