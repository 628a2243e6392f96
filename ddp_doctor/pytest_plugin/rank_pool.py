"""The rank pool behind ``@pytest.mark.distributed``: one forkserver with torch preloaded forks
fresh ranks for every test.

    pytest process ──requests──> forkserver (torch and pytest imported, single-threaded,
        (parent)   <──events────   its own session, dies with the parent: PR_SET_PDEATHSIG)
                                        │ fork, one per rank
                                        v
                   rank r: a process group of the test's ranks, dies with the forkserver,
                           stdout/stderr to files, FileStore in the test's directory, runs the
                           test function, writes its result file, then leaves with os._exit

The parent never imports torch. It bounds every wait: on a timeout it asks the live ranks for
their Python stacks (faulthandler on SIGUSR1), then kills the test's process group.

How a rank ended is decided from two facts: its result file (written before it exits) and its
exit status (reported by the forkserver, which reaps it). A rank that reported success and then
died by SIGABRT is torch 2.13's gloo teardown abort (DOMAIN.md section 2): the test passed, and
the report says so in a note. A rank that died without a result file failed.
"""
from __future__ import annotations

import ast
import ctypes
import marshal
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterator

PRELOAD = ("torch", "torch.distributed", "pytest")
PR_SET_PDEATHSIG = 1
STACK_WAIT_S = 1.0       # how long the parent waits for faulthandler dumps of hung ranks
PEER_GRACE_S = 3.0       # after a rank failed, how long its peers get to fail or finish on their own
REAP_WAIT_S = 5.0        # after a kill, how long the parent waits for the forkserver to reap ranks
DESTROY_BOUND_S = 10.0
PG_TIMEOUT_MARGIN_S = 10.0  # the process group's own timeout is the test's plus this   # bound on destroy_process_group in a rank that passed
# Test hook: ranks named here (comma-separated) call os.abort() right after reporting, exactly as
# torch's gloo teardown abort does; used by ddp-doctor's own tests of the classification.
POOL_LOST = "the rank pool (forkserver) died"
FINISHED_KEY = "ddp_doctor/finished"
INITIALISED_KEY = "ddp_doctor/initialised"
# A failure with one of these messages is a consequence of a peer that went away first.
PEER_LOSS = ("closed by peer", "reset by peer", "remote worker", "remote process", "broken pipe",
             "connection refused", "peer closed")


