"""Which stack frames are ddp-doctor's own, or a library's: tracebacks, stacks and call sites
shown to the user skip them. is_user_file is the test of a frame of this host (this process's
stack, its own exceptions); is_library_file adds what a frame recorded on any host shows of a
library; not_user_code_dirs are the directories of this host that both skip."""
from __future__ import annotations

import os
import sysconfig

# The installed ddp_doctor package: frames under it are ddp-doctor's own, not the user's.
TOOL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NOT_USER_CODE: tuple[str, ...] | None = None


def not_user_code_dirs() -> tuple[str, ...]:
    """Frames from these directories are not 'user code' when we say where a rank is."""
    global _NOT_USER_CODE
    if _NOT_USER_CODE is None:
        dirs = [TOOL_DIR]  # ddp_doctor
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):  # libraries are not the user's code
            p = sysconfig.get_paths().get(key)
            if p:
                dirs.append(p)
        try:  # found, not imported: importing torch costs seconds and 200 MB (a post-mortem needs neither)
            import importlib.util
            spec = importlib.util.find_spec("torch")
            if spec is not None and spec.origin:
                dirs.append(os.path.dirname(os.path.abspath(spec.origin)))
        except (ImportError, ValueError):  # a broken torch: its frames are not there to tell apart
            pass
        _NOT_USER_CODE = tuple(dirs)
    return _NOT_USER_CODE


# Path parts of an installed library's file on any host: a recorded frame (NCCL's flight recorder,
# a peer's ledger) may come from another machine, whose directories not_user_code_dirs cannot know.
LIBRARY_PATH_PARTS = ("site-packages", "dist-packages", f"{os.sep}torch{os.sep}", "/torch/")


def is_user_file(filename: str) -> bool:
    """Whether a frame of this host is the user's code: a real file (not a pseudo-file such as
    "<string>") outside this host's library and ddp-doctor directories. Only those: a user's own
    directory may well be called torch/ (is_library_file's guess is for frames of other hosts)."""
    return bool(filename) and not filename.startswith("<") and not filename.startswith(not_user_code_dirs())


def is_library_file(filename: str) -> bool:
    """Whether a recorded frame's file (from this host or another) is not the user's code: not
    is_user_file here, or an installed library's path on any host."""
    return not is_user_file(filename) or any(part in filename for part in LIBRARY_PATH_PARTS)
