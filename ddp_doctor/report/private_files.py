"""Files only this user can read: a run directory of `ddp-doctor run` is 0700 and every record
ddp-doctor writes in it 0600.

The records hold what a secret can hide in (exception text and tracebacks, stacks, the arguments
init_process_group was given), and under an outside launcher the run directory sits in the shared
temp directory under a name anyone can guess (training/run/rank.py, run_dir_for). What goes in
is redacted as well (training/records.py); the modes keep out what redaction cannot recognise.
"""
from __future__ import annotations

import errno
import os
import stat
import sys
import threading
from typing import IO

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
_OTHERS = 0o077  # group and other bits: none of them may be set


def _warn(message: str) -> None:
    try:
        sys.stderr.write(f"ddp-doctor: warning: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


SUBDIRS = ("preflight",)  # the only directories ddp-doctor makes inside a run directory


def tighten_tree(path: str) -> None:
    """What an earlier version left in a reused run directory (0755 directories, 0644 records),
    or what torch and NCCL wrote there with the process's umask (NCCL's flight recorder dumps and
    its log): this user's files become 0600, and the subdirectories ddp-doctor makes (SUBDIRS)
    0700 with their files; other subdirectories are not ddp-doctor's and are not entered. Never
    follows a link."""
    def tighten(p: str, mode: int) -> None:
        try:
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or not st.st_mode & _OTHERS:
                return
            os.chmod(p, mode)
        except OSError:
            pass

    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            if e.name in SUBDIRS:
                tighten(e.path, PRIVATE_DIR)
                tighten_tree(e.path)
        elif e.is_file(follow_symlinks=False):
            tighten(e.path, PRIVATE_FILE)


def make_private_dir(path: str) -> bool:
    """Create the directory `path` with mode 0700 (missing parents as usual); an existing one of
    this user that others may enter (an earlier version's 0755) is tightened to 0700, with what it
    holds. One that is not this user's is left as it is, with a warning on stderr. True when the
    directory is private. Raises OSError when it cannot be made at all."""
    os.makedirs(path, mode=PRIVATE_DIR, exist_ok=True)
    st = os.stat(path)
    mode = stat.S_IMODE(st.st_mode)
    if not mode & _OTHERS:
        return True
    if st.st_uid != os.geteuid():
        _warn(f"the run directory {path} belongs to another user (uid {st.st_uid}, mode {mode:o}): left as it "
              f"is; the records ddp-doctor writes in it are readable by this user only")
        return False
    try:
        os.chmod(path, PRIVATE_DIR)
    except OSError as e:
        _warn(f"could not make the run directory {path} private (mode {mode:o}): {e.strerror or e}")
        return False
    tighten_tree(path)
    return True


def open_private(path: str) -> IO[str]:
    """`path` opened for writing text, readable by this user only (0600): created so, or an
    existing file of this user emptied and tightened. Never follows a link; a file of another
    user is refused (PermissionError), so nothing is written where others can read it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), PRIVATE_FILE)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise PermissionError(errno.EPERM, "the file belongs to another user", path)
        if stat.S_IMODE(st.st_mode) != PRIVATE_FILE:
            os.fchmod(fd, PRIVATE_FILE)
        os.ftruncate(fd, 0)
        return os.fdopen(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def write_private(path: str, text: str) -> None:
    """Write `text` to `path` atomically (a temp file beside it, then a rename), mode 0600. Two
    threads or processes may write one path: each has its own temp file. Raises OSError."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open_private(tmp) as f:
            f.write(text)  # one write: json.dump streams many small ones
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
