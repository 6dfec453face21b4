"""``python -m viz {ablate,ttr,position}`` end to end on tiny models, and their clear errors."""

import json

import pytest
from viz_support import smooth_rgb, write_png

from vit5.cli.viz import build_parser, main

TINY = ["--model", "vit5_tiny", "--model-args", "depth=1", "img_size=32", "patch_size=8"]
FAST = ["--quiet", "--formats", "png", "--random-init"]


def test_ablate_on_labelled_digits(tmp_path, capsys):
    args = [
        "ablate",
        *TINY,
        "num_classes=10",
        "--images",
        "digits-val",
        "--reference",
        "digits-train",
        "--max-images",
        "60",
        "--methods",
        "zeros",
        "mean",
        "--places",
        "blocks",
        "--out",
        str(tmp_path),
        *FAST,
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "RANDOM-INIT weights" in out and "top-1 change (pp)" in out
    doc = json.loads((tmp_path / "ablation.json").read_text())
    assert doc["num_images"] == 60 and doc["num_reference"] == 60
    assert [(r["method"], r["place"]) for r in doc["rows"]] == [
        ("none", "-"),
        ("zeros", "blocks"),
        ("mean", "blocks"),
    ]
    assert all(r["top1"] is not None and r["knn"] is not None for r in doc["rows"])
    assert (tmp_path / "ablation.png").stat().st_size > 1000 and (
        tmp_path / "ablation.csv"
    ).exists()


def test_ablate_needs_registers(tmp_path, capsys):
    folder = tmp_path / "imgs"
    for i in range(4):
        write_png(folder / f"{i}.png", smooth_rgb(32, 32, i))
    args = [
        "ablate",
        *TINY,
        "num_registers=0",
        "--images",
        str(folder),
        "--out",
        str(tmp_path),
        *FAST,
    ]
    assert main(args) == 2
    assert "no register tokens (R=0)" in capsys.readouterr().err


def test_ttr_end_to_end_without_and_with_trained_registers(tmp_path, capsys):
    common = [
        "--images",
        "sklearn-samples",
        "--size",
        "32x48",
        "--out",
        str(tmp_path),
        "--bootstrap",
        "20",
        "--max-figures",
        "1",
        *FAST,
    ]
    args = [
        "ttr",
        *TINY,
        "num_registers=0",
        "--threshold",
        "1e-3",
        "--neurons",
        "3",
        *common,
    ]  # every patch an outlier
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "register neurons (block:unit" in out and "TEST-TIME REGISTER" in out
    found = json.loads((tmp_path / "ttr" / "register_neurons.json").read_text())
    assert len(found["neurons"]) == 3 and found["detect_layer"] == 0
    after = json.loads(
        (tmp_path / "ttr" / "metrics_vit5_tiny-random-init___test-time_register.json").read_text()
    )
    assert any(
        r["metric"] == "patch_register_mass" for r in after["metrics"]
    )  # the extra token counts as a register
    assert (tmp_path / "ttr" / "summary_grid.png").stat().st_size > 1000
    # a model with 4 trained registers gets a fifth, test-time one after them
    common[common.index(str(tmp_path))] = str(tmp_path / "registers")
    assert main(["ttr", *TINY, "--threshold", "1e-3", "--neurons", "3", *common]) == 0
    name = "metrics_vit5_tiny-random-init___test-time_register.json"
    after = json.loads((tmp_path / "registers" / "ttr" / name).read_text())
    assert after["threshold_source"] == "reused from vit5_tiny-random-init"
    assert (tmp_path / "registers" / "ttr" / "register_neurons.json").is_file()


def test_position_probe_of_two_position_encodings(tmp_path, capsys):
    tiny = ["depth=1", "img_size=32", "patch_size=8"]
    args = [
        "position",
        "--model",
        "vit5_tiny",
        "--model-args",
        *tiny,
        "--model",
        "vit5_tiny",
        "--model-args",
        *tiny,
        "ape=False",
        "--size",
        "32x48",
        "--noise-images",
        "4",
        "--out",
        str(tmp_path),
        *FAST,
    ]
    assert main(args) == 0
    doc = json.loads((tmp_path / "position_probe.json").read_text())
    assert len(doc) == 2 and doc[0]["grid"] == [4, 6] and "RANDOM INIT" in doc[0]["model"]
    assert (
        "ape=False" in doc[1]["model"]
        and doc[1]["constant_spatial_share"] < doc[0]["constant_spatial_share"]
    )
    assert (tmp_path / "position_probe.png").stat().st_size > 1000
    assert "constant-image spatial share" in capsys.readouterr().out


def test_help_lists_the_register_analyses(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    assert all(cmd in text for cmd in ("ablate", "ttr", "position"))


def test_compare_models_without_cls_shows_received_attention(tmp_path, capsys):
    no_cls = ["class_token=False", "global_pool='avg'"]
    args = [
        "compare",
        *TINY,
        *no_cls,
        "num_registers=0",
        "--model-b",
        "vit5_tiny",
        "--model-b-args",
        "depth=1",
        "img_size=32",
        "patch_size=8",
        *no_cls,
        "--images",
        "sklearn-samples",
        "--size",
        "32x48",
        "--out",
        str(tmp_path),
        "--bootstrap",
        "20",
        "--max-figures",
        "1",
        *FAST,
    ]
    assert main(args) == 0
    assert (tmp_path / "compare" / "summary_grid.png").stat().st_size > 1000


def test_received_map_is_the_mean_attention_each_patch_receives():
    import numpy as np
    import torch
    from viz_support import smooth_images, tiny_vit5

    from vit5.viz import CollectConfig, capture, collect, describe, to_batch
    from vit5.viz.stats import received_map

    model = tiny_vit5(class_token=False, global_pool="avg", num_registers=1)
    images = smooth_images(2)
    stats = collect(model, images, "m", CollectConfig(progress=False))
    info = describe(model)
    with torch.no_grad(), capture(model, layers=[1], tokens=False) as rec:
        model.forward_features(to_batch(images, info.mean, info.std))
    attention = rec.attentions[1][1]  # image 1: [H, N, N]
    expected = (
        attention.mean(dim=1).mean(dim=0)[:24].reshape(4, 6)
    )  # no CLS: patches first, then the register
    np.testing.assert_allclose(received_map(stats, 1, 1), expected.numpy(), rtol=1e-5)
