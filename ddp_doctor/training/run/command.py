"""`ddp-doctor run [torchrun options] [ddp-doctor options] (SCRIPT | -m MODULE) [ARGS...]`.

- Under a launcher (torchrun, mpirun, SLURM, SageMaker): act as this rank (rank_run).
- No launcher and no --nproc-per-node / --nnodes: one process, in this process, as `python SCRIPT`
  would run (scripts that start their own ranks with torch.multiprocessing.spawn work).
- Otherwise: start the ranks through torch's elastic launcher (agent.py), watch their heartbeats
  for hangs, and merge what they left into one report.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Any, NoReturn

from ddp_doctor.training.run.target import Target

DOCTOR_OPTIONS = {"--report": 1, "--timeout": 1, "--hang-timeout": 1, "--select": 1, "--skip": 1,
                  "--backend": 1, "--run-dir": 1, "--trace": 1, "--fail-on": 1, "--progress": 0,
                  "--no-progress": 0}
# torchrun's own options come from torch's launcher parser (torchrun_options.py); these of its
# spellings ddp-doctor acts on itself:
HELP_NAMES = ("-h", "--help")
MODULE_NAMES = ("-m", "--module")  # the target is a module: `-m MODULE` (python -m semantics)
RUN_PATH_NAMES = ("--run-path", "--run_path")  # runpy.run_path in the worker: what the ranks do anyway
NO_PYTHON_NAMES = ("--no-python", "--no_python")  # a binary, not Python: the ranks cannot run it
USAGE = ("ddp-doctor run [torchrun options] [--report PATH] [--timeout S] [--hang-timeout S] "
         "(SCRIPT | -m MODULE) [ARGS...]")


class RunUsageError(Exception):
    pass


class RunHelpAsked(Exception):
    """-h / --help before the script: main prints the help."""


def split_argv(argv: list[str]) -> tuple[list[str], list[str], Target]:
    """(torchrun options, ddp-doctor options, target), as torchrun splits its own command line:
    options end at the script (or module, after `-m` / `--module` among the options) or at `--`;
    everything after belongs to the script. Every option torch's launcher parser declares is taken
    (torchrun_options.py), with its values; a unique prefix of an option (argparse's
    abbreviation) is written out in full. `--run-path` is dropped (the ranks run the script with
    runpy already); `--no-python` is a usage error (the ranks run Python)."""
    torchrun: list[str] = []
    doctor: list[str] = []
    module = run_path = False
    lookup = _OptionLookup()
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if not a.startswith("-") or a == "-":
            break
        spelling, nargs, mine, inline = lookup.resolve(a)
        if spelling in HELP_NAMES:
            raise RunHelpAsked()
        dest = doctor if mine else torchrun
        if nargs == 0:
            if inline is not None:
                raise RunUsageError(f"{spelling} takes no value (got {a!r})")
            if spelling in MODULE_NAMES:
                module = True
            elif spelling in RUN_PATH_NAMES:
                run_path = True
            elif spelling in NO_PYTHON_NAMES:
                raise RunUsageError(f"{spelling}: ddp-doctor run runs the script in Python, in the rank's own process "
                                    f"(to watch it); for a program that is not Python, use torchrun itself")
            else:
                dest.append(spelling)
            i += 1
            continue
        if inline is not None:
            dest.append(inline)
            i += 1
            continue
        values = _values(argv, i + 1, nargs)
        if values is None:
            raise RunUsageError(f"{a} needs a value")
        dest += [spelling, *values]
        i += 1 + len(values)
    if i >= len(argv):
        raise RunUsageError("-m needs a module name" if module else f"no script or -m MODULE given (usage: {USAGE})")
    if module and run_path:
        raise RunUsageError("--run-path runs a script file, not a module (-m)")
    name, rest = argv[i], argv[i + 1:]
    return torchrun, doctor, (Target(None, name, rest) if module else Target(name, None, rest))


def _values(argv: list[str], at: int, nargs: int | str) -> list[str] | None:
    """The values an option with `nargs` takes from argv[at:], as argparse takes them (a token that
    starts with "-" ends "?", "*" and "+"); None when there are too few."""
    if isinstance(nargs, int):
        return argv[at:at + nargs] if at + nargs <= len(argv) else None
    taken: list[str] = []
    while at + len(taken) < len(argv) and not argv[at + len(taken)].startswith("-"):
        taken.append(argv[at + len(taken)])
        if nargs == "?":
            break
    return None if nargs == "+" and not taken else taken


class _OptionLookup:
    """ddp-doctor's options (DOCTOR_OPTIONS) and torchrun's; torchrun's table is loaded only for an
    option that is not one of ddp-doctor's own spellings (torchrun_options.table)."""

    def __init__(self) -> None:
        self._spellings: dict[str, tuple[str, ...]] | None = None  # torchrun's: each spelling -> all of its option
        self._nargs: dict[str, int | str] = {}

    def _torchrun(self, needed_for: str) -> dict[str, tuple[str, ...]]:
        if self._spellings is None:
            from ddp_doctor.training.run import torchrun_options
            try:
                options = torchrun_options.table().by_name()
            except ImportError as e:
                raise RunUsageError(f"{needed_for}: torchrun's options come from torch, which cannot be "
                                    f"imported here ({e})") from None
            self._spellings = {n: o.names for n, o in options.items()}
            self._nargs = {n: o.nargs for n, o in options.items()}
        return self._spellings

    def resolve(self, arg: str) -> tuple[str, int | str, bool, str | None]:
        """(spelling, nargs, whether it is ddp-doctor's own, the token to pass on when the value
        came with it, else None) for an option as given: `--name`, `--name=value`, a short option
        with its value attached (`-t3`), or a unique prefix of a long option (`--nproc-per 2`)."""
        name, eq, value = arg.partition("=")
        inline = None if not eq else arg
        if name in DOCTOR_OPTIONS:
            return name, DOCTOR_OPTIONS[name], True, inline
        if name in HELP_NAMES or name in MODULE_NAMES:
            return name, 0, False, inline
        torchrun = self._torchrun(arg)
        if name in torchrun:
            return name, self._nargs[name], False, inline
        if not arg.startswith("--") and len(arg) > 2 and self._nargs.get(arg[:2], 0) != 0:
            return arg[:2], self._nargs[arg[:2]], False, arg  # -t3: the short option with its value
        mine = [n for n in DOCTOR_OPTIONS if n.startswith(name)] if name.startswith("--") else []
        theirs = {torchrun[n] for n in torchrun if n.startswith(name)} if name.startswith("--") else set()
        if len(mine) + len(theirs) == 1:  # one option (its spellings are one): written out in full
            full = mine[0] if mine else next(n for n in next(iter(theirs)) if n.startswith(name))
            nargs = DOCTOR_OPTIONS[full] if mine else self._nargs[full]
            return full, nargs, bool(mine), f"{full}={value}" if eq else None
        if mine or theirs:
            every = sorted(mine + [n for names in theirs for n in names if n.startswith(name)])
            raise RunUsageError(f"ambiguous option {arg!r}: it could be {', '.join(every)}")
        raise RunUsageError(f"unknown option {arg!r} before the script (usage: {USAGE})")


