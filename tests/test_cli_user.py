"""The command line as a user meets it: a mistake named by the subcommand that was given it, plain-text
help, errors in command-line words, one spelling for the EMA weights, readable numbers and plurals, a
header that names the model trained, no empty --out left by a failed command, checks made before the
work, ``vit5 list`` and ``vit5 predict``."""

from __future__ import annotations

import csv
import re

import pytest
import torch
from test_train_support import single_thread, tiny_config  # noqa: F401 (autouse fixture)

import vit5
from vit5.cli import main
from vit5.errors import InputError

TINY = ["depth=1", "embed_dim=32", "num_heads=2", "img_size=32", "patch_size=8"]


def run(argv, capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    "argv, usage",
    [
        (
            ["viz", "attention", "--model", "m", "--images", "i", "--out", "o", "--bogus"],
            "vit5 viz attention",
        ),
        (
            ["eval", "classify", "--model", "m", "--data", "d", "--out", "o", "--bogus"],
            "vit5 eval classify",
        ),
        (["data", "digits", "root", "--bogus"], "vit5 data digits"),
    ],
)
def test_a_bad_option_is_reported_by_the_subcommand_it_was_given_to(argv, usage, capsys):
    code, _, err = run(argv, capsys)
    assert (
        code == 2
        and err.startswith(f"usage: {usage} ")
        and f"{usage}: error: unrecognized arguments: --bogus" in err
    )


HELPS = [
    ["--help"],
    *(
        [c, "--help"]
        for c in ("train", "eval", "viz", "data", "export", "predict", "list", "bench", "ablate")
    ),
    *(
        ["eval", c, "--help"]
        for c in ("classify", "sweep", "features", "probe", "segprobe", "make-seg")
    ),
    *(["viz", c, "--help"] for c in ("all", "compare", "ttr", "ablate", "position", "study")),
]


@pytest.mark.parametrize("argv", HELPS, ids=" ".join)
def test_help_is_plain_text(argv, capsys):
    code, out, _ = run(argv, capsys)
    assert code == 0 and out.startswith("usage: ")
    assert not re.search(r":(mod|func|class|meth):|``", out), out


def test_errors_speak_command_line():
    from vit5.introspect.load import load_spec

    with pytest.raises(InputError) as unknown:
        load_spec("qqqqqqqq")
    with pytest.raises(InputError) as unreleased:
        load_spec("vit5_tiny")
    messages = [str(unknown.value), str(unreleased.value)]
    assert "vit5 list models" in messages[0] and "--random-init" in messages[1]
    assert not any(re.search(r"vit5\.\w+\(|random_init=|`\w+=`", m) for m in messages), messages


def test_an_empty_class_folder_says_what_to_do_in_files(tmp_path):
    from vit5.data import ImageFolderDataset, ImageFolderError

    (tmp_path / "val" / "cat").mkdir(parents=True)
    (tmp_path / "val" / "dog").mkdir()
    with pytest.raises(ImageFolderError) as err:
        ImageFolderDataset(tmp_path, "val")
    assert "extensions=" not in str(err.value)


@pytest.mark.parametrize(
    "module, argv",
    [
        ("viz", ["all", "--model", "m", "--images", "i", "--out", "o"]),
        ("viz", ["ablate", "--model", "m", "--images", "i", "--out", "o"]),
        ("viz", ["position", "--model", "m", "--out", "o"]),
        ("eval", ["features", "--model", "m", "--images", "i", "--out", "o"]),
        ("eval", ["classify", "--model", "m", "--data", "d", "--out", "o"]),
        ("export", ["--model", "m", "--onnx", "m.onnx"]),
        ("predict", ["--model", "m", "--images", "i"]),
    ],
)
def test_one_spelling_for_the_ema_weights_and_ema_kept_as_its_short_form(module, argv):
    import importlib

    parser = importlib.import_module(f"vit5.cli.{module}").build_parser()
    assert parser.parse_args([*argv, "--weights", "ema"]).weights == "ema"
    assert parser.parse_args([*argv, "--ema"]).weights == "ema"
    assert parser.parse_args(argv).weights in ("raw", "auto")


