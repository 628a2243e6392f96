"""`ddp-doctor run`'s own command line: split into torchrun's options, ddp-doctor's and the target
(split_argv, as torchrun splits its own), ddp-doctor's options read into RunOptions (run_options),
`--nproc-per-node` judged as torch takes it, and `run --help` (help_text). Each rank started by the
parent reads its options here again: the launcher starts it as `python -m ddp_doctor run ...`
(training/run/agent.py agent_command).
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from ddp_doctor.cli.options import UsageError
from ddp_doctor.training.run.target import Target

DOCTOR_OPTIONS = {"--report": 1, "--timeout": 1, "--hang-timeout": 1, "--select": 1, "--skip": 1,
                  "--backend": 1, "--run-dir": 1, "--trace": 1, "--fail-on": 1, "--exit-by-action": 0, "--progress": 0,
                  "--no-progress": 0, "--quiet": 0, "--history": 1, "--no-history": 0, "--verbose": 0}
DOCTOR_SHORT = {"-v": "--verbose", "-q": "--quiet"}  # written out in full for the ranks' command line
# torchrun's own options come from torch's launcher parser (torchrun_options.py); these of its
# spellings ddp-doctor acts on itself:
HELP_NAMES = ("-h", "--help")
MODULE_NAMES = ("-m", "--module")  # the target is a module: `-m MODULE` (python -m semantics)
RUN_PATH_NAMES = ("--run-path", "--run_path")  # runpy.run_path in the worker: what the ranks do anyway
NO_PYTHON_NAMES = ("--no-python", "--no_python")  # a binary, not Python: the ranks cannot run it
USAGE = ("ddp-doctor run [torchrun options] [--report PATH] [--timeout S] [--hang-timeout S] "
         "(SCRIPT | -m MODULE) [ARGS...]")


class RunUsageError(UsageError):
    """A mistake in `run`'s command line: main prints it and exits 2, as for any usage error."""


class RunHelpAsked(Exception):
    """-h / --help before the script: main prints the help."""


def split_argv(argv: list[str], defaults: Sequence[EnvDefault] = ()) -> tuple[list[str], list[str], Target]:
    """(torchrun options, ddp-doctor options, target), as torchrun splits its own command line:
    options end at the script (or module, after `-m` / `--module` among the options) or at `--`;
    everything after belongs to the script. Every option torch's launcher parser declares is taken
    (torchrun_options.py), with its values; a unique prefix of an option (argparse's
    abbreviation) is written out in full. `--run-path` is dropped (the ranks run the script with
    runpy already); `--no-python` is a usage error (the ranks run Python). `defaults`: torchrun's
    PET_* defaults (env_defaults); the flags among them that change how the command line splits
    (PET_MODULE, PET_RUN_PATH, PET_NO_PYTHON) are taken here, the others by with_env_defaults."""
    torchrun: list[str] = []
    doctor: list[str] = []
    flags = {n for d in defaults if d.value is None for n in d.names}
    module, run_path = bool(flags & set(MODULE_NAMES)), bool(flags & set(RUN_PATH_NAMES))
    if flags & set(NO_PYTHON_NAMES):
        raise RunUsageError("PET_NO_PYTHON asks torchrun to run a program that is not Python; ddp-doctor run runs "
                            "the script in Python, in the rank's own process (to watch it): unset PET_NO_PYTHON")
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


SPLITTING_FLAGS = (*MODULE_NAMES, *RUN_PATH_NAMES, *NO_PYTHON_NAMES)  # taken by split_argv


def with_env_defaults(torchrun: list[str], defaults: Sequence[EnvDefault]) -> tuple[list[str], dict[str, str]]:
    """torchrun's options as given, with each PET_* default (env_defaults) added where the command
    line does not give that option, as torchrun takes them; and each added option's spellings ->
    its variable (a usage error about that value names the variable)."""
    out, origin = list(torchrun), {}
    for d in defaults:
        if _given(torchrun, *d.names) or any(a in d.names for a in torchrun) or set(d.names) & set(SPLITTING_FLAGS):
            continue
        out += [d.spelling] if d.value is None else [d.spelling, d.value]
        origin.update({n: d.env for n in d.names})
    return out, origin


@dataclass(frozen=True)
class EnvDefault:
    """A torchrun option's default from its PET_* variable (torch's argparse_util `env` and
    `check_env` actions): what Kubeflow's operators set to configure torchrun in a pod."""
    names: tuple[str, ...]  # the option's spellings
    env: str                # PET_<DEST>
    value: str | None       # the variable's text; None for a flag it turns on

    @property
    def spelling(self) -> str:
        return next((n for n in self.names if n.startswith("--") and "_" not in n), self.names[0])