class _DoctorParser(argparse.ArgumentParser):
    """argparse for the ddp-doctor options of `run`: a mistake is one RunUsageError line (main prints
    it and exits 2), never argparse's usage dump and exit."""

    def error(self, message: str) -> NoReturn:
        raise RunUsageError(f"bad ddp-doctor option: {message}")


def doctor_parser() -> argparse.ArgumentParser:
    """The ddp-doctor options of `run`; their help is `ddp-doctor run --help`'s (help_text)."""
    from ddp_doctor.time_limit import timeout_seconds  # the CLI's one rule for a bound (cli/options.py)
    p = _DoctorParser(prog="ddp-doctor run", add_help=False)
    p.add_argument("--report", default=None, metavar="PATH",
                   help="write the job's merged JSON report there, pass or fail "
                        "(default: $DDP_DOCTOR_REPORT, else ./ddp-doctor-report.json)")
    p.add_argument("--timeout", type=timeout_seconds, default=60.0, metavar="S",
                   help="bound in seconds for each wait of the preflight and the ranks' meeting (default: 60)")
    p.add_argument("--hang-timeout", type=timeout_seconds, default=None, metavar="S",
                   help="a rank without progress for S seconds is a hang: stacks, report, exit 124 "
                        "(default: adapts to the job, at least 300)")
    p.add_argument("--select", action="append", metavar="X",
                   help="run only these preflight checks: IDs, ID prefixes (DDP2) or categories, comma-separated")
    p.add_argument("--skip", action="append", metavar="X", help="skip these checks (same forms as --select)")
    p.add_argument("--backend", choices=("gloo", "nccl", "smddp", "mpi"),
                   help="process-group backend of the preflight (default: nccl with GPUs, gloo without)")
    p.add_argument("--run-dir", default=None, metavar="DIR",  # run/run_dir.py
                   help="keep the run directory (records, ledgers, stacks) inside DIR")
    p.add_argument("--trace", default=None, metavar="PATH",  # run/trace_file.py
                   help="also write the ranks' timelines as a Chrome trace there (ui.perfetto.dev)")
    p.add_argument("--progress", dest="progress", action="store_const", const=True, default=None,
                   help="say on stderr which rank has made no progress, where, and when the job will be ended "
                        "(default: $DDP_DOCTOR_PROGRESS, else only when stdout is a terminal)")
    p.add_argument("--no-progress", dest="progress", action="store_const", const=False,
                   help="no progress lines, even on a terminal")
    from ddp_doctor.exit_codes import FAIL_ON_LEVELS  # exit 3 after a training that exited 0 (fail_on_exit)
    p.add_argument("--fail-on", choices=FAIL_ON_LEVELS, default=None,
                   help="after a training that exited 0: exit 3 when the report holds a finding of this "
                        "severity or worse (default: $DDP_DOCTOR_FAIL_ON)")
    return p


