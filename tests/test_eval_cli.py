"""``python -m eval``: every command's help, small end-to-end runs through main(), one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import pytest
from eval_helpers import random_rgb

import vit5
from vit5.cli.eval import main
from vit5.introspect.load import parse_model_args

TINY_ARGS = [
    "--model",
    "vit5_tiny",
    "--random-init",
    "--model-args",
    "depth=1",
    "embed_dim=32",
    "num_heads=2",
    "img_size=32",
    "patch_size=8",
    "num_classes=2",
    "--device",
    "cpu",
]


@pytest.mark.parametrize(
    "command, expected",
    [
        ("classify", "--crop-ratio"),
        ("sweep", "--scales"),
        ("features", "--max-side"),
        ("probe", "--temperature"),
        ("segprobe", "--reduce-zero-label"),
        ("make-seg", "--digits"),
    ],
)
def test_every_command_has_help(command, expected, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert expected in capsys.readouterr().out


def _image_folder(root: Path) -> Path:
    for split in ("train", "val"):
        for c, name in enumerate(("cat", "dog")):
            for i in range(3):
                path = root / split / name / f"{i}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                cv2.imwrite(str(path), random_rgb(36, 44, seed=100 * c + 10 * i + (split == "val")))
    return root


def test_make_seg_then_segprobe(tmp_path, capsys):
    assert (
        main(["make-seg", str(tmp_path / "seg"), "--train", "6", "--val", "3", "--size", "32"]) == 0
    )
    assert (
        main(
            [
                "segprobe",
                *TINY_ARGS,
                "--data",
                str(tmp_path / "seg"),
                "--size",
                "32",
                "--epochs",
                "2",
                "--layers",
                "0",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "mIoU %" in out and "background" in out
    (record,) = json.loads((tmp_path / "out" / "segprobe.json").read_text())
    assert record["num_val"] == 3 and 0 <= record["miou"] <= 1


def test_features_probe_classify_and_sweep(tmp_path, capsys):
    data = _image_folder(tmp_path / "data")
    assert (
        main(
            [
                "features",
                *TINY_ARGS,
                "--images",
                str(data / "val"),
                "--out",
                str(tmp_path / "f"),
                "--dtype",
                "float16",
                "--workers",
                "0",
            ]
        )
        == 0
    )
    assert "6 written" in capsys.readouterr().out
    assert json.loads((tmp_path / "f" / "manifest.json").read_text())["num_images"] == 6
    assert (
        main(["probe", *TINY_ARGS, "--data", str(data), "--k", "3", "--out", str(tmp_path / "p")])
        == 0
    )
    assert "logreg" in capsys.readouterr().out
    assert (
        main(
            [
                "classify",
                *TINY_ARGS,
                "--data",
                str(data),
                "--workers",
                "0",
                "--out",
                str(tmp_path / "c"),
            ]
        )
        == 0
    )
    assert (tmp_path / "c" / "confusion_vit5_tiny-random-init.png").is_file()
    assert (
        main(
            [
                "sweep",
                *TINY_ARGS,
                "--data",
                str(data),
                "--scales",
                "1",
                "1x2",
                "--workers",
                "0",
                "--out",
                str(tmp_path / "s"),
            ]
        )
        == 0
    )
    assert [r["size"] for r in json.loads((tmp_path / "s" / "sweep.json").read_text())] == [
        [32, 32],
        [32, 64],
    ]


def test_model_args_per_model(tmp_path, capsys):
    data = _image_folder(tmp_path / "data")
    second = [
        "--model",
        "vit5_tiny",
        "--model-args",
        "depth=2",
        "embed_dim=32",
        "num_heads=2",
        "img_size=32",
        "patch_size=8",
        "num_classes=2",
    ]
    assert (
        main(
            [
                "probe",
                *TINY_ARGS,
                *second,
                "--pool",
                "avg",
                "--k",
                "3",
                "--data",
                str(data),
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "vit5_tiny-random-init " in out and "vit5_tiny-random-init-2 " in out
    )  # same preset twice: kept apart
    assert (
        main(
            [
                "probe",
                *TINY_ARGS,
                "--model",
                "vit5_tiny",
                "--model-args",
                "depth=1",
                "--model-args",
                "depth=2",
                "--model-args",
                "depth=3",
                "--data",
                str(data),
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "4 --model-args for 2 --model" in capsys.readouterr().err


def test_random_init_builds_the_bare_names_and_loads_the_checkpoints(tmp_path, capsys):
    data = _image_folder(tmp_path / "data")
    dims = [
        "depth=1",
        "embed_dim=32",
        "num_heads=2",
        "img_size=32",
        "patch_size=8",
        "num_classes=2",
    ]
    vit5.save_pretrained(
        vit5.create_model("vit5_tiny", **parse_model_args(dims)), tmp_path / "trained"
    )
    assert (
        main(
            [
                "probe",
                "--model",
                str(tmp_path / "trained"),
                "--model",
                "vit5_tiny",
                "--random-init",
                "--model-args",
                "--model-args",
                *dims,
                "--pool",
                "avg",
                "--k",
                "3",
                "--device",
                "cpu",
                "--data",
                str(data),
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "trained " in out and "vit5_tiny-random-init " in out
    )  # one trained, one untrained, both labelled
    assert (
        main(
            [
                "probe",
                "--model",
                str(tmp_path / "trained"),
                "--random-init",
                "--data",
                str(data),
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "--random-init builds bare architecture names untrained" in capsys.readouterr().err


def test_bad_input_is_one_error_line(tmp_path, capsys):
    argv = [
        "classify",
        "--model",
        "vit5_tinny",
        "--data",
        str(_image_folder(tmp_path)),
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model 'vit5_tinny' is neither") and "Traceback" not in err
    assert main(["make-seg", str(tmp_path / "x"), "--scale", "0.01", "0.02"]) == 2
    assert "digit_scale" in capsys.readouterr().err
