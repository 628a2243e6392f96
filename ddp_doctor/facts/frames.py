"""Which stack frames are ddp-doctor's own, or a library's: tracebacks, stacks and call sites
shown to the user skip them."""
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
        try:
            import torch
            dirs.append(os.path.dirname(os.path.abspath(torch.__file__)))
        except Exception:  # noqa: BLE001
            pass
        _NOT_USER_CODE = tuple(dirs)
    return _NOT_USER_CODE