# torchrun options whose meaning under `ddp-doctor run` is not torch's help (split_argv, agent.py)
TORCHRUN_NOTES = {
    "-m": "the script is a module: -m MODULE runs it as `python -m MODULE` would",
    "--run-path": "taken; changes nothing: each rank runs the script with runpy in its own process anyway",
    "--no-python": "not with ddp-doctor run, which runs the script in Python (use torchrun for a binary)",
    "--signals-to-handle": "ignored: ddp-doctor run takes SIGTERM, SIGINT and SIGHUP itself and reports the stop",
}
ABOUT = """\
Runs SCRIPT (or -m MODULE) as torchrun would, after a preflight of every rank, and watches it: a
failure, a hang or a stop ends in one report that names the rank at fault. Without --nproc-per-node
or --nnodes the script runs as one process, as `python SCRIPT` would; under a launcher (torchrun,
mpirun, SLURM, SageMaker) each process acts as its own rank. The script's output is its own."""
EXIT_STATUS = ("exit status: the script's own after a preflight that passed; 3 when the preflight found errors "
               "(the script did not start); 124 for a hang; 2 for a usage error")


def help_text() -> str:
    """`ddp-doctor run --help`: usage, ddp-doctor's options and torchrun's (from torch's own
    parser, torchrun_options.py), one line each."""
    rows: list[tuple[str, str]] = [("-h, --help", "show this help and exit")]
    mine: list[tuple[str, str]] = []
    for action in doctor_parser()._actions:  # argparse keeps no public list of its actions
        if action.option_strings:
            value = f" {action.metavar}" if action.metavar else (
                " {" + ",".join(map(str, action.choices)) + "}" if action.choices else "")
            mine.append((", ".join(action.option_strings) + value, str(action.help or "")))
    theirs: list[tuple[str, str]] = []
    from ddp_doctor.training.run import torchrun_options
    try:
        table = torchrun_options.table()
        title = f"torchrun options (torch {table.torch_version}; passed to torch's elastic launcher):"
        for o in table.options:
            if set(o.names) & set(HELP_NAMES):
                continue
            note = next((TORCHRUN_NOTES[n] for n in o.names if n in TORCHRUN_NOTES), None)
            theirs.append((", ".join(o.names) + (f" {o.metavar}" if o.metavar else ""), note or o.help))
    except ImportError as e:
        title = f"torchrun options: torch cannot be imported here ({e})"
    width = min(46, max(len(left) for left, _ in rows + mine + theirs) + 2)

    def lines(entries: list[tuple[str, str]]) -> list[str]:
        return [f"  {left.ljust(width)}{text}".rstrip() if len(left) < width else f"  {left}  {text}".rstrip()
                for left, text in entries]

    return "\n".join([f"usage: {USAGE}", "", ABOUT, "", "options:", *lines(rows), "", "ddp-doctor options:",
                      *lines(mine), "", title, *lines(theirs), "", EXIT_STATUS, ""])


NPROC_ACCEPTED = "a whole number of processes above 0, cpu, auto, or gpu / xpu where that device is present"


def check_nproc_per_node(torchrun: list[str]) -> None:
    """Every --nproc-per-node given for torchrun, judged as torch.distributed.run takes it
    (determine_local_world_size): a whole number as int() reads it, and above 0 (torchrun takes 0 or
    -3 and fails later with a bare AssertionError), or cpu or auto; another word (gpu, xpu, the
    privateuse1 device's name) is asked of torch's own function, which knows whether that device is
    here. RunUsageError, one line, otherwise."""
    names = ("--nproc-per-node", "--nproc_per_node")
    for i, a in enumerate(torchrun):
        key, eq, val = a.partition("=")
        if key not in names:
            continue
        value = val if eq else (torchrun[i + 1] if i + 1 < len(torchrun) else "")
        why = _nproc_problem(value)
        if why:
            raise RunUsageError(f"--nproc-per-node {value!r}: {why}; torchrun takes {NPROC_ACCEPTED}")


def _nproc_problem(value: str) -> str | None:
    try:
        n: int | None = int(value)
    except ValueError:
        n = None
    if n is not None:
        return None if n >= 1 else "no process would start"
    if value in ("cpu", "auto"):
        return None
    try:
        from torch.distributed.run import determine_local_world_size
        n = determine_local_world_size(value)
    except ImportError:
        return None  # no torch to ask here: the launcher says it
    except Exception as e:  # noqa: BLE001 - torch's answer for a word it does not take (ValueError, RuntimeError)
        said = (str(e).splitlines() or [type(e).__name__])[0]
        return f"torch says {said[:160]!r}"
    return None if isinstance(n, int) and n >= 1 else f"no {value} device on this host"


