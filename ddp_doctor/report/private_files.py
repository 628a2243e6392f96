"""Files only this user can read: a run directory of `ddp-doctor run` is 0700 and every record
ddp-doctor writes in it 0600.

The records hold what a secret can hide in (exception text and tracebacks, stacks, the arguments
init_process_group was given), and under an outside launcher the run directory sits in the shared
temp directory under a name anyone can guess (training/run/watched_rank.py, run_dir_for). What goes in
is redacted as well (training/records.py); the modes keep out what redaction cannot recognise.
"""
from __future__ import annotations

import errno
import hashlib
import os
import stat
import sys
import tempfile
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


PREFLIGHT_SUBDIR = "preflight"  # a run directory's preflight records (training/records.py PREFLIGHT_DIR)
# torch's launcher's log tree (the ranks' error files), made in the run directory by ddp-doctor's
# launcher (training/run/agent.py) with the umask: everything in it is this run's, so all of it is tightened
ELASTIC_SUBDIR = "elastic"
SUBDIRS = (PREFLIGHT_SUBDIR, ELASTIC_SUBDIR)  # the only directories made inside a run directory for it


def tighten_tree(path: str, whole: bool = False) -> None:
    """What a reused run directory holds with looser modes (0755 directories, 0644 records),
    or what torch and NCCL wrote there with the process's umask (NCCL's flight recorder dumps and
    its log, the launcher's log tree): this user's files become 0600, and the subdirectories made
    for the run (SUBDIRS; all of the launcher's tree, `whole`) 0700 with their files; other
    subdirectories are not ddp-doctor's and are not entered. Never follows a link."""
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
            if whole or e.name in SUBDIRS:
                tighten(e.path, PRIVATE_DIR)
                tighten_tree(e.path, whole or e.name == ELASTIC_SUBDIR)
        elif e.is_file(follow_symlinks=False):
            tighten(e.path, PRIVATE_FILE)


def make_private_dir(path: str) -> bool:
    """Create the directory `path` with mode 0700 (missing parents as usual); an existing one of
    this user that others may enter (0755) is tightened to 0700, with what it
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
    except BaseException:  # Ctrl-C included: the descriptor is closed, then it goes on up
        os.close(fd)
        raise


def write_private(path: str, text: str) -> None:
    """Write `text` to `path` atomically (a temp file beside it, then a rename), mode 0600. Two
    threads or processes may write one path: each has its own temp file. A kept directory
    (keep_dir) that something removed is made again first. Raises OSError."""
    try:
        write_atomically(path, text)
    except FileNotFoundError:
        if not _remade(os.path.dirname(path)):
            raise
        write_atomically(path, text)


def write_atomically(path: str, text: str, *, mode: int = PRIVATE_FILE, durable: bool = False) -> None:
    """Write `text` to a temp file beside `path` (created 0600, never through a link), then rename it
    over `path`: a reader (the launcher, the S3 upload) sees the old file or the whole new one, never
    half of it. `mode`: the file's mode once written (0644 for a report others read); `durable`:
    fsync before the rename (a report that must outlive a crash of the machine)."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open_private(tmp) as f:
            f.write(text)  # one write: json.dump streams many small ones
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if mode != PRIVATE_FILE:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:  # Ctrl-C included: no temporary file left behind, then it goes on up
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# A run directory removed while the job runs (by the script, a cleaner of /tmp) would leave the
# watchdog's heartbeats and every ending unwritten: no hang verdict, no report. The directories
# this process works in are made again when a write finds them gone.
_kept: set[str] = set()
_remade_warned: set[str] = set()


def keep_dir(path: str) -> None:
    """Make `path` again (0700) if it is removed while this process writes records into it."""
    _kept.add(os.path.abspath(path))


def let_go(path: str) -> None:
    """`path` may be removed from now on (its owner removes it at the end of the run)."""
    _kept.discard(os.path.abspath(path))


def _remade(path: str) -> bool:
    """Whether the kept directory `path` was missing and is made again (warned once)."""
    where = os.path.abspath(path)
    if where not in _kept or os.path.isdir(where):
        return False
    try:
        make_private_dir(where)
    except OSError:
        return False
    if where not in _remade_warned:
        _remade_warned.add(where)
        _warn(f"the run directory {where} was removed while the job ran: made again, so ddp-doctor's "
              f"records of what follows (heartbeats, endings, the report) are kept")
    return True


# A run directory needs room for every rank's records: ledgers (up to about 1.2 MB a rank),
# stacks, heartbeats. A file system with less free is full for this purpose: records written
# there are lost part way, and a lost record reads as a rank that never reported.
RECORDS_ROOM = 8 << 20  # bytes
RECORDS_INODES = 256
# Where records go when the asked place cannot hold them: memory first (another device than a
# full disk), then the disk's other temp directory. The same order for every rank of a node, so
# ranks that decide alone (an outside launcher) decide alike.
FALLBACK_ROOTS = ("/dev/shm", "/var/tmp")
RUN_DIR_PREFIX = "ddp-doctor-run-"


