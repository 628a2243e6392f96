"""`ddp-doctor run` as a torchrun prefix: its command line is split with torch's own launcher
parser (cli/torchrun_options.py, cli/run_argv.py split_argv), its help lists both kinds of
options, and an uncaught exception is shown through the script's sys.excepthook (target.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ddp_doctor.cli import run_argv, torchrun_options
from ddp_doctor.cli.run import main as run_main
from ddp_doctor.cli.run_argv import (
    DOCTOR_OPTIONS,
    RunHelpAsked,
    RunUsageError,
    split_argv,
)
from ddp_doctor.training.run.agent import torchrun_value
from ddp_doctor.training.run.target import Target, run_target

torch_run = pytest.importorskip("torch.distributed.run")


def torch_options() -> list:
    """torch's launcher parser's own actions that take options (-h/--help aside)."""
    return [a for a in torch_run.get_args_parser()._actions if a.option_strings and "--help" not in a.option_strings]


def a_value(action) -> str:
    return str(action.choices[0]) if action.choices else "1"


def test_every_spelling_of_torchs_parser_is_taken_with_its_values():
    """Each spelling torch's parser declares (59 in torch 2.13), with a value where it takes one,
    split off before the script, passed on as given, and read back by torch's parser as it meant."""
    spellings = [s for a in torch_options() for s in a.option_strings]
    assert "--local-ranks-filter" in spellings and "--nproc_per_node" in spellings and "-t" in spellings
    for action in torch_options():
        for spelling in action.option_strings:
            if action.nargs == 0:
                argv = [spelling, "train.py", "--lr", "1"]
                if spelling in run_argv.NO_PYTHON_NAMES:
                    with pytest.raises(RunUsageError, match="use torchrun"):
                        split_argv(argv)
                    continue
                torchrun, doctor, target = split_argv(argv)
                if spelling in run_argv.MODULE_NAMES:
                    assert (torchrun, target) == ([], Target(None, "train.py", ["--lr", "1"])), spelling
                elif spelling in run_argv.RUN_PATH_NAMES:  # what the ranks do anyway: not passed on
                    assert (torchrun, target) == ([], Target("train.py", None, ["--lr", "1"])), spelling
                else:
                    assert torchrun == [spelling] and target == Target("train.py", None, ["--lr", "1"]), spelling
                continue
            value = a_value(action)
            for given in ([spelling, value], [f"{spelling}={value}"]):
                torchrun, doctor, target = split_argv([*given, "train.py", "--lr", "1"])
                assert torchrun == given and doctor == [], given
                assert target == Target("train.py", None, ["--lr", "1"]), given
                parsed = torch_run.get_args_parser().parse_args([*torchrun, "train.py"])
                assert getattr(parsed, action.dest) == (action.type(value) if action.type else value), given
                assert parsed.training_script == "train.py", given


def test_the_table_lists_every_spelling_of_torchs_parser_and_none_is_ddp_doctors():
    table = torchrun_options.from_parser().by_name()
    declared = {s: a for a in torch_run.get_args_parser()._actions for s in a.option_strings}
    assert set(table) == set(declared)
    for spelling, action in declared.items():
        assert table[spelling].nargs == (1 if action.nargs is None else action.nargs), spelling
        assert table[spelling].names == tuple(action.option_strings)
        assert "\n" not in table[spelling].help
    assert not set(table) & set(DOCTOR_OPTIONS)  # a clash would hide one of torch's options


def test_ddp_doctor_options_and_torchruns_mix_before_the_script():
    torchrun, doctor, target = split_argv(["--nproc-per-node", "2", "--report", "r.json", "--local-ranks-filter=0",
                                           "--timeout", "20", "-t3", "train.py", "--report", "mine"])
    assert torchrun == ["--nproc-per-node", "2", "--local-ranks-filter=0", "-t3"]
    assert doctor == ["--report", "r.json", "--timeout", "20"]
    assert target == Target("train.py", None, ["--report", "mine"])  # after the script: the script's


