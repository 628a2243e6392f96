"""A large log read at the speed of its bytes: a job of 256 ranks with 100 MB of output each is an
ordinary input, and reading it line by line in Python would take minutes.

What a verdict needs from a log is small: how each rank ended (its last traceback and what
follows it, a faulthandler dump), the launcher's summary, which ranks printed, and each rank's
last lines. So a large file is read in three ways:

- every byte once, by a substring search on the memory-mapped file (mmap.find, no copy): where
  each "Traceback (most recent call last):" starts and whose line it is (its byte offset orders
  the ranks' endings); faulthandler's "Fatal Python error:", an uncaught C++ exception
  ("terminate called after throwing"), NCCL's watchdog lines and torchrun's summary are looked
  for in the last 4 MiB only (each ends its process or its launcher: a log goes on little after
  them; one further back is missed, and the launcher's exit status still says how the rank
  ended);
- its first and last 8 KiB line by line (a console's last 256 KiB): the ranks that print, each
  rank's last lines, the launcher's lines (its summary ends the console);
- around each rank's last traceback and dump (a window of bounded lines from where the chain
  starts): the ending itself, read by the same RankText as a small file, which also sees whether
  the training went on after it.

Memory stays bounded by the head, the tail and the windows, whatever the size of the file: the
mapped file is searched SCAN_WINDOW bytes at a time, each window's pages given back once searched
(madvise), a line is read up to LINE_BYTES (a longer one is read as pieces, a file without a line
end is no different), and a line's start and end are looked for no further than LINE_BYTES away.
"""
from __future__ import annotations

from typing import IO, Any, Iterator

from ddp_doctor.postmortem.artifacts import LOOSE, MAX_NCCL_LINES, Artifacts, Source, feed, note_nccl_line, route
from ddp_doctor.postmortem.nccl_lines import MARKERS as NCCL_MARKERS
from ddp_doctor.postmortem.rank_text import HEADER, RankText

HEAD = 8 << 10  # read line by line: who prints
TAIL = 8 << 10  # read line by line: each rank's last lines; a console's: the launcher's summary too
CONSOLE_TAIL = 256 << 10
WINDOW_LINES = 50_000  # lines read after a rank's last traceback (other ranks' interleaved)
WINDOW_BYTES = 16 << 20
CHAIN_GAP = 400  # lines between two tracebacks of one rank that are one chain
CHAIN_BYTES = 1 << 20  # and at most this far apart
LATE = 4 << 20  # faulthandler's dumps and launcher summaries are looked for in the last 4 MiB
SUMMARY_LINES = 20_000  # lines of a launcher summary read where it is found before the tail
EARLY = 2 << 20  # NCCL's set-up lines are looked for in the first 2 MiB
_MARKERS = ((HEADER.encode(), "traceback"), (b"Fatal Python error:", "fatal"),
            (b"terminate called after throwing", "terminate"),
            *((m.encode(), "watchdog") for m in NCCL_MARKERS))
_SUMMARY = b"Failures:"
LINE_BYTES = 64 << 10  # a line longer than this is read as pieces of this size
SCAN_WINDOW = 64 << 20  # bytes of the mapped file searched at once, then given back


def _find_all(mm: Any, marker: bytes, start: int, end: int) -> Iterator[int]:
    """Each offset of `marker` in mm[start:end], in order, searched a window at a time; the pages of
    each window are dropped from the process (madvise DONTNEED; the page cache keeps them) once it
    is searched, so the resident memory of a search is one window whatever the file's size."""
    at = start
    while at < end:
        stop = min(end, at + SCAN_WINDOW)
        reach = min(end, stop + len(marker) - 1)  # a marker that starts in this window
        pos = mm.find(marker, at, reach)
        while pos >= 0:
            yield pos
            pos = mm.find(marker, pos + len(marker), reach)
        _drop(mm, at, stop)
        at = stop


def _drop(mm: Any, start: int, stop: int) -> None:
    import mmap
    first = start - start % mmap.PAGESIZE
    try:
        mm.madvise(mmap.MADV_DONTNEED, first, stop - first)
    except (AttributeError, OSError, ValueError):  # no madvise here: the pages stay the page cache's
        pass


def _line_at(mm: Any, pos: int, size: int) -> tuple[int, int, str]:
    """(where it starts, where it ends, its text) of the line holding `pos`, looked for no more than
    LINE_BYTES either side."""
    start = mm.rfind(b"\n", max(0, pos - LINE_BYTES), pos) + 1 or max(0, pos - LINE_BYTES)
    end = mm.find(b"\n", pos, min(size, pos + LINE_BYTES))
    end = end if end >= 0 else min(size, pos + LINE_BYTES)
    return start, end, mm[start:end].decode("utf-8", errors="replace")


def lines(f: IO[bytes]) -> Iterator[bytes]:
    """A file's lines from where it stands, each at most LINE_BYTES (a longer one comes in pieces)."""
    return iter(lambda: f.readline(LINE_BYTES), b"")