def torchrun_value(torchrun: list[str], *names: str) -> str | None:
    for i, a in enumerate(torchrun):
        key, _, val = a.partition("=")
        if key in names:
            return val if val else (torchrun[i + 1] if i + 1 < len(torchrun) else None)
    return None


def run_options(doctor: list[str], target: Target) -> Any:
    from ddp_doctor import checks as catalogue
    from ddp_doctor import registry
    from ddp_doctor.training.run.rank import RunOptions
    try:
        ns = doctor_parser().parse_args(doctor)
    except SystemExit:  # argparse's own exit (e.g. a handler that exits): still one usage line
        raise RunUsageError(f"bad ddp-doctor option in {' '.join(doctor)!r} (usage: {USAGE})") from None
    select, skip = registry.parse_selectors(ns.select), registry.parse_selectors(ns.skip)
    bad = catalogue.unknown_selectors(select + skip)
    if bad:
        raise RunUsageError(f"--select/--skip: {', '.join(bad)} match no check")
    from ddp_doctor.exit_codes import fail_on_setting
    try:
        fail_on = fail_on_setting(ns.fail_on, os.environ)  # --fail-on, else DDP_DOCTOR_FAIL_ON
    except ValueError as e:
        raise RunUsageError(str(e)) from None
    return RunOptions(target=target, timeout=ns.timeout, hang_timeout=ns.hang_timeout,
                      select=select, skip=skip, backend=ns.backend, report_path=ns.report, run_dir=ns.run_dir,
                      trace_path=ns.trace, fail_on=fail_on, progress=ns.progress)


def main(argv: list[str]) -> int:
    """Entry of `ddp-doctor run`; returns the exit status (the script's own after a preflight)."""
    try:
        torchrun, doctor, target = split_argv(argv)
    except RunHelpAsked:
        sys.stdout.write(help_text())
        return 0
    opts = run_options(doctor, target)
    check_nproc_per_node(torchrun)
    if target.path and not os.path.isfile(target.path):
        raise RunUsageError(f"no such script: {target.path}")
    from ddp_doctor.facts.launchers import launcher_name
    if launcher_name(os.environ) != "none" or not (
            torchrun_value(torchrun, "--nproc-per-node", "--nproc_per_node") or torchrun_value(torchrun, "--nnodes")):
        if torchrun and launcher_name(os.environ) != "none":
            sys.stderr.write("ddp-doctor run: warning: launcher options ignored under a launcher\n")
        from ddp_doctor.training.run.rank import run_training_rank
        return run_training_rank(opts)
    return launch(torchrun, doctor, target, opts)


# ---------------------------------------------------------------- the parent of local ranks

def agent_command(torchrun: list[str], doctor: list[str], target: Target) -> list[str]:
    args = list(torchrun)
    if torchrun_value(args, "--max-restarts", "--max_restarts") is None:
        args += ["--max-restarts", "0"]
    nnodes = torchrun_value(args, "--nnodes") or "1"
    given = any(torchrun_value(args, n) for n in ("--master-addr", "--master_addr", "--rdzv-endpoint",
                                                   "--rdzv_endpoint", "--master-port", "--master_port"))
    if nnodes == "1" and not given and "--standalone" not in args:
        args.append("--standalone")  # a free port for the store: no collisions between jobs
    # Several nodes: the launcher's own rendezvous waits for the others 900 s by default (static:
    # timeout, c10d: join_timeout): bound it by --timeout, as the preflight bounds the ranks' meeting.
    bound = str(max(1, math.ceil(float(torchrun_value(doctor, "--timeout") or 60))))
    conf = torchrun_value(args, "--rdzv-conf", "--rdzv_conf")
    keys = {kv.split("=", 1)[0].strip() for kv in (conf or "").split(",") if "=" in kv}
    more = [f"{k}={bound}" for k in ("timeout", "join_timeout") if k not in keys] if nnodes != "1" else []
    if more:
        args = [a for i, a in enumerate(args) if a.split("=", 1)[0] not in ("--rdzv-conf", "--rdzv_conf")
                and not (i and args[i - 1] in ("--rdzv-conf", "--rdzv_conf"))]
        args.append("--rdzv-conf=" + ",".join(([conf] if conf else []) + more))
    tail = ["-m", target.module] if target.module else [str(target.path)]
    return [sys.executable, "-m", "ddp_doctor.training.run.agent", *args, "-m", "ddp_doctor", "run",
            *doctor, *tail, *target.args]