def test_verbose_is_an_option_of_run_as_of_every_command_that_prints_a_verdict():
    # the verdict's "Info: N (shown with --verbose ...)" names an option run takes
    for flag in ("-v", "--verbose"):
        torchrun, doctor, target = split_argv(["--nproc-per-node", "2", flag, "train.py", "-v"])
        assert torchrun == ["--nproc-per-node", "2"] and doctor == ["--verbose"] and target.args == ["-v"]
        assert run_argv.run_options(doctor, target).verbose is True
    assert run_argv.run_options([], Target("train.py", None, [])).verbose is False


def test_a_unique_prefix_is_written_out_in_full_and_an_ambiguous_one_is_refused():
    torchrun, doctor, _ = split_argv(["--nproc-per", "2", "--hang", "5", "--stand", "x.py"])
    assert torchrun == ["--nproc-per-node", "2", "--standalone"] and doctor == ["--hang-timeout", "5"]
    assert torchrun_value(torchrun, "--nproc-per-node") == "2"  # what the parent reads
    with pytest.raises(RunUsageError, match="ambiguous option '--r'.*--redirects.*--report"):
        split_argv(["--r", "x", "x.py"])


@pytest.mark.parametrize("argv,error", [
    (["--bogus", "x.py"], "unknown option '--bogus'"),
    (["--standalone=1", "x.py"], "--standalone takes no value"),
    (["--local-ranks-filter"], "--local-ranks-filter needs a value"),
    (["-m"], "-m needs a module name"),
    (["--nproc-per-node", "2"], "no script"),
    (["--run-path", "-m", "pkg.train"], "not a module"),
])
def test_usage_errors_are_one_line(argv, error):
    with pytest.raises(RunUsageError, match=error) as e:
        split_argv(argv)
    assert "\n" not in str(e.value)


def test_module_flag_among_the_options_and_double_dash_end_them_as_for_torchrun():
    torchrun, _, target = split_argv(["-m", "--nproc-per-node", "2", "pkg.train", "--x"])
    assert torchrun == ["--nproc-per-node", "2"] and target == Target(None, "pkg.train", ["--x"])
    assert split_argv(["--module", "pkg.train"])[2] == Target(None, "pkg.train", [])
    assert split_argv(["--tee", "3", "--", "-odd.py", "a"])[2] == Target("-odd.py", None, ["a"])


def test_the_table_is_cached_per_torch_install(tmp_path, monkeypatch):
    monkeypatch.setenv(torchrun_options.CACHE_ENV, str(tmp_path))
    first = torchrun_options.table()
    cached = tmp_path / "torchrun-options.json"
    assert cached.is_file() and first == torchrun_options.from_parser()

    def no_import():
        raise AssertionError("torch's parser read again")

    monkeypatch.setattr(torchrun_options, "from_parser", no_import)
    assert torchrun_options.table() == first  # from the file: the parent imports no torch
    data = json.loads(cached.read_text())
    data["key"][-1][-1] += 1  # torch's argparse_util.py changed (an upgrade, an edit)
    data["options"] = []
    cached.write_text(json.dumps(data))
    monkeypatch.setattr(torchrun_options, "from_parser", lambda: first)
    assert torchrun_options.table() == first and json.loads(cached.read_text())["options"]


def test_an_unreadable_cache_costs_only_the_import(tmp_path, monkeypatch):
    (tmp_path / "torchrun-options.json").write_text("{not json")
    monkeypatch.setenv(torchrun_options.CACHE_ENV, str(tmp_path / "torchrun-options.json" / "below-a-file"))
    assert torchrun_options.table() == torchrun_options.from_parser()
    monkeypatch.setenv(torchrun_options.CACHE_ENV, str(tmp_path))
    assert torchrun_options.table() == torchrun_options.from_parser()


@pytest.mark.parametrize("text,line", [
    ("Rendezvous backend.", "Rendezvous backend"),
    ("Base directory to use for log files (e.g. /var/log/torch/elastic). The same directory is reused.",
     "Base directory to use for log files (e.g. /var/log/torch/elastic)"),
    ("Redirect std streams into a log file in the log directory (e.g. [-r 3] redirects both stdout+stderr for "
     "all workers, [-r 0:1,1:2] redirects stdout for local rank 0 and stderr for local rank 1).",
     "Redirect std streams into a log file in the log directory"),
    ("Duplicates logs to a file with a list of filters (e.g. [--f 'a,b'] will duplicate lines matching 'a' "
     "OR 'b'. An empty list won't duplicate any lines. Use double comma to escape a comma) ",
     "Duplicates logs to a file with a list of filters"),
    ("word " * 40, ("word " * 19).strip() + "..."),
])
def test_torchs_help_is_shortened_to_one_line(text, line):
    assert torchrun_options.one_line(text) == line