def scan_large(art: Artifacts, src: Source, f: IO[bytes], size: int) -> None:
    """Read a large text file into `src` (its ranks' outputs) and the launcher's lines. Positions
    (the order of the ranks' endings) are byte offsets from art.seq on."""
    import mmap

    seq0 = art.seq
    if src.kind == "console":
        art.scanned.append((src.path, src.labelled))
    tracebacks: dict[tuple, list[int]] = {}  # key -> offsets of its newest tracebacks, the newest last
    fatals: dict[tuple, int] = {}
    terminates: dict[tuple, int] = {}
    watchdog: list[tuple[tuple, str, int]] = []  # NCCL watchdog lines: (key, text, position)
    summaries: list[int] = []
    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        # every byte once per marker, at the speed of a substring search: where each starts, whose it is
        tail_size = CONSOLE_TAIL if src.kind == "console" else TAIL
        markers = [*_MARKERS, *([(_SUMMARY, "summary")] if src.kind == "console" else [])]
        for marker, what in markers:
            # a dump or an uncaught C++ exception ends its process, a summary its launcher: each is
            # near the end of a log
            for pos in _find_all(mm, marker, 0 if what == "traceback" else max(0, size - LATE), size):
                start, _, raw = _line_at(mm, pos, size)
                key, line = route(art, src, raw)
                if key is None and src.kind == "console" and what != "summary":
                    key = LOOSE  # kept with the file's other loose lines (inputs.py decides whose)
                if what == "summary" and key is None and start < size - tail_size:
                    summaries.append(start)  # before the tail (a job that restarted): read where it is
                elif key is not None and what == "traceback" and line.text.strip() == HEADER:
                    tracebacks.setdefault(key, []).append(start)
                    del tracebacks[key][:-16]
                elif key is not None and what == "fatal" and line.text.startswith("Fatal Python error:"):
                    fatals[key] = max(start, fatals.get(key, -1))
                elif key is not None and what == "terminate" and line.text.startswith("terminate called"):
                    terminates[key] = max(start, terminates.get(key, -1))
                elif key is not None and what == "watchdog":
                    watchdog.append((key, line.text, seq0 + start))
        # NCCL's set-up lines (the network it chose) come early in a log: one search
        pos = mm.find(b"NCCL ", 0, min(size, EARLY))
        while pos >= 0 and len(art.nccl_lines) < MAX_NCCL_LINES:
            _, end, text = _line_at(mm, pos, size)
            note_nccl_line(art, text)
            pos = mm.find(b"NCCL ", max(end, pos + 1), min(size, EARLY))
        # the head and the tail, line by line: who prints, the last lines, the launcher's summary
        head = mm[:HEAD]
        head = head[: head.rfind(b"\n") + 1]
        at = 0
        for raw in head.splitlines(keepends=True):
            feed(art, src, raw.decode("utf-8", errors="replace"), seq0 + at)
            at += len(raw)
        tail_from = max(size - tail_size, len(head))
        tail = mm[tail_from:]
        if tail_from > len(head):  # start at a line's start
            cut = tail.find(b"\n") + 1
            tail_from, tail = tail_from + cut, tail[cut:]
        at = tail_from
        for raw in tail.splitlines(keepends=True):
            feed(art, src, raw.decode("utf-8", errors="replace"), seq0 + at)
            at += len(raw)
    finally:
        mm.close()
    for start in summaries:
        _window(art, src, f, start, None, SUMMARY_LINES, seq0)
    # the endings come from the windows only: the head and the tail see parts of them
    for t in src.texts.values():
        t.finish()
        t.ending = t.dump = t.cpp = None
    for key, marks in tracebacks.items():
        first = _chain_start(f, marks)
        src.text(key).ending = _window(art, src, f, first, key, WINDOW_LINES, seq0 + first).ending
    for key, start in fatals.items():
        src.text(key).dump = _window(art, src, f, start, key, WINDOW_LINES, seq0 + start).dump
    for key, start in terminates.items():
        src.text(key).cpp = _window(art, src, f, start, key, WINDOW_LINES, seq0 + start).cpp
    for t in src.texts.values():
        t.waits = []  # the edges saw some of them: the search saw them all
    for key, text, at in sorted(watchdog, key=lambda w: w[2]):
        src.text(key)._note_watchdog(text, at)
    art.seq = seq0 + size


def _chain_start(f: IO[bytes], marks: list[int]) -> int:
    """Where the chain that ends with the newest traceback starts: Python prints the causes
    before it ("The above exception was the direct cause ..."), each a traceback of its own, a few
    lines apart; a traceback further back is an earlier, separate one."""
    first = marks[-1]
    for prev in reversed(marks[:-1]):
        if first - prev > CHAIN_BYTES:
            break
        f.seek(prev)
        if f.read(first - prev).count(b"\n") > CHAIN_GAP:
            break
        first = prev
    return first


def _window(art: Artifacts, src: Source, f: IO[bytes], offset: int, key: tuple | None, limit: int,
            seq: int) -> RankText:
    """Lines from `offset` on: `key`'s into a RankText of their own (the launcher's into its
    summary when `key` is None), until enough of them, `limit` lines, or WINDOW_BYTES."""
    from ddp_doctor.postmortem.rank_text import AFTER_ENDING, MAX_BLOCK
    w = RankText()
    f.seek(offset)
    read = mine = 0
    for raw in lines(f):
        read += len(raw)
        k, line = route(art, src, raw.decode("utf-8", errors="replace"))
        if key is None:
            if k is None:
                art.launcher.feed(line.text)
        elif (k if k is not None else LOOSE) == key:
            w.feed(line.text, seq + mine)
            mine += 1
            if mine > MAX_BLOCK + AFTER_ENDING + 2:
                break
        limit -= 1
        if limit <= 0 or read > WINDOW_BYTES:
            break
    w.finish()
    return w