def launch(torchrun: list[str], doctor: list[str], target: Target, opts: Any) -> int:
    """Start the ranks through torch's elastic launcher (agent.py), watch them, and write the report.
    Stop signals stay blocked until the report is written and published: each stop is reported
    once, whatever its timing, and the exit status is then 128 + the first one's number. A stop
    sent to the launcher comes here (agent.py passes it on); a launcher killed outright takes its
    ranks with it (rank.py), and this parent, their adopter, ends any it left (DDP810)."""
    from ddp_doctor.processes.stop_signals import SignalCatcher, note_later
    from ddp_doctor.processes.tree import adopting, launcher_preexec
    from ddp_doctor.report.private_files import keep_dir, make_records_dir
    from ddp_doctor.report.publish import warn
    from ddp_doctor.training import records
    from ddp_doctor.training.run.agent import RESULT_ENV
    from ddp_doctor.training.run.ledger import recorder_env
    from ddp_doctor.training.run.rank import PARENT_ENV, RECORDS_NOTE_ENV, RUN_DIR_ENV
    from ddp_doctor.training.run.watchdog import collect_stacks

    keep_in = opts.run_dir  # --run-dir: the run directory is made inside it and kept
    # 0700, with room for the records; a full or read-only place (TMPDIR, --run-dir) moves them, with
    # a warning here and in the report (DDP813), never the job's exit status
    run_dir, note = make_records_dir(parent=keep_in)
    keep_dir(run_dir)  # removed while the job runs: made again
    if note:
        warn(note)
    if keep_in:
        sys.stderr.write(f"ddp-doctor: run directory (records, ledgers, stacks): {run_dir}\n")
    env = dict(os.environ)
    from ddp_doctor.facts.own_env import quiet_missing_numpy
    quiet_missing_numpy(env)  # the launcher and every rank: no "Failed to initialize NumPy" x3
    env.update({RUN_DIR_ENV: run_dir, PARENT_ENV: "1", RESULT_ENV: records.agent_result_path(run_dir)})
    if note:
        env[RECORDS_NOTE_ENV] = note
    env.setdefault("OMP_NUM_THREADS", "1")
    recorder_env(env, run_dir)  # ledgers of collectives, NCCL's dumps on timeout; never the user's values
    hang = None
    stuck_in_init = False
    slow: dict[str, Any] = {}  # the longest wait for a slow rank, not (yet) a hang
    lines = _progress_lines(opts)  # --progress: a line as the ranks' stall nears the bound
    from ddp_doctor.preflight_run.progress import StageLines
    stages = StageLines(time.time(), None, None, per_wait=float(opts.timeout))  # the preflight's, until training
    with SignalCatcher(hold=True) as stop:  # SIGTERM/SIGINT/SIGHUP: where the ranks were, then a report
        with adopting() as since:
            proc = subprocess.Popen(agent_command(torchrun, doctor, target), env=env, preexec_fn=launcher_preexec)
            launched = time.monotonic()
            try:
                while proc.poll() is None and stop.wait(0.5) is None:
                    end_stuck_at_exit(run_dir, TEARDOWN_BOUND)
                    hang = detect_hang(run_dir, opts.hang_timeout, slow)
                    if lines is not None and hang is None:
                        _say_progress(lines, run_dir, stages)
                    stuck_in_init = detect_bad_init(run_dir)
                    if hang is not None or stuck_in_init:
                        break
                    if nodes_never_met(run_dir, torchrun, opts, launched):  # ends the agent; finish reports it
                        break
                stop.caught = sent_to_launcher(stop.caught, proc.pid)
                ended_here = proc.poll() is None  # this parent ends the launcher (else it ended on its own)
                if stop.caught is not None and proc.poll() is None:
                    sys.stderr.write(f"ddp-doctor: {stop.caught.describe()}: taking the ranks' stacks and ledgers, "
                                     f"then stopping them\n")
                    hang = collect_stacks(run_dir, records.read_heartbeats(run_dir), reason="interrupted")
                    end_launcher(run_dir, proc, since)
                elif hang is not None:
                    nnodes = torchrun_value(torchrun, "--nnodes") or "1"
                    hang = collect_stacks(run_dir, hang, across=nnodes not in ("1", "1:1"))
                    end_launcher(run_dir, proc, since)
                else:
                    end_launcher(run_dir, proc, since, grace=0.5)  # nothing may outlive the launcher
            except BaseException:  # Ctrl-C or a bug in the loop: the launcher is still ended, then it goes on up
                end_launcher(run_dir, proc, since)
                raise
        try:
            code = finish(run_dir, proc.returncode, hang, opts, torchrun, stuck_in_init=stuck_in_init,
                          slow=slow, signals=stop, launcher_pid=proc.pid, ended_here=ended_here)
        finally:
            from ddp_doctor.report.private_files import tighten_tree
            from ddp_doctor.training.run.nccl_dumps import dump_files
            if keep_in:  # the user's --run-dir: everything stays
                tighten_tree(run_dir)  # NCCL's dumps and log, written with the umask: 0600 as ours are
            elif dump_files(run_dir):  # NCCL's dumps are the evidence the report points to: keep them
                tighten_tree(run_dir)
                sys.stderr.write(f"ddp-doctor: NCCL flight recorder dumps kept in {run_dir}\n")
            else:
                import shutil
                shutil.rmtree(run_dir, ignore_errors=True)
        note_later([sent_to_launcher(s, proc.pid) for s in stop.drain()],
                   "while the report was written; it was written first")
    first = stop.first()  # the exit status a stop signal asks for, whenever it came
    return first.exit_code if first is not None else code