# ------------------------------------------------------------------ --help

@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["--nproc-per-node", "2", "--help"]])
def test_help_lists_ddp_doctors_options_and_torchruns_one_line_each(argv, capsys):
    assert run_main(argv) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("usage: ddp-doctor run [torchrun options]")
    entries = [ln.strip() for ln in lines if ln.startswith("  -")]

    def entry(spelling: str) -> str:
        found = [e for e in entries if spelling in e.split("  ")[0].replace(",", " ").split()]
        assert len(found) == 1, (spelling, found)
        return found[0]

    for name in DOCTOR_OPTIONS:  # --report, --run-dir, --trace, --select, ...: each with what it does
        assert len(entry(name).split("  ", 1)) == 2 and entry(name).split("  ", 1)[1].strip(), name
    for action in torch_options():
        for spelling in action.option_strings:
            assert entry(spelling).split("  ", 1)[1].strip(), spelling
    assert "Only show logs from specified ranks in console" in entry("--local-ranks-filter")
    assert "use torchrun" in entry("--no-python")
    for internal in ("rank_run", "ddp_doctor", "agent.py", "command.py", "torchrun_options"):
        assert internal not in out, internal


def test_help_is_asked_before_the_script_only():
    with pytest.raises(RunHelpAsked):
        split_argv(["--tee", "3", "-h", "train.py"])
    assert split_argv(["train.py", "--help"])[2] == Target("train.py", None, ["--help"])  # the script's


def test_help_through_the_cli_exits_0(capsys):
    from ddp_doctor.cli import main
    assert main(["run", "--help"]) == 0
    assert "--local-ranks-filter" in capsys.readouterr().out


# ------------------------------------------------------------------ the script's uncaught exception

def raising_script(tmp_path: Path) -> Path:
    path = tmp_path / "fails.py"
    path.write_text("def inner():\n    raise ValueError('bad batch')\n\n\ninner()\n")
    return path


def test_an_uncaught_exception_goes_through_the_scripts_excepthook(tmp_path, monkeypatch, capsys):
    """As torch's init_process_group installs one ("[rankN]: " on every line): the hook sees the
    traceback Python would show for `python SCRIPT`, without ddp-doctor's or runpy's frames."""
    import traceback

    def labelled(etype, value, tb):
        text = "".join(traceback.format_exception(etype, value, tb))
        sys.stderr.write("".join(f"[rank1]: {ln}\n" for ln in text.splitlines()))

    monkeypatch.setattr(sys, "excepthook", labelled)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    outcome = run_target(Target(str(raising_script(tmp_path)), None, []))
    err = capsys.readouterr().err
    assert outcome.exit_code == 1 and "ValueError: bad batch" in outcome.exception["traceback"]
    lines = err.splitlines()
    assert lines[0] == "[rank1]: Traceback (most recent call last):" and lines[-1] == "[rank1]: ValueError: bad batch"
    assert all(ln.startswith("[rank1]: ") for ln in lines)
    assert "fails.py\", line 5, in <module>" in err and "in inner" in err
    assert "ddp_doctor" not in err and "runpy" not in err
    assert "[rank1]" not in outcome.exception["traceback"]  # the report keeps the plain traceback


def test_without_a_hook_of_the_script_the_traceback_is_pythons(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    outcome = run_target(Target(str(raising_script(tmp_path)), None, []))
    err = capsys.readouterr().err
    assert err == outcome.exception["traceback"] and err.startswith("Traceback (most recent call last):")


def test_a_hook_that_raises_is_reported_as_python_does(tmp_path, monkeypatch, capsys):
    def broken(*args):
        raise RuntimeError("hook broke")

    monkeypatch.setattr(sys, "excepthook", broken)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    run_target(Target(str(raising_script(tmp_path)), None, []))
    err = capsys.readouterr().err
    assert err.startswith("Error in sys.excepthook:") and "RuntimeError: hook broke" in err
    assert "Original exception was:\nTraceback" in err and err.endswith("ValueError: bad batch\n")
