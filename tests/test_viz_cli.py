"""``python -m viz``: end to end on tiny models, and bad input ends in one clear message (exit 2, no
traceback)."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from viz_support import smooth_rgb, write_png

from vit5.cli.viz import build_parser, main

ROOT = Path(__file__).resolve().parents[1]

TINY = [
    "--model",
    "vit5_tiny",
    "--random-init",
    "--model-args",
    "depth=2",
    "img_size=32",
    "patch_size=8",
]
FAST = ["--size", "32x48", "--quiet", "--formats", "png", "--bootstrap", "50"]


@pytest.fixture
def folder(tmp_path):
    write_png(tmp_path / "imgs" / "a.png", smooth_rgb(50, 70, 1))
    write_png(tmp_path / "imgs" / "b.png", smooth_rgb(64, 40, 2))
    return tmp_path / "imgs"


def test_all_end_to_end_as_a_subprocess(tmp_path, folder):
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "viz",
        "all",
        *TINY,
        "--images",
        str(folder),
        "--out",
        str(out),
        "--size",
        "32x48",
        "--quiet",
        "--save-raw",
        "npz",
        "--max-figures",
        "1",
        "--layers",
        "0",
        "-1",
    ]
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "RANDOM INIT" in proc.stdout and "RANDOM-INIT weights" in proc.stdout  # honest labels
    assert (
        "layer" in proc.stdout and "sink rate over all layer-heads" in proc.stdout
    )  # the printed table
    for name in ("cls_attention", "register_attention", "rollout", "norm_map", "pca"):
        for suffix in ("png", "pdf"):
            assert (out / "images" / "a" / f"{name}.{suffix}").stat().st_size > 1000
    assert not (
        out / "images" / "b"
    ).exists()  # --max-figures 1: per-image figures for the first image only
    for name in ("summary_grid", "norm_histograms", "outlier_frequency", "layer_profile"):
        assert (out / f"{name}.png").stat().st_size > 1000 and (out / f"{name}.pdf").exists()
    doc = json.loads((out / "metrics.json").read_text())
    assert (
        doc["num_images"] == 2 and len(doc["thresholds"]) == 2
    )  # metrics cover every image and block
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert {r["metric"] for r in rows} >= {
        "outlier_ratio",
        "max_median_ratio",
        "norm_kurtosis",
        "cls_entropy",
        "cls_outlier_mass",
        "cls_register_mass",
        "patch_register_mass",
        "sink_rate",
    }
    assert (out / "token_stats.npz").exists()


def test_planted_artifacts_are_found_and_labelled(tmp_path, folder, capsys):
    out = tmp_path / "out"
    args = [
        "metrics",
        *TINY,
        "--images",
        str(folder),
        "sklearn-samples",
        "--out",
        str(out),
        *FAST,
        "--plant-layer",
        "1",
        "--plant-at",
        "1",
        "4",
        "--plant-scale",
        "30",
    ]
    assert main(args) == 0
    assert (
        "PLANTED artifacts (x30 norm) at layer 1, patches (1,4): not a property of the model"
        in capsys.readouterr().out
    )
    rows = json.loads((out / "metrics.json").read_text())["metrics"]
    otr = {r["layer"]: r["value"] for r in rows if r["metric"] == "outlier_ratio"}
    assert otr == {0: 0.0, 1: pytest.approx(1 / 24)}


def test_compare_reuses_the_first_models_thresholds(tmp_path, folder, capsys):
    out = tmp_path / "out"
    args = [
        "compare",
        *TINY,
        "--model-b",
        "timm:vit_small_patch16_224",
        "--model-b-args",
        "depth=2",
        "embed_dim=64",
        "num_heads=2",
        "img_size=32",
        "patch_size=8",
        "reg_tokens=4",
        "--images",
        str(folder),
        "--out",
        str(out),
        *FAST,
    ]
    assert main(args) == 0
    a = json.loads((out / "compare" / "metrics_vit5_tiny-random-init.json").read_text())
    b = json.loads((out / "compare" / "metrics_vit_small_patch16_224-random-init.json").read_text())
    assert (
        b["thresholds"] == a["thresholds"]
        and b["threshold_source"] == "reused from vit5_tiny-random-init"
    )
    for name in ("a", "b", "summary_grid", "layer_profile"):
        assert (out / "compare" / f"{name}.png").stat().st_size > 1000


@pytest.mark.parametrize(
    "extra,message",
    [
        (
            ["--layers", "7"],
            "layer 7 is out of range: this model has 2 blocks, valid layers are 0..1",
        ),
        (["--size", "30x48"], "not a positive multiple of the patch size 8: use --size 32x48"),
        (["--threshold-from", "missing.json"], "cannot read thresholds from missing.json"),
        (["--plant-at", "1", "1"], "planting needs both --plant-layer and at least one --plant-at"),
    ],
)
def test_bad_options_give_one_clear_message(tmp_path, folder, capsys, extra, message):
    assert (
        main(["attention", *TINY, "--images", str(folder), "--out", str(tmp_path), *FAST, *extra])
        == 2
    )
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_bad_images_give_one_clear_message(tmp_path, capsys):
    (tmp_path / "broken.png").write_bytes(b"garbage")
    write_png(tmp_path / "tiny.png", smooth_rgb(5, 5, 0))
    args = [
        "norms",
        *TINY,
        "--images",
        str(tmp_path / "broken.png"),
        str(tmp_path / "tiny.png"),
        "--out",
        str(tmp_path),
        *FAST,
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert (
        "no usable image" in err
        and "broken.png" in err
        and "5x5 pixels is smaller than one 8x8 patch" in err
    )


def test_register_maps_of_a_model_without_registers(tmp_path, folder, capsys):
    args = [
        "attention",
        "--model",
        "deit3_tiny",
        "--random-init",
        "--model-args",
        "depth=1",
        "img_size=32",
        "patch_size=8",
        "--registers",
        "--images",
        str(folder),
        "--out",
        str(tmp_path),
        *FAST,
    ]
    assert main(args) == 2
    assert "deit3_tiny-random-init has no register tokens (R=0)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "spec,message",
    [
        ("vit5_tinyy", "nor a vit5 preset"),
        ("timm:no_such_vit", "timm has no model 'no_such_vit'"),
        ("timm:resnet18", "cannot use a ResNet: supported are vit5 models and timm"),
    ],
)
def test_bad_model_specs(tmp_path, folder, capsys, spec, message):
    assert (
        main(
            [
                "pca",
                "--model",
                spec,
                "--random-init",
                "--images",
                str(folder),
                "--out",
                str(tmp_path),
                *FAST,
            ]
        )
        == 2
    )
    assert message in capsys.readouterr().err


def test_a_name_means_pretrained_weights_and_random_init_must_be_asked_for(
    tmp_path, folder, capsys
):
    base = ["pca", "--images", str(folder), "--out", str(tmp_path), *FAST]
    assert main([*base, "--model", "vit5_tiny"]) == 2
    err = capsys.readouterr().err
    assert (
        "vit5_tiny has no released weights" in err and "untrained model with --random-init" in err
    )
    assert (
        main([*base, "--model", "timm:vit_small_patch16_224"]) == 2
    )  # timm's weights: offline here, not cached
    err = capsys.readouterr().err
    assert (
        "of the Hugging Face Hub repo timm/vit_small_patch16_224" in err
        and "HF_HUB_OFFLINE is set" in err
    )
    assert main([*base, "--model", "vit5_tiny@weights.pth", "--random-init"]) == 2
    assert "--random-init builds bare architecture names untrained" in capsys.readouterr().err


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert all(cmd in text for cmd in ("attention", "norms", "compare", "pca", "metrics", "all"))