def env_defaults(env: Mapping[str, str]) -> list[EnvDefault]:
    """torchrun's options whose PET_* variable is set in `env`, read as torchrun reads them: a
    value option takes the variable's text; a flag is on when the text is a whole number other than
    0 (torch raises on another text: here one RunUsageError line). torchrun's table is loaded only
    when some PET_ variable is set."""
    if not any(k.startswith("PET_") for k in env):
        return []
    from ddp_doctor.cli import torchrun_options
    try:
        options = torchrun_options.table().options
    except ImportError:
        return []  # no torch: torchrun could not run either; the launch says so
    out = []
    for o in options:
        if not o.env or o.env not in env:
            continue
        text = env[o.env]
        if o.nargs != 0:
            out.append(EnvDefault(o.names, o.env, text))
            continue
        try:
            on = int(text) != 0
        except ValueError:
            raise RunUsageError(f"{o.env}={text!r}: torchrun reads it as a whole number (0: off, else on) "
                                f"for {o.names[-1]}") from None
        if on:
            out.append(EnvDefault(o.names, o.env, None))
    return out


def _called(spelling: str, value: str, origin: Mapping[str, str]) -> str:
    """An option's value as a usage error names it: `--nnodes '0'`, or `PET_NNODES='0' (torchrun's
    default for --nnodes)` when the value came from the variable."""
    env = origin.get(spelling)
    return f"{env}={value!r} (torchrun's default for {spelling})" if env else f"{spelling} {value!r}"


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
            from ddp_doctor.cli import torchrun_options
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
        name = DOCTOR_SHORT.get(name, name)
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
    p.add_argument("--run-dir", default=None, metavar="DIR",  # training/run/run_dir.py
                   help="keep the run directory (records, ledgers, stacks) inside DIR")
    p.add_argument("--trace", default=None, metavar="PATH",  # training/run/trace_file.py
                   help="also write the ranks' timelines as a Chrome trace there (ui.perfetto.dev)")
    p.add_argument("--progress", dest="progress", action="store_const", const=True, default=None,
                   help="say on stderr which rank has made no progress, where, and when the job will be ended "
                        "(default: $DDP_DOCTOR_PROGRESS, else on)")
    p.add_argument("--no-progress", "--quiet", "-q", dest="progress", action="store_const", const=False,
                   help="no progress lines")
    p.add_argument("--history", default=None, metavar="PATH",
                   help="append this job's figures to the history there (default: $DDP_DOCTOR_HISTORY, else "
                        "~/.cache/ddp-doctor/history.sqlite)")
    p.add_argument("--no-history", action="store_true", help="record nothing in the history")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="show every finding of the verdict, info ones and hints included")
    from ddp_doctor.exit_codes import FAIL_ON_LEVELS  # exit 3 after a training that exited 0 (fail_on_exit)
    p.add_argument("--fail-on", choices=FAIL_ON_LEVELS, default=None,
                   help="after a training that exited 0: exit 3 when the report holds a finding of this "
                        "severity or worse (default: $DDP_DOCTOR_FAIL_ON)")
    from ddp_doctor.exit_codes import EXIT_BY_ACTION_HELP
    p.add_argument("--exit-by-action", action="store_true", help=EXIT_BY_ACTION_HELP)
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
    from ddp_doctor.cli import torchrun_options
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


def check_nproc_per_node(torchrun: list[str], origin: Mapping[str, str] | None = None) -> None:
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
            raise RunUsageError(f"{_called(key, value, origin or {})}: {why}; torchrun takes {NPROC_ACCEPTED}")


def _given(torchrun: list[str], *names: str) -> list[str]:
    """Every value given for one of `names` (`--name V` or `--name=V`), in order."""
    out = []
    for i, a in enumerate(torchrun):
        key, eq, val = a.partition("=")
        if key in names:
            out.append(val if eq else (torchrun[i + 1] if i + 1 < len(torchrun) else ""))
    return out


