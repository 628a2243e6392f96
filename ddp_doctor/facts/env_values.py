"""Small, total parsers for environment values: they never raise, they say what was wrong.

Also the one way ddp-doctor reads JSON (and text files) a user or a platform hands it: SM_* variables,
/opt/ml/input/config/*.json, sagemaker-check's --config and --distribution. bounded_json refuses
text larger than MAX_JSON_BYTES or nested deeper than MAX_JSON_DEPTH before json.loads sees it (the
decoder recurses once per level: 60,000 brackets are a RecursionError, not a parse error);
read_text_file decodes a file by its byte-order mark (UTF-8 with or without one, UTF-16 and UTF-32
with one: what Windows PowerShell writes) within a size bound. Both fail with ValueError and a
one-line reason, never anything else.

And the one test of a path a user names as a file: not_regular says what a path is when it is not
a regular file ("a FIFO", "a directory", "a character device", ...), from os.stat alone (a FIFO is
never opened to find out: opening one for reading waits for a writer, reading a device never
ends); open_regular opens a regular file only (O_NONBLOCK, and fstat again on what was opened, so
a path swapped for a FIFO in between does not block either), NotRegularFile otherwise.
"""
from __future__ import annotations

import json
import os
import re
import stat
from itertools import accumulate
from typing import IO, Any, Mapping

# Far deeper than anything SageMaker, the SDK or an estimator writes (SM_TRAINING_ENV nests about
# 5 levels), far shallower than the interpreter's recursion limit in any thread.
MAX_JSON_DEPTH = 100
# Far larger than any SM_* value (the kernel caps one at 128 KiB) or config file (8,000 hosts in
# resourceconfig.json are about 200 KB); small enough to read and scan in well under a second.
MAX_JSON_BYTES = 4 * 1024 * 1024


def _too_big(size: int, max_bytes: int) -> str:
    return f"larger than {max_bytes} bytes ({size} bytes)"


_ESCAPE = re.compile(r"\\.", re.S)       # a backslash and the character it escapes
_STRING = re.compile(r'"[^"]*"')           # a string, once its escapes are gone: linear, no backtracking
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str) -> int:
    """How deep [ and { nest in JSON text, what is inside strings left out; counted without
    recursion (regular expressions and a running sum), so it can be asked of any text before
    json.loads is. Text that is no JSON gets a number too (json.loads then rejects it)."""
    bare = _STRING.sub("", _ESCAPE.sub("", text))
    quote = bare.find('"')
    if quote >= 0:  # an unterminated string: all after it is inside it
        bare = bare[:quote]
    brackets = _NOT_BRACKET.sub("", bare)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def bounded_json(text: str, *, max_depth: int = MAX_JSON_DEPTH, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """json.loads(text), within bounds: ValueError, whose message says what is wrong in a phrase that
    follows "X is" ("larger than ...", "nested N levels deep ...", "not valid JSON (...)"), when the
    text is larger than `max_bytes` (UTF-8), nests deeper than `max_depth`, or is no JSON. It never
    raises anything else (no RecursionError, whatever the text)."""
    if len(text) > max_bytes:  # each character is at least one byte
        raise ValueError(_too_big(len(text.encode("utf-8", "surrogatepass")), max_bytes))
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise ValueError(_too_big(size, max_bytes))
    depth = json_depth(text)
    if depth > max_depth:
        raise ValueError(f"nested {depth} levels deep (ddp-doctor reads at most {max_depth})")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg})") from None
    except (ValueError, RecursionError, MemoryError) as e:  # e.g. a number of too many digits
        raise ValueError(f"not valid JSON ({type(e).__name__}: {str(e)[:120]})") from None


# byte-order mark -> (codec, the name a message gives); UTF-32's before UTF-16's (FF FE 00 00 starts both)
BOMS = ((b"\xef\xbb\xbf", "utf-8", "UTF-8"), (b"\xff\xfe\x00\x00", "utf-32-le", "UTF-32 LE"),
        (b"\x00\x00\xfe\xff", "utf-32-be", "UTF-32 BE"), (b"\xff\xfe", "utf-16-le", "UTF-16 LE"),
        (b"\xfe\xff", "utf-16-be", "UTF-16 BE"))