def sent_to_launcher(stop: Any, launcher_pid: int) -> Any:
    """A stop signal the launcher passed on (agent.py) is one sent to the launcher: say so, and not
    that the launcher sent it."""
    if stop is None or stop.sender_pid != launcher_pid:
        return stop
    from dataclasses import replace
    return replace(stop, sender_pid=None, sender=None, to=f"the launcher (torch's elastic agent, pid {launcher_pid})")


def end_launcher(run_dir: str, proc: subprocess.Popen[Any], since: float, grace: float = 5.0) -> None:
    """End the launcher and every process of the launch; the launcher is told first that this
    parent ends it, so it ends its ranks instead of passing the signal back here (agent.py)."""
    from ddp_doctor.processes.tree import terminate_tree
    from ddp_doctor.training.run.agent import parent_ends
    if proc.poll() is None:
        parent_ends(run_dir)
    terminate_tree(proc, grace=grace, since=since)


NODES_GRACE = 20.0  # seconds past the rendezvous bound before the parent ends a waiting launcher


def nodes_never_met(run_dir: str, torchrun: list[str], opts: Any, launched: float) -> bool:
    """Several nodes, and no rank of this one started within the launcher's rendezvous bound
    (+ NODES_GRACE): the launcher still waits for a node that never came. Then the finding that
    names the missing node(s) is left where finish reads the preflight, and True is returned (the
    caller ends the launcher). The launcher's own bound (agent_command) normally ends it first.
    `launched`: time.monotonic() when the launcher was started."""
    from types import SimpleNamespace

    from ddp_doctor.training.run import agent
    nnodes = torchrun_value(torchrun, "--nnodes") or "1"
    if agent.nodes_of(SimpleNamespace(nnodes=nnodes))[0] <= 1:
        return False  # one node ("1", "1:1"): there is no other node to wait for
    from ddp_doctor.training import records
    if os.path.isdir(records.preflight_dir(run_dir)) or records.read_heartbeats(run_dir):
        return False  # a rank started: the nodes met
    value = torchrun_value
    args = SimpleNamespace(
        nnodes=nnodes, node_rank=value(torchrun, "--node-rank", "--node_rank") or "0",
        nproc_per_node=value(torchrun, "--nproc-per-node", "--nproc_per_node") or "1",
        master_addr=value(torchrun, "--master-addr", "--master_addr") or "127.0.0.1",
        master_port=value(torchrun, "--master-port", "--master_port") or "29500",
        rdzv_backend=value(torchrun, "--rdzv-backend", "--rdzv_backend") or "static",
        rdzv_endpoint=value(torchrun, "--rdzv-endpoint", "--rdzv_endpoint") or "",
        rdzv_conf=value(torchrun, "--rdzv-conf", "--rdzv_conf") or "")
    bound = max(float(opts.timeout), agent.rendezvous_bound(args) or 0.0)
    waited = time.monotonic() - launched
    if waited < bound + NODES_GRACE:
        return False
    agent.write_node_report(run_dir, agent.rendezvous_finding(
        args, TimeoutError(f"the launcher was still waiting after {waited:.0f} s"), bound))
    return True


TEARDOWN_BOUND = 60.0  # seconds a rank may take to exit after its script ended


def end_stuck_at_exit(run_dir: str, bound: float) -> list[int]:
    """Ranks whose script ended (outcome recorded) but whose process has not exited within
    `bound`: interpreter teardown hangs (seen with torch 2.13's gloo). End them; the script's own
    exit status stands and the report says so (DDP806)."""
    import signal

    from ddp_doctor.training import records
    now = time.time()
    ended = []
    for r, o in records.read_outcomes(run_dir).items():
        if now - float(o.get("time", now)) > bound:
            try:
                os.kill(int(o["pid"]), signal.SIGKILL)
                ended.append(r)
            except (OSError, KeyError, ValueError):
                pass
    return ended


