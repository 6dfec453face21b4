"""Every command line turns bad input into one ``error:`` line and exit status 2, before any work.

Output folders that are files, unknown or absent devices, sizes that cannot fit in memory, a second
writer of a feature folder; and what must keep working: a rerun after a refused size, file names of
any encoding printed under a strict UTF-8 console.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import cv2
import pytest
import torch
from eval_helpers import random_rgb

import vit5
import vit5.eval
import vit5.runtime
from vit5.cli import eval as eval_cli
from vit5.cli.bench import main as bench_main
from vit5.cli.viz import main as viz_main
from vit5.files import FolderLock
from vit5.introspect.load import load_spec
from vit5.viz.runner import recording_estimate


def eval_main(argv: list[str]) -> int:
    """``vit5 eval ARGV`` in-process: its exit status (argparse's errors leave through SystemExit)."""
    try:
        return eval_cli.main(argv)
    except SystemExit as exit_info:
        return int(exit_info.code)


TINY = [
    "--model",
    "vit5_tiny",
    "--random-init",
    "--model-args",
    "depth=1",
    "embed_dim=32",
    "num_heads=2",
    "img_size=32",
    "patch_size=8",
]


@pytest.fixture
def images(tmp_path) -> Path:
    (tmp_path / "imgs").mkdir()
    for i in range(2):
        cv2.imwrite(str(tmp_path / "imgs" / f"{i}.png"), random_rgb(40, 48, seed=i))
    return tmp_path / "imgs"


def one_error_line(err: str, prefix: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(prefix), err
    return lines[0]


@pytest.mark.parametrize("device", ["bogus", "cuda:7"])
def test_bad_devices_are_one_line(images, tmp_path, capsys, device):
    if device.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    assert (
        eval_main(
            [
                "features",
                *TINY,
                "--images",
                str(images),
                "--out",
                str(tmp_path / "f"),
                "--device",
                device,
            ]
        )
        == 2
    )
    line = one_error_line(capsys.readouterr().err, "error: ")
    assert f"--device {device}" in line or f"--device {device!r}" in line
    assert (
        viz_main(
            [
                "attention",
                *TINY,
                "--images",
                str(images),
                "--out",
                str(tmp_path / "v"),
                "--device",
                device,
            ]
        )
        == 2
    )
    one_error_line(capsys.readouterr().err, "error: ")


def test_an_out_that_is_a_file_fails_before_any_work(images, tmp_path, capsys, monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("the evaluation ran before --out was checked")

    monkeypatch.setattr(vit5.eval, "evaluate", no_work)  # what `vit5 eval classify` calls
    afile = tmp_path / "afile"
    afile.write_text("")
    data = ["--data", str(images), "--split", ""]
    assert eval_main(["classify", *TINY, *data, "--out", str(afile)]) == 2
    assert "is a file, not a folder" in one_error_line(capsys.readouterr().err, "error: ")
    assert viz_main(["attention", *TINY, "--images", str(images), "--out", str(afile)]) == 2
    assert "is a file, not a folder" in one_error_line(capsys.readouterr().err, "error: ")
    assert bench_main(["--smoke", "--out", str(afile)]) == 2
    assert "is a file, not a folder" in one_error_line(capsys.readouterr().err, "error: ")


def test_a_size_that_cannot_fit_in_memory_is_refused_with_the_estimate(
    images, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(
        vit5.runtime, "available_memory", lambda device: 2**30
    )  # the same on any machine
    args = [
        "attention",
        "--model",
        "vit5_tiny",
        "--random-init",
        "--images",
        str(images),
        "--out",
        str(tmp_path / "v"),
        "--quiet",
    ]
    assert viz_main([*args, "--size", "4096"]) == 2
    line = one_error_line(capsys.readouterr().err, "error: ")
    # the lean recording of the run's batch (its 2 images): 65,541 tokens (256 x 256 patches, CLS,
    # 4 registers), width 192, 3 heads, 12 blocks, float32: one block's forward, three
    # [3, 28, N] chunk arrays (28 rows: the most that fit in 64 MiB), q and k of every block
    # for the rollout, 5 rows and 4 vectors per head and block
    n = 65_541
    expected = 2 * n * 10 * 192 * 4 + 3 * 3 * 28 * n * 4
    expected += 12 * 2 * 2 * n * 192 * 4 + 12 * (5 + 4) * 2 * 3 * n * 4
    assert f"needs about {expected / 2**30:.2f} GiB" in line and "1.00 GiB available" in line
    assert "of 2 image(s)" in line and "--batch-size 1" in line
    fits = int(re.search(r"the largest size that fits is --size (\d+)x\1", line)[1])
    info = load_spec("vit5_tiny", random_init=True).info
    assert recording_estimate(info, (fits, fits), 2) <= 2**30
    larger = fits + info.patch_size
    assert recording_estimate(info, (larger, larger), 2) > 2**30


def test_a_refused_size_leaves_nothing_that_blocks_the_rerun(images, tmp_path, capsys):
    out = tmp_path / "f"
    assert (
        eval_main(["features", *TINY, "--images", str(images), "--out", str(out), "--size", "36"])
        == 2
    )
    assert "not a positive multiple of the patch size 8" in one_error_line(
        capsys.readouterr().err, "error: "
    )
    assert (
        eval_main(["features", *TINY, "--images", str(images), "--out", str(out), "--size", "32"])
        == 0
    )
    assert "2 written" in capsys.readouterr().out


def test_a_second_feature_export_into_one_folder_is_refused(images, tmp_path, capsys):
    out = tmp_path / "f"
    out.mkdir()
    with FolderLock(out, "feature export"):
        assert eval_main(["features", *TINY, "--images", str(images), "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err, "error: ")
    assert f"in use by pid {os.getpid()} (feature export" in line
    assert (
        eval_main(["features", *TINY, "--images", str(images), "--out", str(out)]) == 0
    )  # released: works


@pytest.mark.skipif(sys.platform == "win32", reason="byte file names")
def test_file_names_of_any_encoding_print_under_a_strict_utf8_console(images, tmp_path, capsys):
    with open(
        os.fsencode(images) + b"/caf\xe9.png", "wb"
    ) as f:  # Latin-1 bytes, an unreadable image
        f.write(b"not a png")
    assert (
        eval_main(["features", *TINY, "--images", str(images), "--out", str(tmp_path / "f")]) == 0
    )
    out = (
        capsys.readouterr().out
    )  # pytest's capture is a strict UTF-8 stream, like a UTF-8 terminal
    assert "2 written" in out and "1 failed" in out and "caf\\xe9.png" in out


def test_an_input_of_very_many_tokens_warns_once(tmp_path, monkeypatch):
    from vit5.eval import common as backbone
    from vit5.eval.features import FeatureSettings, iter_features

    monkeypatch.setattr(backbone, "BIG_TOKEN_COUNT", 15)  # 4x4 = 16 patches of 8 px at 32x32
    monkeypatch.setattr(backbone, "_WARNED_SIZES", set())
    model = vit5.create_model(
        "vit5_tiny", depth=1, embed_dim=32, num_heads=2, img_size=32, patch_size=8
    )
    paths = [tmp_path / f"{i}.png" for i in range(2)]
    for i, path in enumerate(paths):
        cv2.imwrite(str(path), random_rgb(32, 32, seed=i))
    with pytest.warns(
        backbone.LargeInputWarning, match=r"32x32 has 16 tokens.*--max-side"
    ) as caught:
        assert (
            len(list(iter_features(model, paths, FeatureSettings(size=(32, 32), batch_size=1))))
            == 2
        )
    assert len([w for w in caught if issubclass(w.category, backbone.LargeInputWarning)]) == 1
