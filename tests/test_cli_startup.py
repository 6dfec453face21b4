"""The command line starts fast: ``--help``, ``--version`` and argument errors answer without importing
torch (measured against ``import torch`` in the same test, as a ratio). The package root installs no import
hook: importing ``vit5.weights`` (or using any public ``vit5`` name) registers every preset in timm, before
or after timm is imported."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import vit5
from vit5.cli import main

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
HEAVY = ("torch", "timm", "numpy", "cv2", "accelerate")

FAST = [
    ["--help"],
    ["--version"],
    ["trian"],
    *(
        [name, "--help"]
        for name in ("train", "eval", "viz", "data", "export", "predict", "list", "bench", "ablate")
    ),
    *(
        ["eval", c, "--help"]
        for c in ("classify", "sweep", "features", "probe", "segprobe", "make-seg")
    ),
    *(
        ["viz", c, "--help"]
        for c in ("attention", "norms", "pca", "metrics", "all", "compare", "ttr")
    ),
    ["viz", "ablate", "--help"],
    ["viz", "position", "--help"],
    ["viz", "study", "--help"],
    ["data", "digits", "--help"],
    ["eval", "classify", "--model", "m", "--data", "d"],  # a required option missing
    ["eval", "classify", "--model", "m", "--data", "d", "--out", "o", "--size", "9x"],  # a bad size
    [
        "viz",
        "attention",
        "--model",
        "m",
        "--images",
        "i",
        "--out",
        "o",
        "--bogus",
    ],  # an unknown option
    ["train", "--resume", "a", "--bogus"],
    ["export", "--model", "m"],  # nothing to write
    ["predict", "--model", "m", "--images", "i", "--topk", "0"],
    ["list", "modles"],
]

PROBE = """
import contextlib, io, json, sys
from vit5.cli import main
heavy = {heavy!r}
report = []
for argv in {cases!r}:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit:
            code = exit.code
    report.append([argv, code, [m for m in heavy if m in sys.modules], out.getvalue() + err.getvalue()])
print(json.dumps(report))
"""


def run_python(code: str) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return time.perf_counter() - start, done.stdout


def test_help_version_and_argument_errors_import_no_torch_and_take_a_fraction_of_its_import():
    seconds, out = run_python(PROBE.format(heavy=HEAVY, cases=FAST))
    report = json.loads(out)
    loaded = [f"vit5 {' '.join(argv)} imported {mods}" for argv, _, mods, _ in report if mods]
    assert not loaded, "\n".join(loaded)
    codes = {" ".join(argv): code for argv, code, _, _ in report}
    assert codes["--help"] == codes["--version"] == codes["eval classify --help"] == 0
    assert codes["trian"] == codes["eval classify --model m --data d"] == codes["list modles"] == 2
    one_help, _ = run_python(
        "from vit5.cli import main\ntry: main(['eval', 'classify', '--help'])\nexcept SystemExit: pass"
    )
    torch_import, _ = run_python("import torch")
    assert one_help < 0.5 * torch_import, (
        f"vit5 eval classify --help {one_help:.2f} s, import torch {torch_import:.2f} s"
    )
    assert seconds < 2 * torch_import  # all of FAST together


def test_import_vit5_loads_no_torch_and_leaves_the_import_system_alone():
    code = (
        "import sys\n"
        "finders = list(sys.meta_path)\n"
        "import vit5\n"
        "print(sys.meta_path == finders, [m for m in ('torch', 'timm') if m in sys.modules])"
    )
    _, out = run_python(code)
    assert out.split() == ["True", "[]"]


REGISTERS = {  # the documented import orders that put the presets in timm's registry
    "timm, then vit5.weights": "import timm\nimport vit5.weights",
    "vit5.weights, then timm": "import vit5.weights\nimport timm",
    "a public vit5 name": "import vit5\nvit5.ViT5\nimport timm",
}


@pytest.mark.parametrize("imports", REGISTERS.values(), ids=REGISTERS.keys())
def test_the_presets_are_in_timm_after_the_documented_imports(imports):
    code = (
        f"{imports}\n"
        "model = timm.create_model('vit5_tiny', depth=1, embed_dim=32, num_heads=2, img_size=32)\n"
        "print(timm.is_model('vit5_small'), type(model).__name__)"
    )
    _, out = run_python(code)
    assert out.split() == ["True", "ViT5"]


def test_importing_the_model_alone_registers_nothing_in_timm():
    """The rule has one trigger, the factory: ``vit5.model`` is the network without the weights
    layer, and leaves timm's registry as it was."""
    _, out = run_python("import timm\nimport vit5.model\nprint(timm.is_model('vit5_small'))")
    assert out.split() == ["False"]


def test_version_is_the_packages(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert exit_info.value.code == 0 and capsys.readouterr().out == f"vit5 {version}\n"
    assert vit5.__version__ == version


def test_the_public_names_load_on_first_use():
    assert {"create_model", "load_model", "ViT5", "export_onnx", "Vit5Error"} <= set(dir(vit5))
    assert vit5.create_model is __import__("vit5.weights", fromlist=["x"]).create_model
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        vit5.nothing  # noqa: B018


def test_the_parsers_name_the_librarys_defaults():
    """The parsers name some library defaults themselves (so that --help imports no torch): they must
    be the library's."""
    from vit5 import cli
    from vit5.bench import SECTIONS
    from vit5.bench.ablate import ABLATIONS, SCALES
    from vit5.cli import ablate as ablate_cli
    from vit5.cli import bench as bench_cli
    from vit5.cli import eval as eval_cli
    from vit5.cli import export as export_cli
    from vit5.cli import train as train_cli
    from vit5.cli import viz as viz_cli
    from vit5.eval.classify import DEFAULT_SCALES
    from vit5.model.footprint import DEFAULT_MAX_PARAMS
    from vit5.study.run import PRESETS
    from vit5.train.config import DEMO_RECIPE
    from vit5.viz.register_ablation import METHODS, PLACES
    from vit5.weights.export import DEFAULT_ATOL

    assert eval_cli.DEFAULT_SCALES == DEFAULT_SCALES
    assert cli.DEFAULT_MAX_PARAMS == DEFAULT_MAX_PARAMS
    assert (viz_cli.ABLATION_METHODS, viz_cli.ABLATION_PLACES) == (METHODS, PLACES)
    assert set(viz_cli.STUDY_PRESETS) == set(PRESETS) and train_cli.DEMO_RECIPE == DEMO_RECIPE
    assert export_cli.DEFAULT_ATOL == DEFAULT_ATOL
    assert bench_cli.SECTIONS == tuple(SECTIONS) and ablate_cli.SCALE_NAMES == tuple(SCALES)
    assert ablate_cli.ABLATION_NAMES == ",".join(ABLATIONS)