def detect_hang(run_dir: str, hang_timeout: float | None,
                slow: dict[str, Any] | None = None) -> dict[int, dict[str, Any]] | None:
    """The heartbeats, when the job is hung (training/run/hang_bound.py), each with the bound that
    was applied ("bound"); None while it is not. A slow rank the others wait for (not yet a hang)
    is noted in `slow`: the longest such wait, who waited, who was working and where."""
    from ddp_doctor.training import records
    from ddp_doctor.training.run.hang_bound import HangBound, judge
    hbs = records.read_heartbeats(run_dir)
    done = records.read_outcomes(run_dir)
    training = {r: hb for r, hb in hbs.items() if hb.get("phase") == "training" and r not in done}
    now = time.time()
    verdict = judge(training, now, HangBound(hang_timeout))
    if verdict is None:
        return None
    if not verdict.hung:
        waited = max(now - float(training[r].get("last_progress", now)) for r in verdict.stalled)
        if slow is not None and waited > float(slow.get("waited", 0)):
            slow.update(waited=round(waited, 1), waiting=verdict.stalled, working=verdict.moving,
                        where={str(r): training[r].get("where") for r in verdict.moving})
        return None
    return {r: {**hb, "bound": verdict.bound} for r, hb in hbs.items()}


def _progress_lines(opts: Any) -> Any:
    """The rule of the hang progress lines (training/run/progress.py), when they are asked for."""
    from ddp_doctor.processes.progress import enabled
    from ddp_doctor.training.run.hang_bound import HangBound
    from ddp_doctor.training.run.progress import HangLines
    return HangLines(HangBound(opts.hang_timeout)) if enabled(getattr(opts, "progress", None)) else None


def _say_progress(lines: Any, run_dir: str, stages: Any) -> None:
    """The hang progress line once the ranks train; before, the preflight's stage line."""
    from ddp_doctor.processes.launch_dir import read_stages
    from ddp_doctor.processes.progress import say
    from ddp_doctor.training import records
    from ddp_doctor.training.run.progress import training_beats
    now = time.time()
    if any(hb.get("phase") != "preflight" for hb in records.read_heartbeats(run_dir).values()):
        say(lines.due(training_beats(run_dir), now))
    elif now - stages.launched >= stages.next_at:
        say(stages.due(read_stages(records.preflight_dir(run_dir)), now))


def detect_bad_init(run_dir: str) -> bool:
    """Whether processes wait inside init_process_group with arguments that cannot work (a rank
    taken twice, a world size the launcher did not start, a rank outside the world): then the job
    is ended at once. The bounded wait before judging is training/run/init_verdict.py's."""
    from ddp_doctor.training import records
    from ddp_doctor.training.run.init_verdict import judge_waiting
    calls = records.read_init_calls(run_dir)
    return judge_waiting(calls, time.time(), launched=len(records.read_heartbeats(run_dir)))[0]


