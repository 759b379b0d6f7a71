"""How a command ends: `cli.main` alone turns the kit's exceptions into a message and an `ExitCode`."""

import argparse

import pytest

from labkit import cli
from labkit.exitcodes import ExitCode, Stop


def test_an_unknown_lab_is_refused_with_the_labs_that_exist(capsys):
    assert cli.main(["lab", "99"]) == ExitCode.REFUSED == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "the labs are: 1, 2, 3" in err


def test_an_export_of_a_folder_with_no_scoreboard_is_refused(tmp_path, capsys):
    code = cli.main(
        ["scoreboard", "export", "--format", "wide", "--out", str(tmp_path / "x.csv"), str(tmp_path)]
    )
    assert code == ExitCode.REFUSED and "error: " in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_a_students_scoreboard_with_nothing_run_yet_fails_and_says_what_to_run(tmp_path, capsys):
    assert cli.main(["scoreboard", "--build", str(tmp_path)]) == ExitCode.FAILED
    assert "run `make lab-N` first" in capsys.readouterr().err


def _ending_with(monkeypatch, error: BaseException) -> None:
    def command(args):
        raise error

    parser = argparse.ArgumentParser()
    parser.set_defaults(func=command)
    monkeypatch.setattr(cli, "parser", lambda: parser)


def test_a_stop_ends_with_its_own_status_and_message(monkeypatch, capsys):
    _ending_with(monkeypatch, Stop(ExitCode.INTERRUPTED, "stopped: kept in OUT"))
    assert cli.main([]) == 130 and capsys.readouterr().err == "stopped: kept in OUT\n"


@pytest.mark.parametrize(
    ("module", "name", "status", "start"),
    [
        ("labkit.run.modes", "SandboxUnavailable", ExitCode.NO_SANDBOX, "error: "),
        ("labkit.grading.state.errors", "ReferenceBroken", ExitCode.FAILED, "error: "),
        ("labkit.grading.state.errors", "GradeError", ExitCode.REFUSED, "error: "),
        ("labkit.judge.judge", "KitError", ExitCode.FAILED, "error: the kit could not grade: "),
        ("labkit.grading.state.roster", "RosterError", ExitCode.REFUSED, "error: "),
    ],
)
def test_each_of_the_kits_errors_has_one_status(monkeypatch, capsys, module, name, status, start):
    import importlib

    _ending_with(monkeypatch, getattr(importlib.import_module(module), name)("roster.csv, line 3: no id"))
    assert cli.main([]) == status
    assert capsys.readouterr().err == f"{start}roster.csv, line 3: no id\n"


def test_an_error_that_is_not_the_kits_is_not_hidden(monkeypatch):
    _ending_with(monkeypatch, ZeroDivisionError("a bug"))
    with pytest.raises(ZeroDivisionError):
        cli.main([])