def decode_text(data: bytes) -> str:
    """Text from a file's bytes: by its byte-order mark (which is dropped), UTF-8 without one.
    ValueError, one line naming the encoding and what failed, when the bytes do not decode, or
    hold NUL characters without a mark (UTF-16 written without one)."""
    bom, codec, name = next((m for m in BOMS if data.startswith(m[0])), (b"", "utf-8", "UTF-8"))
    if not bom and b"\x00" in data:  # no text file holds NUL: UTF-16 or UTF-32 saved without a mark
        raise ValueError("not UTF-8 text: it holds NUL bytes and has no byte-order mark (UTF-16 without "
                         "one?); save it as UTF-8")
    try:
        return data[len(bom):].decode(codec)
    except UnicodeDecodeError as e:
        raise ValueError(f"not valid {name} text (byte {e.start + len(bom)}: {e.reason}); save it as UTF-8") from None


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind_of(mode: int) -> str | None:
    """None for a regular file's st_mode, else what the file is, in a phrase that follows "X is"."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def not_regular(path: str) -> str | None:
    """None when `path` is a regular file (links followed), else what it is ("a FIFO", "a
    directory", "a character device", "a block device", "a socket"). Never opens it. OSError when
    it cannot be stat'ed (missing, a dangling link, no permission)."""
    return kind_of(os.stat(path).st_mode)


class NotRegularFile(ValueError):
    """A path named as a file is something else; str() is a phrase that follows "X is"."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"{kind}, not a regular file")
        self.kind = kind


def open_regular(path: str) -> IO[bytes]:
    """`path` opened for reading in binary, when it is a regular file. NotRegularFile (a
    ValueError) naming what it is otherwise, found by os.stat before any open (a FIFO or a device
    is never opened); OSError when it cannot be opened."""
    kind = not_regular(path)
    if kind is not None:
        raise NotRegularFile(kind)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        kind = kind_of(os.fstat(fd).st_mode)  # what was opened: the path may have changed since the stat
        if kind is not None:
            raise NotRegularFile(kind)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:  # cleans up the descriptor, and re-raises
        os.close(fd)
        raise


def read_bytes(path: str, max_bytes: int) -> bytes:
    """A regular file's bytes, no more than `max_bytes`: OSError when it cannot be opened or read;
    ValueError (one line, a phrase that follows "X is") when it is not a regular file
    (NotRegularFile) or is larger than `max_bytes`."""
    with open_regular(path) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"larger than {max_bytes} bytes")
    return data


def read_text_file(path: str, max_bytes: int = MAX_JSON_BYTES) -> str:
    """A user's text file, decoded by decode_text and read no further than `max_bytes` + 1 bytes.
    OSError when it cannot be opened or read; ValueError (one line) when it is not a regular file,
    is larger than `max_bytes` or does not decode."""
    return decode_text(read_bytes(path, max_bytes))


class Invalid:
    """A value that was present but could not be parsed; keeps the raw text for the message."""

    __slots__ = ("raw", "why")

    def __init__(self, raw: str, why: str) -> None:
        self.raw, self.why = raw, why

    def __repr__(self) -> str:
        return f"Invalid({self.raw!r}: {self.why})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Invalid) and (self.raw, self.why) == (other.raw, other.why)


def env_int(env: Mapping[str, str], name: str) -> int | None | Invalid:
    """None when unset or empty; an int; or Invalid when it is not a whole number."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw.strip())
    except ValueError:
        return Invalid(raw, "not an integer")


def env_json(env: Mapping[str, str], name: str) -> Any:
    """None when unset; the decoded JSON; or Invalid when it is not JSON, or too large or too deeply
    nested to read (bounded_json)."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return bounded_json(raw)
    except ValueError as e:
        return Invalid(raw, str(e))


def env_bool(env: Mapping[str, str], name: str) -> bool:
    return (env.get(name) or "").strip().lower() in ("1", "true", "yes", "on")


def as_int(value: Any) -> int | None:
    """The int in a parsed value, or None when it is unset or invalid."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def visible_devices(raw: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as its entries, blanks dropped (" 0, ,GPU-ab " -> ["0", "GPU-ab"]):
    entry i is what cuda:i stands for. None when it is unset (every GPU is visible)."""
    if raw is None:
        return None
    return [x.strip() for x in raw.split(",") if x.strip()]