def test_throughput_is_a_readable_number():
    from types import SimpleNamespace

    from vit5.eval import summary_table

    scores = SimpleNamespace(num_images=10, top1=0.5, top5=1.0, loss=0.7)
    result = SimpleNamespace(
        model="m",
        weights="raw",
        size=(32, 32),
        crop_ratio=1.0,
        scores=scores,
        images_per_s=352.9,
        skipped=[],
    )
    table = summary_table([result])
    assert " 352.9 " in table + " " and "352.9000" not in table


def test_the_training_header_names_the_model_with_its_overrides_and_counts_read_right(
    tmp_path, capsys
):
    from vit5.train import Trainer

    summary = Trainer(
        tiny_config(tmp_path, "model.overrides.num_registers=0", "model.overrides.rope=false")
    ).fit()
    out = capsys.readouterr().out
    model_line = next(line for line in out.splitlines() if line.startswith("model "))
    assert (
        "num_registers=0" in model_line and "rope=False" in model_line and "vit5_tiny" in model_line
    )
    assert "no augmentation" in out and "none augmentation" not in out
    assert ", 1 epoch\n" in out and "1 epochs" not in out
    from vit5.train.rundir import format_summary

    assert "1 epoch, " in format_summary(summary) and "1 epochs" not in format_summary(summary)


def test_a_failed_command_leaves_no_empty_out_folder(tmp_path, capsys):
    new = tmp_path / "new" / "out"
    code, _, err = run(
        [
            "viz",
            "attention",
            "--model",
            "qqqqqqqq",
            "--images",
            "sklearn-samples",
            "--out",
            str(new),
        ],
        capsys,
    )
    assert code == 2 and "qqqqqqqq" in err and not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    code, _, _ = run(
        ["eval", "features", "--model", "qqqqqqqq", "--images", str(tmp_path), "--out", str(kept)],
        capsys,
    )
    assert code == 2 and kept.is_dir()  # a folder that was there stays


def test_compare_suggests_a_size_both_patch_sizes_divide(tmp_path, capsys):
    a = ["depth=1", "embed_dim=32", "num_heads=2", "img_size=32", "patch_size=16"]
    b = ["depth=1", "embed_dim=32", "num_heads=2", "img_size=36", "patch_size=12"]
    argv = ["viz", "compare", "--model", "vit5_tiny", "--model-args", *a, "--model-b", "vit5_tiny"]
    argv += [
        "--model-b-args",
        *b,
        "--random-init",
        "--images",
        "sklearn-samples",
        "--out",
        str(tmp_path),
    ]
    argv += ["--size", "32x32"]  # a multiple of the first patch size only (the default fits both)
    code, _, err = run(argv, capsys)
    h, w = map(int, re.search(r"use --size (\d+)x(\d+)", err).groups())
    assert code == 2 and h % 16 == w % 16 == h % 12 == w % 12 == 0, err


def test_ttr_refuses_a_model_it_cannot_record_before_its_neuron_search(
    tmp_path, capsys, monkeypatch
):
    import vit5.viz.ttr as ttr  # the runner calls ttr.find_register_neurons

    def searched(*args, **kwargs):
        raise AssertionError("the neuron search ran")

    monkeypatch.setattr(ttr, "find_register_neurons", searched)
    argv = ["viz", "ttr", "--model", "timm:resnet10t", "--random-init"]
    code, _, err = run([*argv, "--images", "sklearn-samples", "--out", str(tmp_path / "t")], capsys)
    assert code == 2 and "ResNet" in err


def test_position_loads_every_model_before_probing_any(tmp_path, capsys):
    argv = ["viz", "position", "--model", "vit5_tiny", "--random-init", "--model-args", *TINY]
    code, out, err = run([*argv, "--model", "qqqqqqqq", "--out", str(tmp_path / "p")], capsys)
    assert code == 2 and "qqqqqqqq" in err and "spatial share" not in out