def records_problem(path: str) -> str | None:
    """Why the existing directory `path` cannot hold ddp-doctor's records, None when it can: its
    file system has less than RECORDS_ROOM (or RECORDS_INODES files) free, or a file cannot be
    written there (read-only, permission denied, full)."""
    try:
        st = os.statvfs(path)
    except OSError as e:
        return e.strerror or str(e)
    free = st.f_bavail * st.f_frsize
    if st.f_files and st.f_favail < RECORDS_INODES:
        return f"its file system has {st.f_favail or 'no'} free inodes"
    if free < RECORDS_ROOM:
        return f"its file system is full: {free // 1024} KiB free"
    probe = os.path.join(path, f".ddp-doctor-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), PRIVATE_FILE)
        try:
            os.write(fd, b"ddp-doctor")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        return e.strerror or str(e)
    return None


def make_records_dir(path: str | None = None, *, parent: str | None = None) -> tuple[str, str | None]:
    """A private directory (0700) with room for a run's records, and a warning when it is not the
    one asked for: (directory, warning or None).

    `path`: a fixed directory (the ranks of a node each compute the same one); when it cannot be
    made or has no room (records_problem), the same name under FALLBACK_ROOTS. Without `path`: a
    new directory (mkdtemp) in `parent` (--run-dir, made if missing) or the temp dir, else in
    FALLBACK_ROOTS. When no place has room, the first that could be made is used and the warning
    says the records may be incomplete; when none could be made, the directory asked for is
    returned as it is (records are then lost, the job runs). Never raises."""
    if path:
        name = os.path.basename(os.path.normpath(path))
        if not name.startswith(RUN_DIR_PREFIX):  # a user's DDP_DOCTOR_RUN_DIR: a name no other path has
            name = RUN_DIR_PREFIX + hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:12]
        places = [path, *(os.path.join(root, name) for root in FALLBACK_ROOTS)]
    else:
        try:
            temp = tempfile.gettempdir()
        except OSError:  # no usable temp directory at all
            temp = None
        places = list(dict.fromkeys(p for p in (parent, temp, *FALLBACK_ROOTS) if p))
    problems: list[str] = []
    if not path and parent is None:
        problems += _temp_passed_over(temp)
    made: str | None = None  # the first directory made, used when none has room
    for place in places:
        try:
            if path:
                make_private_dir(place)
                d = place
            else:
                if place == parent:
                    os.makedirs(place, mode=PRIVATE_DIR, exist_ok=True)  # the user's --run-dir
                d = tempfile.mkdtemp(prefix=RUN_DIR_PREFIX, dir=place)  # 0700
        except OSError as e:
            problems.append(f"{place}: {e.strerror or e}")
            continue
        why = records_problem(d)
        if why is None:
            if made is not None and not path:
                _rmdir(made)  # a new directory without room, not used
            d = os.path.abspath(d)  # a script's chdir must not move it
            return d, _moved_note(problems, d) if problems else None
        problems.append(f"{place}: {why}")
        if made is None:
            made = d
        elif not path:
            _rmdir(d)
    if made is not None:
        made = os.path.abspath(made)
        return made, (f"no directory can hold ddp-doctor's records ({'; '.join(problems)}): they are kept in "
                      f"{made} and may be incomplete; the job runs as it would without ddp-doctor")
    fallback = path or os.path.join(places[0] if places else ".", RUN_DIR_PREFIX + "unwritable")
    return fallback, (f"no directory can be made for ddp-doctor's records ({'; '.join(problems)}): they are "
                      f"lost; the job runs as it would without ddp-doctor")


def _temp_passed_over(temp: str | None) -> list[str]:
    """Why the TMPDIR the user set is not the temp directory Python chose (tempfile skips, without a
    word, one where it cannot create a file: no free inodes, full, read-only), as a problem of
    make_records_dir's; [] when it is the one chosen or none is set."""
    asked = os.environ.get("TMPDIR")
    if not asked or (temp is not None and os.path.realpath(asked) == os.path.realpath(temp)):
        return []
    why = records_problem(asked) if os.path.isdir(asked) else "not a directory"
    return [f"TMPDIR {asked}: {why or 'not usable as a temp directory'}"]


def _moved_note(problems: list[str], chosen: str) -> str:
    return (f"the run directory cannot hold ddp-doctor's records ({'; '.join(problems)}): they are kept "
            f"in {chosen} instead")


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass
