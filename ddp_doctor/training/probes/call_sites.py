"""Where a recorded call came from, read off the stack: the user's file:line (`user_site`) and
whether an installed library (Trainer/accelerate, Lightning) rather than the script made the call
(`called_from_library`)."""
from __future__ import annotations

import os
import sys
import sysconfig
import traceback

from ddp_doctor.facts.frames import TOOL_DIR, is_user_file


def user_site() -> str | None:
    """file:line of the innermost frame outside ddp-doctor, torch and the standard library: where
    the script (or the library it called) did what is recorded."""
    frames = [(f.f_code.co_filename, line) for f, line in traceback.walk_stack(sys._getframe(1))]
    for name, line in frames:
        if is_user_file(name):
            return f"{name}:{line}"
    # a training package installed in site-packages: its innermost frame outside torch and us
    torch_mod = sys.modules.get("torch")
    ours = (TOOL_DIR, *([os.path.dirname(os.path.abspath(torch_mod.__file__))] if torch_mod else []))
    for name, line in frames:
        if not name.startswith(ours) and not name.startswith("<") and "site-packages" in name:
            return f"{name}:{line}"
    return None


def called_from_library() -> bool:
    """Whether the code that called into torch (past torch's and ddp-doctor's own frames) is an
    installed library (Trainer/accelerate, Lightning) rather than the user's script."""
    import torch.distributed as dist
    torch_dir = os.path.dirname(os.path.dirname(os.path.abspath(dist.__file__)))
    libs = tuple({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
    for frame, _ in traceback.walk_stack(sys._getframe(1)):
        name = frame.f_code.co_filename
        if name.startswith((torch_dir, TOOL_DIR)) or name.startswith("<"):
            continue
        return name.startswith(libs)
    return False
