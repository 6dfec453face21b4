"""The built wheel is the toolkit: installed non-editable, run from an empty folder through its console
script ``vit5``, it trains (the packaged demo recipe, cut to seconds), visualises and evaluates.

Catches what in-repository tests cannot: a file the wheel leaves out (the recipes are package data), a
path read relative to the repository or the working directory, a broken ``[project.scripts]`` entry.
Offline: ``pip wheel --no-build-isolation`` with the running environment's setuptools, deps from the
environment, vit5 from the wheel (PYTHONPATH puts it ahead of any editable install).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_train_support import TINY

REPO = Path(__file__).resolve().parents[1]


def _pip(*args: str, cwd: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *args, "--no-deps", "--no-index", "--quiet"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel built from a copy of the sources (the build writes build/ and *.egg-info next to
    them), installed into a fresh folder; returns that folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "vit5", src / "vit5", ignore=shutil.ignore_patterns("__pycache__"))
    _pip("wheel", "--no-build-isolation", "-w", str(tmp / "dist"), str(src), cwd=tmp)
    (wheel,) = (tmp / "dist").glob("vit5-*.whl")
    _pip("install", "--target", str(tmp / "site"), str(wheel), cwd=tmp)
    return tmp / "site"


def test_the_installed_command_trains_visualises_and_evaluates_from_an_empty_folder(
    installed, tmp_path
):
    work = tmp_path / "empty"
    work.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "PYTHONPATH": str(installed),
        "OMP_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }

    def vit5(*args: str) -> str:
        proc = subprocess.run(
            [str(installed / "bin" / "vit5"), *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, f"vit5 {' '.join(args)}\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    find = "import importlib.util; print(importlib.util.find_spec('vit5').origin)"  # without importing it
    where = subprocess.run(
        [sys.executable, "-c", find], cwd=work, env=env, capture_output=True, text=True
    )
    assert Path(where.stdout.strip()).is_relative_to(installed), where.stdout + where.stderr

    assert "train" in vit5("--help")
    # no --config: the packaged digits demo recipe, cut to the smallest model and one epoch
    vit5("train", *TINY, "run.output_dir=runs")
    model = work / "runs" / "tiny" / "final"
    assert (model / "model.safetensors").is_file()

    images = work / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(rng.integers(0, 256, (24, 40, 3), dtype=np.uint8)).save(images / f"{i}.png")
    fast = [
        "--size",
        "16",
        "--quiet",
        "--formats",
        "png",
        "--bootstrap",
        "20",
        "--max-figures",
        "1",
    ]
    vit5("viz", "all", "--model", str(model), "--images", str(images), "--out", "viz", *fast)
    assert (work / "viz" / "metrics.json").is_file()
    out = vit5(
        "eval", "features", "--model", str(model), "--images", str(images), "--out", "features"
    )
    assert "2 written" in out and (work / "features" / "manifest.json").is_file()