def test_list_names_the_presets_the_released_weights_and_the_recipes(capsys):
    from vit5.train.config import recipes
    from vit5.weights.catalog import RELEASES

    code, out, _ = run(["list"], capsys)
    names = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert code == 0 and set(vit5.PRESETS) | set(RELEASES) | set(recipes()) <= names
    code, out, _ = run(["list", "weights"], capsys)
    assert code == 0 and "vit5_base_patch16_384.in1k" in out and "vit5_tiny " not in out


# ------------------------------------------------------------------------------------------ predict
@pytest.fixture
def images(tmp_path):
    import numpy as np
    from PIL import Image

    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in ("a.png", "sub/b.png"):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(folder / name)
    (folder / "broken.png").write_bytes(b"not an image")
    return folder


def tiny_kwargs() -> dict:
    return {k: int(v) for k, v in (a.split("=") for a in TINY)}


def test_predict_prints_imagenet_names_for_a_1000_class_head(images, tmp_path, capsys):
    from timm.data import ImageNetInfo

    model = vit5.create_model("vit5_tiny", num_classes=1000, **tiny_kwargs())
    bias = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 3
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(bias)
    vit5.save_pretrained(model, tmp_path / "ckpt")
    code, out, _ = run(
        [
            "predict",
            "--model",
            str(tmp_path / "ckpt"),
            "--images",
            str(images),
            "--topk",
            "3",
            "--quiet",
        ]
        + ["--csv", str(tmp_path / "out" / "p.csv")],
        capsys,
    )
    assert code == 0
    probs, classes = bias.softmax(-1).topk(3)
    names = ImageNetInfo().label_descriptions()
    expected = " | ".join(
        f"{names[c]} {100 * p:.1f}%" for c, p in zip(classes.tolist(), probs.tolist())
    )
    lines = dict(
        line.split("  ", 1) for line in out.splitlines() if line.endswith("%") or "skipped" in line
    )
    assert lines["a.png"] == lines["sub/b.png"] == expected
    assert lines["broken.png"].startswith("skipped: ")
    rows = {r["image"]: r for r in csv.DictReader((tmp_path / "out" / "p.csv").open())}
    assert (
        rows["a.png"]["top1_class"] == names[classes[0]]
        and int(rows["a.png"]["top1_index"]) == classes[0]
    )
    assert float(rows["sub/b.png"]["top3_prob"]) == pytest.approx(float(probs[2]), abs=1e-6)
    assert (
        rows["broken.png"]["top1_class"] == ""
        and rows["broken.png"]["error"]
        and not rows["a.png"]["error"]
    )


def test_predict_uses_the_models_own_class_names(images, tmp_path):
    from vit5.eval.classify import predict
    from vit5.introspect.load import load_spec

    model = vit5.create_model("vit5_tiny", num_classes=3, **tiny_kwargs())
    vit5.save_pretrained(model, tmp_path / "ckpt")
    loaded = load_spec(str(tmp_path / "ckpt"))
    loaded.model.pretrained_cfg["label_names"] = ["cat", "dog", "owl"]
    predictions, names = predict(loaded, images, topk=5, progress=False)
    assert names.names == ("cat", "dog", "owl") and "label_names" in names.source
    ok = [p for p in predictions if not p.error]
    assert len(ok) == 2 and all(
        len(p.top) == 3 and {n for _, n, _ in p.top} == {"cat", "dog", "owl"} for p in ok
    )


def test_predict_refuses_a_model_without_a_head(images, capsys):
    code, _, err = run(
        ["predict", "--model", "vit5_tiny", "--random-init", "--model-args", *TINY, "num_classes=0"]
        + ["--images", str(images), "--quiet"],
        capsys,
    )
    assert code == 2 and "no classification head" in err and err.count("\n") == 1