def finish(run_dir: str, agent_code: int | None, hang: dict[int, dict[str, Any]] | None, opts: Any,
           torchrun: list[str], *, stuck_in_init: bool = False, interrupted: Any = None,
           slow: dict[str, Any] | None = None, signals: Any = None, launcher_pid: int | None = None,
           ended_here: bool = True) -> int:
    """Merge what the ranks left into the job's report, publish it, and return the exit status.
    `signals`: the parent's SignalCatcher, still blocking the stop signals: those pending now join
    the stop (or, after the job's own end, are noted: DDP811). `launcher_pid`: the launcher's pid;
    `ended_here`: this parent ended it. When it ended on its own, a stop it was sent (agent.py's
    record) is the job's stop, and a launcher killed or failed before its ranks ended is DDP810."""
    from ddp_doctor.checks.job import JobEvidence
    from ddp_doctor.checks.stops import late_stop_finding
    from ddp_doctor.exit_codes import EXIT_FAILED
    from ddp_doctor.processes.launch_dir import merge_launch_dir
    from ddp_doctor.report import build as reportlib
    from ddp_doctor.report.publish import Output, platform_sinks, publish
    from ddp_doctor.training import records
    from ddp_doctor.training.job_report import job_report
    from ddp_doctor.training.run.endings import remote_hung
    from ddp_doctor.training.run.run_dir import read_run

    out = Output(report_path=opts.report_path, only_if_not_pass=True, stderr=True, verdict_if_pass=True)
    pf_dir = records.preflight_dir(run_dir)
    run = read_run(run_dir)
    heartbeats = run.heartbeats
    late: list[Any] = []
    if signals is not None:
        taken = [sent_to_launcher(x, launcher_pid or -1) for x in signals.drain()]
        signals.later[len(signals.later) - len(taken):] = taken
        interrupted = signals.stopped() or interrupted
        late = [] if signals.caught is not None else list(signals.later)
        from ddp_doctor.processes.stop_signals import note_later
        note_later(taken, "after the ranks had ended; noted in the report (DDP811)" if late
                   else "while the ranks were being stopped; noted in the report")
    if interrupted is None and launcher_pid is not None and not ended_here:
        interrupted = launcher_stop(run_dir, launcher_pid)  # torch's own handler took it (agent.py)
        if interrupted is not None and hang is None:
            hang = dict(heartbeats)  # where the ranks were: their last heartbeats
    ended = (launcher_ended(run_dir, agent_code, launcher_pid, run)
             if interrupted is None and hang is None and not stuck_in_init and not ended_here else None)
    nproc = len(heartbeats) or 1
    pf = (merge_launch_dir(pf_dir, nproc, agent_code, False, 0.0, expected=sorted(heartbeats) or None)
          if os.path.isdir(pf_dir) else None)
    if pf is not None and pf["status"] == "fail" and not run.outcomes:
        rep, code = pf, EXIT_FAILED
        if ended is not None:
            rep = _with_findings(rep, ended)
        if interrupted is not None:
            rep = reportlib.mark_interrupted(rep, interrupted.to_dict())
    else:
        try:
            with open(records.agent_result_path(run_dir), encoding="utf-8") as f:
                exits = {int(k): int(v) for k, v in json.load(f).items()}
        except (OSError, ValueError):
            exits = {}
        ranks = sorted(set(heartbeats) | set(run.outcomes) | set(exits))
        stopped_at = dict(hang or {})
        if hang is not None and interrupted is None:
            stopped_at = {**remote_hung(run_dir), **stopped_at}  # other nodes' ranks, copied at the hang
            ranks = sorted(set(ranks) | set(stopped_at))
        ev = JobEvidence(
            ranks=ranks, outcomes=run.outcomes, exits=exits if hang is None and interrupted is None else {},
            crashes=run.crashes, ledgers=run.ledgers, init_calls=run.init_calls, probes=run.probes,
            stopped_at=stopped_at, stacks=run.stacks(stopped_at), interrupted=interrupted,
            hung=hang is not None and interrupted is None, hang_timeout=float(opts.hang_timeout or 0.0),
            slow=slow or None, stuck_in_init=stuck_in_init, launcher_code=agent_code,
            world_size=len(ranks) or None, started=bool(heartbeats), launched_alone=True)
        rep, code = job_report(ev, world=(pf or {}).get("world") or {"launcher": "torchrun"},
                               ranks=(pf or {}).get("ranks") or [],
                               earlier=[*(reportlib.findings_of(pf) if pf else []), *([ended] if ended else [])],
                               measurements=(pf or {}).get("measurements") or {})
    if interrupted is not None:
        code = interrupted.exit_code
    elif ended is not None:
        code = 128 - agent_code if agent_code is not None and agent_code < 0 else (agent_code or EXIT_FAILED)
    if late and interrupted is None:  # the job had ended: its verdict stands, the signal is noted
        rep = _with_findings(rep, late_stop_finding(late[0]))
    from ddp_doctor.training.run.trace_file import write_trace_if_asked
    write_trace_if_asked(opts, run_dir, rep)
    publish(rep, out)
    if rep.get("status") in ("fail", "interrupted"):
        from ddp_doctor.context import current_context
        platform_sinks(rep, current_context())  # SageMaker's failure file, when on SageMaker
    from ddp_doctor.report.publish import apply_fail_on
    return apply_fail_on(code, rep, getattr(opts, "fail_on", None))  # --fail-on: 0 -> 3 on such a finding


def _with_findings(rep: dict[str, Any], *more: Any) -> dict[str, Any]:
    """`rep` rebuilt with `more` findings (status and root cause judged again); the keys the
    builder does not make (a training report's "preflight_status") are kept."""
    from ddp_doctor.report import build as reportlib
    new = reportlib.build_report(world=rep.get("world") or {}, ranks=rep.get("ranks") or [],
                                 findings=[*reportlib.findings_of(rep), *more],
                                 measurements=rep.get("measurements") or {}, phase=rep.get("phase") or "preflight")
    return {**rep, **new}


def launcher_stop(run_dir: str, launcher_pid: int) -> Any:
    """The stop signal the launcher recorded when it ended its ranks itself (agent.py: torch's own
    handler took the signal, or a second one came before this parent acted), as a stop of the job."""
    from ddp_doctor.processes.stop_signals import Interrupt
    from ddp_doctor.training.run.agent import read_stop
    signo = read_stop(run_dir)
    if signo is None:
        return None
    return Interrupt(signo, to=f"the launcher (torch's elastic agent, pid {launcher_pid})")


def launcher_ended(run_dir: str, agent_code: int | None, launcher_pid: int | None, run: Any) -> Any:
    """DDP810 when the launcher ended on its own before its ranks did: killed by a signal (it has
    no exit status to give for them), or exited with an error without recording any rank's failure
    (agent.json) while started ranks had no ending. None otherwise."""
    from ddp_doctor.checks.stops import launcher_ended_finding
    from ddp_doctor.training import records
    if launcher_pid is None or not agent_code:
        return None
    unended = {r: hb for r, hb in run.heartbeats.items() if r not in run.outcomes}
    if agent_code > 0 and (os.path.exists(records.agent_result_path(run_dir)) or not unended):
        return None  # the launcher's failure is its ranks' (agent.json), or it failed before any started
    phase = "training" if run.heartbeats else "preflight"
    return launcher_ended_finding(agent_code, launcher_pid, unended, phase=phase)
