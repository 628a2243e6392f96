"""torchrun's options, as the installed torch's own launcher parser declares them
(`torch.distributed.run.get_args_parser`): every spelling (`--nproc-per-node`, `--nproc_per_node`,
`-t`), how many values each takes (0 for a flag), the PET_* variable that gives its default (torch's
argparse_util actions `env` and `check_env`: Kubeflow's operators configure torchrun through them)
and its help shortened to one line. `ddp-doctor
run` splits its command line with this table (run_argv.py split_argv) and prints it in its help, so
it takes whatever torchrun of this torch takes.

Importing torch takes a second or more, and the parent of `ddp-doctor run` needs no torch
otherwise: the table is kept in a cache file (CACHE_ENV, else $XDG_CACHE_HOME/ddp-doctor, else
~/.cache/ddp-doctor), keyed by the files of torch that declare the options (path, size, mtime), so
a torch installed, upgraded or edited is read again. A cache that cannot be read or written only
costs the import.
"""
from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from typing import Any

CACHE_ENV = "DDP_DOCTOR_CACHE_DIR"
FORMAT = 2  # of the cache file; a change makes every older file stale
# torch's files that make the table: the options (run.py) and their actions (argparse_util.py)
SOURCES = ("distributed/run.py", "distributed/argparse_util.py")
HELP_WIDTH = 100  # a torchrun option's help is cut to this many characters


@dataclass(frozen=True)
class Option:
    names: tuple[str, ...]   # every spelling, as torch lists them: ("--nproc-per-node", "--nproc_per_node")
    nargs: int | str         # values it takes: 0 (a flag), 1, 2, ... or argparse's "?", "*", "+"
    metavar: str             # what the value is called in the help ("" for a flag)
    help: str                # torch's help, one line
    env: str = ""            # PET_<DEST>: the variable torchrun takes the default from ("" when none)


@dataclass(frozen=True)
class Table:
    options: tuple[Option, ...]
    torch_version: str

    def by_name(self) -> dict[str, Option]:
        return {n: o for o in self.options for n in o.names}


def table() -> Table:
    """torchrun's options in this torch: from the cache when it matches the installed torch, else
    from torch's parser (and then cached). ImportError when torch cannot be found or imported."""
    key = _cache_key()
    path = _cache_file()
    cached = _read_cache(path, key) if path else None
    if cached is not None:
        return cached
    made = from_parser()
    if path:
        _write_cache(path, key, made)
    return made


def from_parser() -> Table:
    """The table, read from torch's launcher parser itself (imports torch)."""
    import torch
    from torch.distributed.run import get_args_parser
    parser = get_args_parser()
    options = []
    for action in parser._actions:  # argparse keeps no public list of its actions
        if not action.option_strings:
            continue  # training_script, training_script_args: the script and its arguments
        nargs = 1 if action.nargs is None else action.nargs
        metavar = "" if nargs == 0 else _metavar(action)
        options.append(Option(tuple(action.option_strings), nargs, metavar, one_line(_help_of(action)),
                              _env_of(action)))
    return Table(tuple(options), str(torch.__version__))


def _env_of(action: Any) -> str:
    """PET_<DEST> for an option declared with torch's `env` / `check_env` action (argparse_util.py:
    the default read from that variable), else ""."""
    kind = type(action)
    if kind.__module__.endswith("argparse_util") and kind.__name__ in ("env", "check_env"):
        return f"PET_{str(action.dest).upper()}"
    return ""


def _metavar(action: Any) -> str:
    if isinstance(action.metavar, str):
        return action.metavar
    if action.choices:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return str(action.dest).upper()


def _help_of(action: Any) -> str:
    text = str(action.help or "")
    if "%" in text:  # argparse's own expansion (%(default)s, %(prog)s)
        try:
            text = text % {**vars(action), "prog": "torchrun"}
        except (KeyError, TypeError, ValueError):
            pass
    return text


_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.(?=\s|$)")
_PARENTHESES = re.compile(r"\s*\([^()]*\)")


def one_line(text: str, width: int = HELP_WIDTH) -> str:
    """A help text as one line: its first sentence; without its parenthesised asides when that is
    still longer than `width`, then cut at a word with "..."."""
    text = " ".join(text.split())
    m = _SENTENCE_END.search(text)
    first = text[:m.start()] if m else text.rstrip(".")
    if len(first) > width:
        first = _PARENTHESES.sub("", first)
        if "(" in first:  # an aside the first sentence does not close: up to it
            first = first[:first.index("(")].rstrip()
    if len(first) > width:
        first = first[:width - 3].rsplit(" ", 1)[0].rstrip(",;:") + "..."
    return first


# ------------------------------------------------------------------ the cache

def _torch_dir() -> str:
    import importlib.util
    spec = importlib.util.find_spec("torch")  # finds the package without importing it
    if spec is None or not spec.origin:
        raise ImportError("No module named 'torch'")
    return os.path.dirname(spec.origin)


def _cache_key() -> list[Any] | None:
    """What the table depends on: torch's files that declare it, and Python's argparse. None when
    they cannot be looked at (then nothing is cached)."""
    try:
        root = _torch_dir()
        key: list[Any] = [FORMAT, list(sys.version_info[:2])]
        for rel in SOURCES:
            st = os.stat(os.path.join(root, rel))
            key.append([os.path.join(root, rel), st.st_size, st.st_mtime_ns])
        return key
    except (ImportError, OSError, ValueError):
        return None


def _cache_file() -> str | None:
    base = os.environ.get(CACHE_ENV)
    if not base:
        home = os.path.expanduser("~")
        root = os.environ.get("XDG_CACHE_HOME") or (os.path.join(home, ".cache") if home != "~" else "")
        base = os.path.join(root, "ddp-doctor") if root else ""
    return os.path.join(base, "torchrun-options.json") if base else None


def _read_cache(path: str, key: list[Any] | None) -> Table | None:
    if key is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("key") != key:
            return None
        return Table(tuple(Option(tuple(o["names"]), o["nargs"], o["metavar"], o["help"], o["env"])
                           for o in data["options"]), str(data["torch_version"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write_cache(path: str, key: list[Any] | None, made: Table) -> None:
    if key is None:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"key": key, "torch_version": made.torch_version,
                       "options": [asdict(o) for o in made.options]}, f)
        os.replace(tmp, path)  # another process writing the same table at once: either file is right
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
