"""The one ``vit5`` command: every subcommand answers --help, the size syntax, one error path."""

from __future__ import annotations

import argparse

import pytest

from vit5.cli import COMMANDS, main, parse_size, run_command
from vit5.errors import Vit5Error


@pytest.mark.parametrize(
    "argv", [[name, "--help"] for name in COMMANDS] + [["viz", "study", "--help"]]
)
def test_every_subcommand_has_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: ")


def test_the_command_lists_its_subcommands_and_refuses_others(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)
    with pytest.raises(SystemExit) as exit_info:
        main(["trian"])
    assert exit_info.value.code == 2 and "invalid choice: 'trian'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, size", [("224", (224, 224)), ("96x128", (96, 128)), ("96X128", (96, 128))]
)
def test_one_size_syntax(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["0", "96x", "x96", "96x128x3", "-32", "big"])
def test_a_bad_size_names_the_syntax(text):
    with pytest.raises(argparse.ArgumentTypeError, match="is not N or HxW"):
        parse_size(text)


def test_a_user_error_is_one_line_and_status_2_and_a_bug_keeps_its_traceback(capsys):
    def bad_input():
        raise Vit5Error("--thing 3 is too big: use --thing 2")

    assert run_command(bad_input) == 2
    assert capsys.readouterr().err == "error: --thing 3 is too big: use --thing 2\n"
    assert run_command(lambda: None) == 0 and run_command(lambda: 1) == 1
    with pytest.raises(ZeroDivisionError):
        run_command(lambda: 1 / 0)