# ---------------------------------------------------------------- framing
def send(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj)
    view = memoryview(struct.pack("!I", len(data)) + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class Reader:
    """Length-prefixed pickles from a pipe, fed in whatever chunks os.read returns."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> Iterator[Any]:
        self.buf += data
        while len(self.buf) >= 4:
            (n,) = struct.unpack("!I", self.buf[:4])
            if len(self.buf) < 4 + n:
                return
            msg, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
            yield pickle.loads(msg)


def _pdeathsig(sig: int) -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig))
    except OSError:
        pass


# ---------------------------------------------------------------- forkserver (server side)
def serve() -> None:
    """The forkserver's main loop: requests on fd 0, events on a copy of fd 1."""
    parent = os.getppid()
    _pdeathsig(signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
    ctl_in, ctl_out = 0, os.dup(1)
    os.dup2(2, 1)  # nothing but events on the control pipe
    import importlib
    preload = [m for m in os.environ.get("DDP_DOCTOR_PRELOAD", ",".join(PRELOAD)).split(",") if m]
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - ranks import it again and report the error
            sys.stderr.write(f"ddp-doctor forkserver: could not preload {name}: {e}\n")
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    children: dict[int, tuple[int, int]] = {}   # pid -> (request id, rank)
    groups: dict[int, int] = {}                 # request id -> pgid
    send(ctl_out, ("ready", os.getpid()))
    reader = Reader()
    server = os.getpid()

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            info = children.pop(pid, None)
            if info is not None:
                send(ctl_out, ("exited", info[0], info[1], status, time.time()))
                if not any(v[0] == info[0] for v in children.values()):
                    groups.pop(info[0], None)

    def live(req: int) -> list[int]:
        return [p for p, v in children.items() if v[0] == req]

    try:
        while True:
            ready, _, _ = select.select([ctl_in, wake_r], [], [], 1.0)
            if wake_r in ready:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            reap()
            if ctl_in not in ready:
                continue
            data = os.read(ctl_in, 1 << 16)
            if not data:
                break  # the parent closed the pipe or died
            for msg in reader.feed(data):
                kind, req = msg[0], msg[1]
                if kind == "run":
                    spec = msg[2]
                    pids: list[int] = []
                    pgid = 0
                    for r in range(int(spec["world_size"])):
                        pid = os.fork()
                        if pid == 0:
                            try:
                                signal.set_wakeup_fd(-1)
                                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                                for fd in (wake_r, wake_w, ctl_out):
                                    os.close(fd)
                                _rank_main(spec, r, pgid, server)
                            finally:
                                os._exit(70)
                        if pgid == 0:
                            pgid = pid
                        try:
                            os.setpgid(pid, pgid)
                        except OSError:
                            pass  # the child did it already, or has exited
                        children[pid] = (req, r)
                        pids.append(pid)
                    groups[req] = pgid
                    send(ctl_out, ("started", req, pids, pgid))
                elif kind == "signal":
                    for pid in live(req):
                        try:
                            os.kill(pid, int(msg[2]))
                        except ProcessLookupError:
                            pass
                elif kind == "kill":
                    if live(req) and req in groups:
                        try:
                            os.killpg(groups[req], signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    for pid in live(req):  # a rank that left the group is still ours
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
    finally:
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pgid in groups.values():
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os._exit(0)


# ---------------------------------------------------------------- one rank (child side)
def _rank_main(spec: dict[str, Any], rank: int, pgid: int, server: int) -> None:
    _pdeathsig(signal.SIGKILL)
    if os.getppid() != server:
        os._exit(71)
    try:
        os.setpgid(0, pgid)
    except OSError:
        os.setpgid(0, 0)
    d = spec["dir"]
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        f = os.open(os.path.join(d, f"{name}-{rank}.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    import faulthandler
    stacks = open(os.path.join(d, f"stack-{rank}.txt"), "w")  # noqa: SIM115 - lives until _exit
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    ws = int(spec["world_size"])
    os.environ.clear()
    os.environ.update(spec["env"])
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ws),
                      LOCAL_WORLD_SIZE=str(ws), GROUP_RANK="0")
    try:
        os.chdir(spec["cwd"])
    except OSError:
        pass
    sys.path[:] = list(spec["sys_path"])
    result = run_test(spec, rank)
    path = os.path.join(d, f"result-{rank}.pkl")
    with open(path + ".tmp", "wb") as f:
        pickle.dump(result, f)
    os.replace(path + ".tmp", path)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
    os._exit(0)  # no interpreter teardown: gloo may abort in static destructors (DOMAIN.md s2)


def _load_function(spec: dict[str, Any]) -> Any:
    import types
    name = spec["module"]
    mod = types.ModuleType(name)
    mod.__file__ = spec["path"]
    mod.__package__ = name.rpartition(".")[0]
    sys.modules[name] = mod
    exec(marshal.loads(spec["code"]), mod.__dict__)  # noqa: S102 - the test module, as pytest compiled it
    obj: Any = mod
    for part in spec["qualname"].split("."):
        obj = getattr(obj, part)
    if spec.get("cls"):
        cls: Any = mod
        for part in spec["cls"].split("."):
            cls = getattr(cls, part)
        obj = getattr(cls(), spec["qualname"].rsplit(".", 1)[-1])
    return obj


def _user_traceback(e: BaseException) -> str:
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


def run_test(spec: dict[str, Any], rank: int) -> dict[str, Any]:
    """Run the test function on this rank with an initialised process group."""
    started = time.time()
    out: dict[str, Any] = {"rank": rank, "outcome": "passed", "message": "", "traceback": "",
                           "time": None, "started": started, "destroy_hung": False}
    skipped_types: tuple[type, ...] = ()
    try:
        from _pytest.outcomes import Skipped
        skipped_types = (Skipped,)
    except Exception:  # noqa: BLE001
        pass
    try:
        func = _load_function(spec)
        kwargs = pickle.loads(spec["kwargs"])
        out["loaded"] = time.time()
        for name in spec.get("rank_arg", ()):
            kwargs[name] = rank
        for name in spec.get("world_size_arg", ()):
            kwargs[name] = int(spec["world_size"])
        from datetime import timedelta

        import torch.distributed as dist
        if spec["backend"] == "nccl":
            import torch
            torch.cuda.set_device(rank)
        store = dist.FileStore(os.path.join(spec["dir"], "store"), int(spec["world_size"]))
        dist.init_process_group(spec["backend"], store=store, rank=rank,
                                world_size=int(spec["world_size"]),
                                # past the parent's hard timeout, so a hang ends one way:
                                # every live rank's stack, then the kill
                                timeout=timedelta(seconds=float(spec["timeout"]) + PG_TIMEOUT_MARGIN_S))
        # gloo's connectFullMesh is not a barrier: a rank that left right after its own init (a
        # skip, a quick failure) would break a peer still connecting. Wait for every rank's init.
        store.add(INITIALISED_KEY, 1)
        end = time.monotonic() + float(spec["timeout"])
        while store.add(INITIALISED_KEY, 0) < int(spec["world_size"]) and time.monotonic() < end:
            time.sleep(0.001)
        out["initialised"] = time.time()
        try:
            func(**kwargs)
        finally:
            try:
                store.add(FINISHED_KEY, 1)  # peers that passed wait for every rank to be done
            except Exception:  # noqa: BLE001 - never hide the test's own exception
                pass
        out["time"] = time.time()
        # A rank that finished early must not leave while a peer still talks to it (gloo's
        # connectFullMesh is not a barrier): wait until every rank has left the test function.
        end = time.monotonic() + float(spec["timeout"])
        while store.add(FINISHED_KEY, 0) < int(spec["world_size"]) and time.monotonic() < end:
            time.sleep(0.002)
        out["all_finished"] = time.time()
        if not _bounded(dist.destroy_process_group, DESTROY_BOUND_S):
            out["destroy_hung"] = True
        out["destroyed"] = time.time()
    except BaseException as e:  # noqa: BLE001 - Skipped and Failed derive from BaseException
        out["time"] = out["time"] or time.time()
        if skipped_types and isinstance(e, skipped_types):
            out["outcome"] = "skipped"
            out["message"] = str(getattr(e, "msg", e))
        else:
            out["outcome"] = "failed"
            msg = str(e)
            out["message"] = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
            pytrace = getattr(e, "pytrace", True)
            out["traceback"] = _user_traceback(e) if pytrace else out["message"] + "\n"
    return out


def _bounded(fn: Any, seconds: float) -> bool:
    import threading
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive()


# ---------------------------------------------------------------- parent side
def compile_module(path: str, config: Any = None) -> bytes:
    """The test module's code as pytest runs it (asserts rewritten), marshalled for the ranks."""
    with open(path, "rb") as f:
        source = f.read()
    try:
        from _pytest.assertion.rewrite import rewrite_asserts
        tree = ast.parse(source, filename=path)
        rewrite_asserts(tree, source, path, config)
        code = compile(tree, path, "exec", dont_inherit=True)
    except Exception:  # noqa: BLE001 - plain asserts still work
        code = compile(source, path, "exec", dont_inherit=True)
    return marshal.dumps(code)


@dataclass
class RankEnd:
    """How one rank ended, as the parent saw it."""
    rank: int
    status: int | None = None          # raw wait status from the forkserver (None: never reaped)
    exit_time: float | None = None
    result: dict[str, Any] | None = None
    stdout: str = ""
    stderr: str = ""
    stack: str = ""
    killed: str | None = None          # "timeout" or "peer": the parent killed it, and why

    @property
    def signal(self) -> int | None:
        if self.status is not None and os.WIFSIGNALED(self.status):
            return os.WTERMSIG(self.status)
        return None

    @property
    def exit_code(self) -> int | None:
        if self.status is not None and os.WIFEXITED(self.status):
            return os.WEXITSTATUS(self.status)
        return None

    def how(self) -> str:
        if self.signal is not None:
            try:
                return f"killed by {signal.Signals(self.signal).name}"
            except ValueError:
                return f"killed by signal {self.signal}"
        if self.exit_code is not None:
            return f"exited with status {self.exit_code}"
        return "was never reaped"


@dataclass
class RunResult:
    world_size: int
    ends: dict[int, RankEnd]
    timed_out: bool = False
    timeout: float = 0.0
    seconds: float = 0.0
    pool_lost: bool = False
    notes: list[str] = field(default_factory=list)


class RankPool:
    """The parent's handle on the forkserver; started lazily, restarted if it dies."""

    def __init__(self, log_path: str, preload: tuple[str, ...] = PRELOAD) -> None:
        self.log_path = log_path
        self.preload = preload
        self.proc: subprocess.Popen[bytes] | None = None
        self.reader = Reader()
        self.pending: list[Any] = []
        self.ready = False
        self.req = 0

    # -- lifecycle
    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env["DDP_DOCTOR_PRELOAD"] = ",".join(self.preload)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "from ddp_doctor.pytest_plugin.rank_pool import serve; serve()"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
                start_new_session=True, preexec_fn=lambda: _pdeathsig(signal.SIGKILL))
        finally:
            log.close()
        self.reader, self.pending, self.ready = Reader(), [], False

    def close(self) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        try:
            assert p.stdin is not None
            p.stdin.close()  # the forkserver kills what is left and exits
        except OSError:
            pass
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if p.stdout is not None:
            p.stdout.close()

    def _recv(self, timeout: float) -> Any:
        """The next event, None on timeout; raises EOFError when the forkserver is gone."""
        if self.pending:
            return self.pending.pop(0)
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        end = time.monotonic() + max(timeout, 0.0)
        while True:
            left = end - time.monotonic()
            r, _, _ = select.select([fd], [], [], max(left, 0.0))
            if not r:
                return None
            data = os.read(fd, 1 << 16)
            if not data:
                raise EOFError(POOL_LOST)
            self.pending.extend(self.reader.feed(data))
            if self.pending:
                return self.pending.pop(0)

    def _send(self, msg: Any) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        send(self.proc.stdin.fileno(), msg)

    def wait_ready(self, timeout: float) -> None:
        self.start()
        end = time.monotonic() + timeout
        while not self.ready:
            msg = self._recv(end - time.monotonic())
            if msg is None:
                raise TimeoutError(f"the rank pool did not start within {timeout:g} s (log: {self.log_path})")
            if msg[0] == "ready":
                self.ready = True

    # -- one test
    def run(self, spec: dict[str, Any], timeout: float, *, start_timeout: float = 120.0) -> RunResult:
        ws = int(spec["world_size"])
        try:
            self.wait_ready(start_timeout)
        except EOFError:
            self.close()
            self.start()
            self.wait_ready(start_timeout)
        self.req += 1
        req = self.req
        t0 = time.monotonic()
        ends = {r: RankEnd(r) for r in range(ws)}
        res = RunResult(world_size=ws, ends=ends, timeout=timeout)
        killed_for: str | None = None
        deadline = t0 + timeout
        grace_end: float | None = None
        try:
            self._send(("run", req, spec))
            reaped: set[int] = set()
            kill_sent_at: float | None = None
            while len(reaped) < ws:
                now = time.monotonic()
                if killed_for is None and (now >= deadline or (grace_end is not None and now >= grace_end)):
                    killed_for = "timeout" if now >= deadline else "peer"
                    res.timed_out = killed_for == "timeout"
                    self._dump_and_kill(req, spec["dir"], [r for r in range(ws) if r not in reaped])
                    for r in range(ws):
                        if r not in reaped:
                            ends[r].killed = killed_for
                    kill_sent_at = time.monotonic()
                if kill_sent_at is not None and time.monotonic() - kill_sent_at > REAP_WAIT_S:
                    res.notes.append(f"ranks {sorted(set(range(ws)) - reaped)} were not reaped "
                                     f"{REAP_WAIT_S:g} s after SIGKILL")
                    break
                wait_until = deadline if grace_end is None else min(deadline, grace_end)
                if killed_for is not None:
                    wait_until = time.monotonic() + 0.5
                msg = self._recv(max(wait_until - time.monotonic(), 0.0))
                if msg is None or msg[1] != req:
                    continue
                if msg[0] == "exited":
                    _, _, r, status, when = msg
                    reaped.add(r)
                    ends[r].status, ends[r].exit_time = status, when
                    end_result = _read_result(spec["dir"], r)
                    if grace_end is None and (end_result is None or end_result["outcome"] != "passed"):
                        grace_end = time.monotonic() + PEER_GRACE_S
        except EOFError:
            res.pool_lost = True
            self.close()
        except BaseException:
            try:
                self._send(("kill", req))
            except (OSError, AssertionError):
                pass
            raise
        res.seconds = time.monotonic() - t0
        d = spec["dir"]
        for r, e in ends.items():
            e.result = _read_result(d, r)
            e.stdout = _read_text(os.path.join(d, f"stdout-{r}.txt"))
            e.stderr = _read_text(os.path.join(d, f"stderr-{r}.txt"))
            e.stack = _read_text(os.path.join(d, f"stack-{r}.txt"))
        return res

    def _dump_and_kill(self, req: int, d: str, live: list[int]) -> None:
        self._send(("signal", req, int(signal.SIGUSR1)))
        end = time.monotonic() + STACK_WAIT_S
        paths = [os.path.join(d, f"stack-{r}.txt") for r in live]
        while time.monotonic() < end:
            if all(_size(p) > 0 for p in paths):
                time.sleep(0.05)  # let the dump finish writing
                break
            time.sleep(0.02)
        self._send(("kill", req))


def _user_stack(dump: str) -> str:
    """A faulthandler dump without the rank machinery's own frames."""
    keep = [ln for ln in dump.rstrip().splitlines()
            if __file__ not in ln and 'File "<string>"' not in ln]
    return "\n".join(keep)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_result(d: str, rank: int) -> dict[str, Any] | None:
    try:
        with open(os.path.join(d, f"result-{rank}.pkl"), "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def _read_text(path: str, limit: int = 200_000) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    return text if len(text) <= limit else text[:limit // 2] + "\n[... cut ...]\n" + text[-limit // 2:]


# ---------------------------------------------------------------- verdict
@dataclass
class Verdict:
    outcome: str                 # passed | failed | skipped
    summary: str                 # one line
    text: str                    # the full failure text (every failing rank's traceback)
    notes: list[str] = field(default_factory=list)


def classify(res: RunResult) -> Verdict:
    """The test's outcome from every rank's end: root cause = the earliest failure."""
    failures: list[tuple[float, int, str, str]] = []   # (time, rank, one line, detail)
    skips: list[tuple[float, int, str]] = []
    hung: list[RankEnd] = []
    notes: list[str] = list(res.notes)
    for r, e in sorted(res.ends.items()):
        out = e.result
        if out is not None:
            if out["outcome"] == "failed":
                failures.append((out["time"], r, out["message"].splitlines()[0] if out["message"] else "failed",
                                 out["traceback"]))
                continue
            if out["outcome"] == "skipped":
                skips.append((out["time"], r, out["message"]))
                continue
            # reported success: what came after is teardown
            sig = e.signal
            if sig == signal.SIGABRT:
                notes.append(f"rank {r} reported success, then aborted at exit (SIGABRT): torch's gloo "
                             f"teardown abort after a correct destroy_process_group, not a test failure")
            elif e.killed is not None or e.exit_code == 0:
                pass
            elif e.status is not None:
                failures.append((e.exit_time or out["time"], r, f"reported success, then {e.how()} at exit",
                                 e.stderr[-4000:]))
            if out.get("destroy_hung"):
                notes.append(f"rank {r}: destroy_process_group did not return within {DESTROY_BOUND_S:g} s")
            continue
        if e.killed is not None:
            hung.append(e)
            continue
        when = e.exit_time or time.time()
        detail = e.stderr[-4000:] or "(no stderr)"
        failures.append((when, r, f"{e.how()} without reporting a result" if e.status is not None
                         else POOL_LOST, detail))
    ws = res.world_size
    if not failures and not hung:
        if skips:
            reason = skips[0][2]
            where = "all ranks" if len(skips) == ws else f"rank(s) {', '.join(str(s[1]) for s in skips)}"
            return Verdict("skipped", f"{reason} (skipped on {where})", reason, notes)
        return Verdict("passed", "", "", notes)
    lines: list[str] = []
    # Root cause: the earliest failure that is not a peer loss (a rank that crashed is seen by the
    # forkserver a moment after its peers saw the connection drop), else the earliest failure.
    def key(ev: tuple[float, int, str, str, str]) -> tuple[bool, float, int]:
        consequence = ev[2] == "failed" and any(p in (ev[3] + ev[4][-600:]).lower() for p in PEER_LOSS)
        return (consequence, ev[0], ev[1])
    events: list[tuple[float, int, str, str, str]] = (
        [(t, r, "failed", one, detail) for t, r, one, detail in failures]
        + [(t, r, "skipped", f"pytest.skip: {m}", "") for t, r, m in skips])
    events.sort(key=key)
    if events:
        t0, root, kind, one, _ = events[0]
        summary = f"rank {root} {'failed' if kind == 'failed' else 'skipped'} first: {one}"
    else:
        root, t0 = -1, 0.0
        summary = ""
    if res.timed_out:
        live = ", ".join(str(e.rank) for e in hung)
        head = f"timed out after {res.timeout:g} s: rank(s) {live} still running"
        summary = f"{head}; {summary}" if summary else head
    lines.append(summary)
    for i, (t, r, kind, one, detail) in enumerate(events):
        if i == 0:
            lines.append(f"\n---- rank {r}: root cause ({kind} first) ----")
        else:
            lines.append(f"\n---- rank {r}: a peer that {kind} after rank {root} "
                         f"(+{max(t - t0, 0.0):.2f} s) ----")
        lines.append(detail.rstrip() if detail else one)
    for e in hung:
        why = (f"still running at the {res.timeout:g} s timeout" if e.killed == "timeout"
               else f"still running {PEER_GRACE_S:g} s after rank {root} failed")
        lines.append(f"\n---- rank {e.rank}: {why}; killed. Its Python stack: ----")
        lines.append(_user_stack(e.stack) or "(no stack dump: the rank did not answer SIGUSR1)")
    if notes:
        lines.append("")
        lines.extend(f"note: {n}" for n in notes)
    return Verdict("failed", summary, "\n".join(lines), notes)
