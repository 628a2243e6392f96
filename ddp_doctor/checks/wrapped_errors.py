"""The real error inside a wrapped exception: text in, structured out.

Some errors reach the training script only wrapped in another one, whose first line says nothing
about what went wrong:

- a DataLoader worker's error, re-raised in the training process: "Caught ValueError in DataLoader
  worker process 0.\\nOriginal Traceback (most recent call last): ..." (torch's ExceptionWrapper,
  also "in pin memory thread for device N" and DataParallel's "in replica N on device M");
- torch.multiprocessing.spawn's ProcessRaisedException: "-- Process 1 terminated with the following
  error:\\nTraceback ...";
- exceptions raised `from` another ("The above exception was the direct cause of the following
  exception"), concurrent.futures' and multiprocessing.pool's remote tracebacks among them: the
  innermost cause is the real error. An error raised while handling another ("During handling of
  the above exception") is not unwrapped: a fallback that failed is an error of its own;
- torchelastic's ChildFailedError, whose summary quotes the failed child's error file
  ({"message": {"message": "<Type>: <msg>", "extraInfo": {"py_callstack": "..."}}});
- Ray Train's WorkerGroupError (TrainingFailedError), raised by `trainer.fit()` in the driver:
  "Training failed due to worker errors:\n[Rank 1 Error Snippet]:\nTraceback ...", one snippet per
  failed worker, named by its world rank (the first is taken).

`real_error` unwraps them, layer by layer, to the innermost error: its type, its message, its own
traceback and the innermost frame of the user's code (outside torch, site-packages and the
directories the caller names), with each wrapper kept. Pure: nothing here reads a file or imports
torch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from ddp_doctor.facts.env_values import bounded_json

_HEADER = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+?)\s*$')
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::(?: (?P<msg>.*)|$)|$)")
_WORKER = re.compile(r"Caught (?P<type>[\w.]+) (?P<where>in .+?)\.\nOriginal (?P<rest>Traceback \(most recent call "
                     r"last\):\n.*)", re.S)
_SPAWN = re.compile(r"-- Process (?P<n>\d+) terminated with the following error:\n(?P<rest>.*)", re.S)
_RAY = re.compile(r"\[Rank (?P<n>\d+) Error Snippet\]:\n(?P<rest>Traceback \(most recent call last\):\n.*?)"
                  r"(?=\n\[Rank \d+ Error Snippet\]:|\Z)", re.S)
_CHAIN = re.compile(r"\n[ \t]*(?P<how>The above exception was the direct cause of the following exception:"
                    r"|During handling of the above exception, another exception occurred:)[ \t]*\n")
_CLASS_NAME = re.compile(r"^_*[A-Z]\w*$")
_ELASTIC_ROOT = re.compile(r"Root Cause \(first observed failure\):\n(?P<block>.*)", re.S)
_ELASTIC_FIELD = re.compile(r"^\s*(?P<key>rank|traceback)\s*: ?(?P<value>.*)$")
# Frames of these are never the user's code, on any machine: installed packages, the standard library.
_LIBRARY = re.compile(r"[/\\](site-packages|dist-packages)[/\\]|[/\\]lib[/\\]python\d+(\.\d+)?[/\\]|^<frozen ")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass(frozen=True)
class Wrapper:
    """One layer around the real error."""
    kind: str            # dataloader_worker, worker, spawn, ray_worker, cause, remote, torchelastic
    by: str              # the wrapping exception: "Type: its first line"
    where: str           # in words: "in DataLoader worker process 0", "in process 1 of torch.multiprocessing.spawn"
    process: int | None  # the worker, spawn process or torchelastic rank it names

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "by": self.by, "where": self.where, "process": self.process}


@dataclass(frozen=True)
class RealError:
    """The innermost error of a wrapped exception."""
    type: str
    message: str
    traceback: str                # its own traceback text ("Traceback ...\nType: message")
    frames: tuple[Frame, ...]     # outermost first, as Python prints them
    raised_at: Frame | None       # the innermost frame of the user's code, None when all are libraries'
    wrappers: tuple[Wrapper, ...]  # outermost first

    @property
    def summary(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type

    @property
    def wrapped_by(self) -> str:
        return self.wrappers[0].by if self.wrappers else ""

    def text(self) -> str:
        """What signatures are matched against, as rank_endings.failure_text builds it for a rank."""
        return f"{self.summary}\n{self.traceback}"

    def spawn_process(self) -> int | None:
        return next((w.process for w in self.wrappers if w.kind == "spawn"), None)

    def ray_rank(self) -> int | None:
        """The world rank of the Ray Train worker that raised it (None: not a Ray worker's error)."""
        return next((w.process for w in self.wrappers if w.kind == "ray_worker"), None)

    def describe_wrapping(self, skip: tuple[str, ...] = ()) -> str:
        """The layers in words, outermost first ("in DataLoader worker process 0"), but those of
        the kinds in `skip`."""
        return "; ".join(w.where for w in self.wrappers if w.kind not in skip)


@dataclass(frozen=True)
class _Error:
    type: str
    message: str
    traceback: str
    frames: tuple[Frame, ...] = ()


def _short_type(name: str) -> str:
    """"torch.multiprocessing.spawn.ProcessRaisedException" -> "ProcessRaisedException", as
    type(e).__name__ says it."""
    return name.rsplit(".", 1)[-1]


def _first_line(text: str, limit: int = 200) -> str:
    """The first line that says something (not a rule of "=" or "-"), at most `limit` characters."""
    line = next((ln.strip() for ln in text.splitlines() if re.search(r"\w", ln)), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _by(err: _Error) -> str:
    first = _first_line(err.message)
    return f"{err.type}: {first}" if first else err.type


def parse_traceback(text: str) -> _Error | None:
    """One block as Python prints it ("Traceback (most recent call last):", frames, then "Type:
    message", the message possibly on several lines), or a bare "Type: message" (an exception
    without a traceback, such as concurrent.futures' _RemoteTraceback). None when there is no
    exception line."""
    lines = text.strip("\n").splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return None
    indent = len(lines[0]) - len(lines[0].lstrip())
    lines = [ln[indent:] if ln[:indent].strip() == "" else ln.lstrip() for ln in lines]
    frames: list[Frame] = []
    start = 0
    if lines[0].strip() == _HEADER:
        start = len(lines)
        for i, ln in enumerate(lines[1:], 1):
            m = _FRAME.match(ln)
            if m:
                frames.append(Frame(m["file"], int(m["line"]), m["func"]))
            elif ln and not ln[0].isspace():
                start = i
                break
    if start >= len(lines):
        return None
    m = _EXC_LINE.match(lines[start])
    if not m or (not frames and lines[0].strip() != _HEADER and not _CLASS_NAME.match(_short_type(m["type"]))):
        return None  # without a traceback, only a class name ("ValueError: ...") says it is an exception
    message = "\n".join([m["msg"] or "", *lines[start + 1:]]).strip()
    return _Error(_short_type(m["type"]), message, "\n".join(lines) + "\n", tuple(frames))


def _elastic_inner(message: str) -> tuple[_Error, int | None] | None:
    """The root failure of torchelastic's ChildFailedError summary: its rank and its error (the
    py_callstack of the child's error file, indented by two spaces, or its "Type: message")."""
    m = _ELASTIC_ROOT.search(message)
    if not m:
        return None
    rank: int | None = None
    tb: list[str] = []
    for ln in m["block"].splitlines():
        if tb:
            if re.match(r"^={3,}\s*$", ln.strip()) or re.match(r"^\[\d+\]:\s*$", ln):
                break
            tb.append(ln[2:] if ln.startswith("  ") else ln)
            continue
        f = _ELASTIC_FIELD.match(ln)
        if f and f["key"] == "rank":
            r = re.match(r"\d+", f["value"])
            rank = int(r.group(0)) if r else None
        elif f and f["key"] == "traceback":
            tb.append(f["value"])
    inner = parse_traceback("\n".join(tb)) if tb else None
    return (inner, rank) if inner is not None else None


def error_file_text(data: Any) -> str:
    """torchelastic's error file ({"message": {"message": "<Type>: <msg>", "extraInfo":
    {"py_callstack": "..."}}}, as a dict or its JSON text) as the traceback text it carries: the
    py_callstack, else the message. Any other text is returned as it is."""
    if isinstance(data, str):
        try:
            parsed = bounded_json(data)  # any text: bounded in size and depth
        except ValueError:
            return data
        data = parsed
    if not isinstance(data, dict):
        return str(data)
    msg = data.get("message")
    if isinstance(msg, dict):
        extra = msg.get("extraInfo")
        stack = extra.get("py_callstack") if isinstance(extra, dict) else None  # any JSON: a list, a number
        return str(stack if stack else msg.get("message") or "")
    return str(msg or "")


def _is_error_file(text: str) -> bool:
    """Text that is torchelastic's error file: {"message": {"message": ..., ...}}."""
    if not text.lstrip().startswith("{"):
        return False
    try:
        data = bounded_json(text)
    except ValueError:
        return False
    return isinstance(data, dict) and isinstance(data.get("message"), dict)


def _unwrap_once(err: _Error) -> tuple[Wrapper, _Error] | None:
    """The next layer in: the error `err` wraps, and how."""
    # a spawned process's error and a worker's error re-raised: the one quoted first is the outer
    quoted = sorted((m.start(), kind, m) for kind, m in (("spawn", _SPAWN.search(err.message)),
                                                         ("worker", _WORKER.search(err.message)),
                                                         ("ray_worker", _RAY.search(err.message))) if m)
    for _, kind, m in quoted:
        inner = parse_traceback(m["rest"].strip("\n"))
        if inner is None:
            continue
        if kind == "spawn":
            n = int(m["n"])
            return Wrapper("spawn", _by(err), f"in process {n} of torch.multiprocessing.spawn", n), inner
        if kind == "ray_worker":
            n = int(m["n"])
            return Wrapper("ray_worker", _by(err), f"in Ray Train worker rank {n}", n), inner
        num = re.search(r"\d+", m["where"])
        return Wrapper("dataloader_worker" if "DataLoader worker" in m["where"] else "worker", _by(err),
                       m["where"], int(num.group(0)) if num else None), inner
    if "Root Cause (first observed failure):" in err.message:
        found = _elastic_inner(err.message)
        if found is not None:
            inner, rank = found
            where = f"in torchelastic's child rank {rank}" if rank is not None else "in a torchelastic child"
            return Wrapper("torchelastic", _by(err), where, rank), inner
    if _is_error_file(err.message):
        inner = parse_traceback(error_file_text(err.message))
        if inner is not None:
            return Wrapper("torchelastic", _by(err), "in a torchelastic error file", None), inner
    if err.type.endswith("RemoteTraceback"):  # concurrent.futures' and multiprocessing.pool's
        inner = parse_traceback(err.message.strip().strip('"').strip("\n"))
        if inner is not None:
            return Wrapper("remote", _by(err), "in a worker process of a process pool", None), inner
    blocks = _CHAIN.split(err.traceback)  # [innermost, how, next, how, ..., outermost]
    texts, hows = blocks[0::2], blocks[1::2]
    # Only an explicit `raise ... from` wraps: an error raised while handling another (a fallback
    # that failed) is an error of its own, and the one it handled is no cause of it.
    i = len(texts) - 1
    while i > 0 and "direct cause" in hows[i - 1]:
        i -= 1
    if i < len(texts) - 1:
        inner = parse_traceback(texts[i])
        if inner is not None:
            outer = parse_traceback(texts[-1])
            by = _by(outer) if outer is not None else _by(err)
            return Wrapper("cause", by, f"the cause of {by}", None), inner
    return None


def user_frame(traceback: str, library_dirs: Iterable[str] = ()) -> Frame | None:
    """The innermost frame of the user's code in the last exception of a traceback text (after
    "During handling of the above exception", the one that ended the script), or None."""
    at = traceback.rfind(_HEADER)
    err = parse_traceback(traceback[at:]) if at >= 0 else None
    if err is None:
        return None
    dirs = tuple(library_dirs)
    return next((f for f in reversed(err.frames) if not is_library_frame(f.file, dirs)), None)


def is_library_frame(file: str, library_dirs: Iterable[str] = ()) -> bool:
    return bool(_LIBRARY.search(file)) or file.startswith(tuple(library_dirs))


def real_error(type_: str, message: str, traceback: str = "", *,
               library_dirs: Iterable[str] = ()) -> RealError | None:
    """The innermost error of an exception given as its type, message and traceback text (the
    whole text Python prints, chained exceptions included), or None when it wraps nothing.
    `library_dirs`: directories whose frames are not the user's code (torch's, ddp-doctor's),
    besides installed packages and the standard library."""
    dirs = tuple(library_dirs)
    err = _Error(_short_type(str(type_ or "")), str(message or ""), str(traceback or ""))
    wrappers: list[Wrapper] = []
    for _ in range(16):  # nested wrappers (a worker's error inside a spawned process): bounded
        step = _unwrap_once(err)
        if step is None:
            break
        wrapper, inner = step
        if wrapper.kind == "remote" and wrappers and wrappers[-1].kind == "cause":
            # the remote traceback is the cause of the same error re-raised here: one layer
            wrappers[-1] = Wrapper("remote", wrappers[-1].by, wrapper.where, None)
        else:
            wrappers.append(wrapper)
        err = inner
    if not wrappers:
        return None
    user = next((f for f in reversed(err.frames) if not is_library_frame(f.file, dirs)), None)
    return RealError(err.type, err.message, err.traceback, err.frames, user, tuple(wrappers))
