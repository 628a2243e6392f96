"""The `ddp-doctor` command line: main, build_parser and COMMANDS, the registration of every
subcommand (a parser function plus a command function, each in its own module here). Shared
parts: options (UsageError, argument validators), launch (what rank-acting commands share);
exit codes are ddp_doctor.exit_codes. Nothing here imports torch: ranks import it when they need it.
"""
from __future__ import annotations

import sys

from ddp_doctor.processes.stop_signals import hold_early, release_early

# The parents that report a stop (`run`, `preflight`, `analyze`) hold SIGTERM/SIGINT/SIGHUP from their
# first instruction, before the imports below: a stop sent while the command starts waits for the
# SignalCatcher that reports it ("interrupted", 128 + N) instead of killing it report-less.
PARENT_COMMANDS = ("run", "preflight", "analyze")


def _started_as_command(argv: list[str]) -> bool:
    """Whether this process is the `ddp-doctor` command (its console script or `python -m ddp_doctor`)."""
    first = argv[0].replace("\\", "/") if argv else ""
    return first.rsplit("/", 1)[-1] == "ddp-doctor" or first.endswith("ddp_doctor/__main__.py")


if len(sys.argv) > 1 and sys.argv[1] in PARENT_COMMANDS and _started_as_command(sys.argv):
    hold_early()

import argparse  # noqa: E402 - after the hold above, as every import below
import os  # noqa: E402
from typing import Callable, NamedTuple  # noqa: E402

from ddp_doctor.cli import analyze, bench_comm, catalogue, diff, env, history, preflight, run, schema  # noqa: E402
from ddp_doctor.cli.options import UsageError  # noqa: E402
from ddp_doctor.exit_codes import EXIT_USAGE  # noqa: E402
from ddp_doctor.version import __version__  # noqa: E402


class Command(NamedTuple):
    help: str
    add_parser: Callable[[argparse.ArgumentParser], None]
    command: Callable[[argparse.Namespace], int]


def _sagemaker_add_parser(p: argparse.ArgumentParser) -> None:
    # Imported when used: the module imports the boto3 wrappers of ddp_doctor.sagemaker.
    from ddp_doctor.cli import sagemaker_check
    sagemaker_check.add_parser(p)


def _sagemaker_command(args: argparse.Namespace) -> int:
    from ddp_doctor.cli import sagemaker_check
    return sagemaker_check.command(args)


COMMANDS: dict[str, Command] = {
    "preflight": Command(preflight.HELP, preflight.add_parser, preflight.command),
    "run": Command(run.HELP, run.add_parser, run.command),
    "env": Command(env.HELP, env.add_parser, env.command),
    "list-checks": Command(catalogue.LIST_HELP, catalogue.add_list_parser, catalogue.list_command),
    "explain": Command(catalogue.EXPLAIN_HELP, catalogue.add_explain_parser, catalogue.explain_command),
    "sagemaker-check": Command("check a SageMaker training job's settings before launch (needs boto3: the aws extra)",
                               _sagemaker_add_parser, _sagemaker_command),
    "bench-comm": Command(bench_comm.HELP, bench_comm.add_parser, bench_comm.command),
    "schema": Command(schema.HELP, schema.add_parser, schema.command),
    "analyze": Command(analyze.HELP, analyze.add_parser, analyze.command),
    "diff": Command(diff.HELP, diff.add_parser, diff.command),
    "history": Command(history.HELP, history.add_parser, history.command),
}


def build_parser() -> _TopParser:
    parser = _TopParser(
        prog="ddp-doctor",
        description="Diagnose PyTorch DistributedDataParallel jobs: preflight checks of the launcher "
                    "environment, the network and the process group, with a structured report.",
        epilog="Exit codes: 0 no errors, 3 errors found, 2 usage error, 1 ddp-doctor failed.")
    parser.add_argument("--version", action="version", version=f"ddp-doctor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.help)
        cmd.add_parser(p)
        p.set_defaults(func=cmd.command)
    parser.command_parsers = dict(sub.choices)
    return parser


class _TopParser(argparse.ArgumentParser):
    """The top-level parser, with each command's own (`command_parsers`, name -> parser)."""

    command_parsers: dict[str, argparse.ArgumentParser] = {}


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """argparse's reading of `argv`, where an option a command does not take is that command's
    usage error (its own usage line), not the top-level one's."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        own = getattr(parser, "command_parsers", {}).get(getattr(args, "command", None))
        (own or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    # Called in-process with its arguments (a test, a notebook), it gives the caller's thread its
    # signal mask back: a parent holds the stop signals until the process exits, which here is not
    # its own (else they would stay blocked in the caller, and in every process it starts later).
    import signal
    kept = signal.pthread_sigmask(signal.SIG_BLOCK, ()) if argv is not None else None
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in PARENT_COMMANDS:
        hold_early()  # when called in-process (not held at import); released unless a parent takes it over
    try:
        return _main(argv)
    finally:
        release_early()
        if kept is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, kept)


def _main(argv: list[str]) -> int:
    reopen_closed_stdio()
    from ddp_doctor.facts.own_env import ignore_missing_numpy_here
    ignore_missing_numpy_here()  # before torch loads: a bare CPU venv has no numpy, and needs none
    parser = build_parser()
    if argv and argv[0] == "run":
        # `run` takes torchrun's options and then the script's own: argparse must not see them.
        args = argparse.Namespace(command="run", argv=argv[1:], func=run.command)
    else:
        args = parse_command_line(parser, argv)
    if args.command != "run":
        args.argv = argv[argv.index(args.command) + 1:] if args.command in argv else []
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        code = int(args.func(args))
    except BrokenPipeError:
        # `ddp-doctor list-checks | head`: the reader left. Send the rest of stdout nowhere (so the
        # interpreter's own flush at exit cannot raise again) and exit as a shell does on SIGPIPE.
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except UsageError as e:
        sys.stderr.write(f"ddp-doctor {args.command}: error: {e}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("ddp-doctor: interrupted\n")
        return 130
    try:
        sys.stdout.flush()  # a closed pipe shows here, not as a traceback at interpreter exit
    except (BrokenPipeError, ValueError):
        _silence_stdout()
        # `run`: the exit status is the training's own, whatever became of the output
        return code if args.command == "run" else EXIT_BROKEN_PIPE
    return code


EXIT_BROKEN_PIPE = 128 + 13  # 128 + SIGPIPE, what a shell reports for a command whose reader left


def reopen_closed_stdio() -> None:
    """Started with stdin, stdout or stderr closed (`cmd >&- 2>&-`, a daemon): put /dev/null there,
    before anything opens a file. Else the first file or socket opened (torch's store, a record)
    takes fd 1 or 2 and output lands in it, writes to sys.stdout (None) fail, and the ranks and
    launcher started from here inherit the same holes. Output to /dev/null is what a closed stream
    would have kept: nothing."""
    import io
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        try:
            null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if null != fd:  # the lower fds are open (fixed first): null is above fd
                os.dup2(null, fd)  # inheritable
                os.close(null)
            else:
                os.set_inheritable(fd, True)  # os.open's are not: the launcher and ranks need it
        except OSError:
            continue
        name = ("stdin", "stdout", "stderr")[fd]
        if getattr(sys, name) is None:  # Python found the fd closed at start
            stream = io.TextIOWrapper(io.FileIO(fd, "r" if fd == 0 else "w", closefd=False),
                                      encoding="utf-8", errors="backslashreplace", line_buffering=fd != 0)
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


__all__ = ["COMMANDS", "build_parser", "main"]
