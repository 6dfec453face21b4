"""The commands of README.md and docs/*.md, as written: every one parses with the real parsers (a
renamed or removed flag fails here, naming the file and line), the fast ones run, and the tables the
docs copy name the columns the commands print."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from vit5.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDERS = ("...", "COMMAND")  # `vit5 COMMAND --help`, `vit5 eval ...`: prose, not commands


def documented_commands() -> list[tuple[str, list[str]]]:
    """``(file:line, argv)`` of every ``vit5 ...`` command: lines of fenced code blocks (``\\``
    continuations joined, ``# comments`` dropped; also ``accelerate launch ... -m vit5 ...``) and
    inline code spans that give options (``--flag`` or ``key=value``)."""
    found = []
    for path in DOCS:
        in_code, pending = False, ""
        for number, raw in enumerate(path.read_text().splitlines(), 1):
            if raw.strip().startswith("```"):
                in_code, pending = not in_code, ""
                continue
            if in_code:
                line = pending + raw.strip()
                if line.endswith("\\"):
                    pending = line[:-1] + " "
                    continue
                pending = ""
                match = re.match(r"(?:\S.* -m |\$ )?vit5 (.*)", line)
                texts = [match.group(1)] if match else []
            else:
                texts = [
                    m.group(1)
                    for m in re.finditer(r"`(?:python -m )?vit5 ([^`]+)`", raw)
                    if "--" in m.group(1) or "=" in m.group(1)
                ]
            for text in texts:
                if not any(p in text for p in PLACEHOLDERS):
                    argv = shlex.split(text, comments=True)
                    argv = [
                        a[1:-1] if a.startswith("[") and a.endswith("]") else a for a in argv
                    ]  # [--quick]
                    found.append((f"{path.name}:{number}", argv))
    return found


COMMANDS = documented_commands()


class Parsed(Exception):
    """Raised right after a successful parse, so that nothing runs."""


def test_the_docs_are_read():
    names = {argv[0] for _, argv in COMMANDS}
    assert {"train", "eval", "viz", "data", "bench", "ablate", "export"} <= names and len(
        COMMANDS
    ) > 50


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_documented_command_parses(where, argv, monkeypatch, capsys):
    parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise Parsed(parse_args(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    with pytest.raises((Parsed, SystemExit)) as outcome:
        main(argv)
    if outcome.type is SystemExit and outcome.value.code != 0:  # 0: --help, --version
        pytest.fail(f"{where}: vit5 {shlex.join(argv)}\n{capsys.readouterr().err}")


def test_the_fast_documented_commands_run_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    fast = {
        tuple(argv)
        for _, argv in COMMANDS
        if argv[:2] in (["data", "digits"], ["ablate", "--list"])
    }
    assert fast
    for argv in fast:
        assert main(list(argv)) == 0, f"vit5 {shlex.join(argv)}"
    assert "no_rope" in capsys.readouterr().out
    assert (
        len(list((tmp_path / "runs" / "digits" / "val").rglob("*.png"))) == 359
    )  # the documented split


def test_the_docs_ablation_tables_name_the_printed_columns():
    from vit5.viz.register_ablation import TABLE_HEADER

    text = (ROOT / "docs" / "register-analyses.md").read_text()
    headers = [line for line in text.splitlines() if line.startswith("| method | place |")]
    assert headers and all(h == "| " + " | ".join(TABLE_HEADER) + " |" for h in headers)


def test_model_help_names_every_spec_prefix():
    """Every model-spec prefix the loader accepts is named in ``--model``'s help."""
    from vit5.cli import MODEL_HELP
    from vit5.introspect.load import HF_PREFIX, TIMM_PREFIX
    from vit5.weights.catalog import HF_HUB_PREFIX

    for prefix in (HF_PREFIX, TIMM_PREFIX, HF_HUB_PREFIX):
        assert prefix in MODEL_HELP