def _whole(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def check_torchrun_ranges(torchrun: list[str], origin: Mapping[str, str] | None = None) -> None:
    """The torchrun options whose range ddp-doctor can judge itself, before any launch: --nnodes
    (N or MIN:MAX, each at least 1, MIN at most MAX), --master-port (1-65535) and --node-rank
    (0 to the number of nodes - 1). RunUsageError, one line naming the option, otherwise (torchrun
    would fail later, or wait, with an error of its own)."""
    said = origin or {}
    max_nodes: int | None = None
    for value in _given(torchrun, "--nnodes"):
        low, colon, high = value.partition(":")
        lo, hi = _whole(low), (_whole(high) if colon else _whole(low))
        named = _called("--nnodes", value, said)
        if lo is None or hi is None:
            raise RunUsageError(f"{named}: torchrun takes a number of nodes N or a range MIN:MAX")
        if lo < 1 or hi < 1:
            raise RunUsageError(f"{named}: a job needs at least 1 node")
        if lo > hi:
            raise RunUsageError(f"{named}: the minimum ({lo}) is above the maximum ({hi})")
        max_nodes = hi
    for value in _given(torchrun, "--master-port", "--master_port"):
        port = _whole(value)
        if port is None or not 1 <= port <= 65535:
            raise RunUsageError(f"{_called('--master-port', value, said)}: a TCP port is a whole number from 1 "
                                f"to 65535")
    for value in _given(torchrun, "--node-rank", "--node_rank"):
        node = _whole(value)
        nodes = max_nodes if max_nodes is not None else 1
        if node is None or not 0 <= node < nodes:
            raise RunUsageError(f"{_called('--node-rank', value, said)}: with --nnodes {nodes} a node's rank is a "
                                f"whole number from 0 to {nodes - 1}")


def _nproc_problem(value: str) -> str | None:
    try:
        n: int | None = int(value)
    except ValueError:
        n = None
    if n is not None:
        return None if n >= 1 else "no process would start"
    if value in ("cpu", "auto"):
        return None
    if value not in ("gpu", "xpu") and not _device_extensions():
        # the one other word torch takes is the name of an out-of-tree device (privateuse1), which only
        # an installed extension gives it: without one, no need to import torch (seconds) to say no
        return "no such device type (no torch device extension is installed)"
    try:
        from torch.distributed.run import determine_local_world_size
        n = determine_local_world_size(value)
    except ImportError:
        return None  # no torch to ask here: the launcher says it
    except Exception as e:  # noqa: BLE001 - torch's answer for a word it does not take (ValueError, RuntimeError)
        said = (str(e).splitlines() or [type(e).__name__])[0]
        return f"torch says {said[:160]!r}"
    return None if isinstance(n, int) and n >= 1 else f"no {value} device on this host"


def _device_extensions() -> bool:
    """Whether a torch device extension is installed (the "torch.backends" entry points torch loads
    at import): only such a one names a device other than cpu, gpu (cuda) and xpu."""
    from importlib.metadata import entry_points
    try:
        return bool(entry_points(group="torch.backends"))
    except Exception:  # noqa: BLE001 - unreadable metadata: ask torch, as before
        return True


def run_options(doctor: list[str], target: Target) -> Any:
    """ddp-doctor's options of `run` as the RunOptions every rank and the parent act on
    (training/run/options.py): --select/--skip checked against the catalogue, --fail-on else
    DDP_DOCTOR_FAIL_ON read. RunUsageError, one line, for a mistake."""
    from ddp_doctor import checks as catalogue
    from ddp_doctor import registry
    from ddp_doctor.training.run.options import RunOptions
    try:
        ns = doctor_parser().parse_args(doctor)
    except SystemExit:  # argparse's own exit (e.g. a handler that exits): still one usage line
        raise RunUsageError(f"bad ddp-doctor option in {' '.join(doctor)!r} (usage: {USAGE})") from None
    select, skip = registry.parse_selectors(ns.select), registry.parse_selectors(ns.skip)
    bad = catalogue.unknown_selectors(select + skip)
    if bad:
        raise RunUsageError(f"--select/--skip: {', '.join(bad)} match no check")
    from ddp_doctor.history.database import choose
    choose(ns.history, ns.no_history)
    from ddp_doctor.exit_codes import EXIT_BY_ACTION_ENV, fail_on_setting
    if ns.exit_by_action:  # in the environment: the ranks and the launcher's children read it there
        os.environ[EXIT_BY_ACTION_ENV] = "1"
    try:
        fail_on = fail_on_setting(ns.fail_on, os.environ)  # --fail-on, else DDP_DOCTOR_FAIL_ON
    except ValueError as e:
        raise RunUsageError(str(e)) from None
    return RunOptions(target=target, timeout=ns.timeout, hang_timeout=ns.hang_timeout,
                      select=select, skip=skip, backend=ns.backend, report_path=ns.report, run_dir=ns.run_dir,
                      trace_path=ns.trace, fail_on=fail_on, progress=ns.progress, verbose=ns.verbose)
