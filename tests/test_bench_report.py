"""The benchmark end to end at tiny sizes, the CLI, and the report's rendering of targets."""

import json
import re

import pytest

from vit5.bench import SECTIONS, BenchConfig, Section, Table, Target, run_bench, select_sections
from vit5.bench.report import render_markdown, write_report
from vit5.cli.bench import main


def test_smoke_run_writes_a_complete_report(tmp_path):
    sections, md_path = run_bench(BenchConfig.profile("smoke"), tmp_path, show_progress=False)
    assert [s.key for s in sections] == list(SECTIONS)
    failed = [(s.key, s.notes) for s in sections if s.title.endswith("(FAILED)")]
    assert not failed
    payload = json.loads((tmp_path / "report.json").read_text())
    assert payload["targets_total"] == sum(len(s.targets) for s in sections) > 10
    text = md_path.read_text()
    for section in sections:
        assert section.title in text
        for figure in section.figures:
            assert (tmp_path / figure).stat().st_size > 1000
            assert f"]({figure})" in text
    speed = payload["sections"][0]["data"]["seconds"]
    contenders = {"vit5", "vit5_regional", "timm_eva", "timm_vit", "reference"}
    assert set(speed["tiny@32"]["forward"]) == set(speed["tiny@32"]["train"]) == contenders
    assert set(speed["tiny@64"]["forward"]) == contenders - {"vit5_regional"}
    targets = [t["name"] for t in payload["sections"][0]["targets"]]
    assert any("vit5_tiny forward speed-up over timm_eva" in t for t in targets)
    assert any("vit5_tiny_regional train speed-up over timm_vit" in t for t in targets)
    compiled = next(s for s in payload["sections"] if s["key"] == "compile")
    assert set(compiled["data"]["cold_start"]) == {"eager", "compiled", "regional"}
    assert payload["environment"]["torch_threads"] >= 1


def test_cli_runs_selected_sections(tmp_path, capsys):
    assert main(["--smoke", "--only", "depth,memory", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "targets met" in out and "pre-norm gradient profile flat" in out
    keys = [s["key"] for s in json.loads((tmp_path / "report.json").read_text())["sections"]]
    assert keys == ["memory", "depth"]


def test_unknown_section_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown benchmark section.*choose from"):
        select_sections(["speed", "sped"])
    (tmp_path / "file").touch()
    for argv, message in [
        (["--smoke", "--only", "nope"], "unknown benchmark section"),
        (["--smoke", "--device", "mps"], "device must be 'cpu' or 'cuda'"),
        (["--smoke", "--threads", "0"], "threads must be at least 1"),
        (["--smoke", "--device", "cpu:x"], "got 'cpu:x'"),
        (
            ["--smoke", "--only", "memory", "--out", str(tmp_path / "file")],
            "--out .*file is a file, not a folder",
        ),
    ]:
        assert main(argv) == 2  # one error line, exit status 2 like every command line
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and re.search(message, err), err


def test_targets_are_marked_met_or_missed(tmp_path):
    section = Section(
        "demo",
        "Demo",
        "what it measures",
        tables=[Table("t", ("a", "b"), ((1, 2),))],
        targets=[Target("fast enough", 1.4, 1.3), Target("cheap enough", 7.0, 5.0, False, "%")],
    )
    assert section.targets[0].met and not section.targets[1].met
    text = render_markdown([section], {"device": "cpu"})
    assert "Targets: 1 of 2 met" in text
    assert "| demo | cheap enough | 7.0% | <= 5.0% | **MISSED** |" in text
    pipes = render_markdown(
        [Section("p", "P", "w", tables=[Table("t", ("max |a - b|",), (("x|y",),))])], {}
    )
    assert "| max \\|a - b\\| |" in pipes and "| x\\|y |" in pipes  # cell text cannot split a row
    write_report([section], tmp_path, {"device": "cpu"})
    data = json.loads((tmp_path / "report.json").read_text())
    assert [t["met"] for t in data["sections"][0]["targets"]] == [True, False]
    with pytest.raises(ValueError, match="does not match columns"):
        Table("bad", ("a",), ((1, 2),))
