"""Classification evaluation: numbers against scikit-learn, raw + EMA, bad files, 2 processes, sweep."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from eval_helpers import digits_folder, random_rgb, single_thread, tiny_model, trained_checkpoint
from sklearn.metrics import accuracy_score, confusion_matrix, log_loss, top_k_accuracy_score

from vit5.data import decode_image, eval_transform
from vit5.errors import InputError
from vit5.eval import (
    ClassifySettings,
    evaluate,
    open_split,
    run_sweep,
    sizes_from_scales,
    sweep_plot,
    sweep_table,
)
from vit5.introspect.load import ModelRequest, load_models, load_spec
from vit5.layers.patch_embed import round_to_patch

REPO = Path(__file__).resolve().parents[1]
SETTINGS = ClassifySettings(batch_size=16, num_workers=0)


@pytest.fixture(scope="module")
def models():
    return load_models(ModelRequest(specs=(str(trained_checkpoint()),), weights="auto"))


@pytest.fixture(scope="module")
def single_process(models):
    with single_thread():
        return evaluate(models[0], open_split(digits_folder(), "val"), SETTINGS, progress=False)


def test_checkpoint_directory_gives_raw_and_ema_models(models):
    assert [(m.label, m.weights) for m in models] == [
        ("tiny-digits", "raw"),
        ("tiny-digits-ema", "ema"),
    ]
    raw, ema = (dict(m.model.state_dict()) for m in models)
    assert not torch.equal(raw["head.weight"], ema["head.weight"])
    assert models[0].input_size == (32, 32) and models[0].crop_pct == 1.0


def test_generic_run_folders_are_labelled_with_their_run(tmp_path):
    (tmp_path / "my_run").mkdir()
    (tmp_path / "my_run" / "final").symlink_to(trained_checkpoint(), target_is_directory=True)
    loaded = load_models(ModelRequest(specs=(str(tmp_path / "my_run" / "final"),), weights="ema"))
    assert [(m.label, m.weights) for m in loaded] == [("my_run-final-ema", "ema")]


def test_metrics_equal_sklearn_on_independently_computed_logits(models, single_process):
    dataset = open_split(digits_folder(), "val")
    transform = eval_transform(32)
    images = torch.stack([transform(decode_image(path)) for path, _ in dataset.samples])
    with torch.no_grad(), single_thread():
        probs = torch.softmax(models[0].model(images), dim=1).numpy()
    y, pred = np.array(dataset.targets), probs.argmax(1)
    s = single_process.scores
    assert s.num_images == len(y) == 359
    assert s.top1 == accuracy_score(y, pred)
    assert s.top5 == top_k_accuracy_score(y, probs, k=5, labels=range(10))
    assert s.loss == pytest.approx(log_loss(y, probs, labels=range(10)), rel=1e-4)
    np.testing.assert_array_equal(s.confusion, confusion_matrix(y, pred, labels=range(10)))
    assert s.top1 > 0.6  # the model did learn: chance is 0.1
    record = single_process.to_dict()
    assert set(record["per_class_accuracy"]) == {str(d) for d in range(10)}
    json.dumps(record, default=lambda o: o.tolist())  # serialisable


def test_two_processes_give_the_numbers_of_one(single_process, tmp_path):
    """torchrun with 2 CPU processes (Accelerate's gloo backend): 359 images do not split evenly in
    batches of 16, so Accelerate pads and gather_for_metrics must drop the duplicates."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
        "-m",
        "eval",
        "classify",
        "--model",
        str(trained_checkpoint()),
        "--weights",
        "raw",
        "--data",
        str(digits_folder()),
        "--out",
        str(tmp_path),
        "--batch-size",
        "16",
        "--workers",
        "0",
        "--device",
        "cpu",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = json.loads((tmp_path / "classify.json").read_text())
    one = single_process.scores
    assert record["num_processes"] == 2
    assert record["num_images"] == one.num_images
    assert (record["top1"], record["top5"]) == (one.top1, one.top5)
    assert record["loss"] == pytest.approx(one.loss, rel=1e-5)
    assert np.array_equal(record["confusion_matrix"], one.confusion)
    assert (tmp_path / "confusion_tiny-digits.png").stat().st_size > 0


def test_unreadable_files_are_skipped_and_listed(tmp_path):
    from cv2 import imwrite

    for c in ("a", "b"):
        for i in range(3):
            (tmp_path / "val" / c).mkdir(parents=True, exist_ok=True)
            imwrite(str(tmp_path / "val" / c / f"{i}.png"), random_rgb(40, 40, seed=i))
    (tmp_path / "val" / "a" / "empty.png").write_bytes(b"")
    (tmp_path / "val" / "b" / "notes.jpg").write_text("not an image")
    from vit5.eval import LoadedModel
    from vit5.introspect import Preprocessing

    model = LoadedModel(
        tiny_model(num_classes=2).eval(),
        label="tiny",
        spec="tiny",
        weights="random",
        description="tiny",
        preprocessing=Preprocessing(
            input_size=(32, 32), mean=(0.5,) * 3, std=(0.5,) * 3, crop_pct=1.0
        ),
        info=None,
    )
    result = evaluate(
        model,
        open_split(tmp_path, "val"),
        ClassifySettings(batch_size=4, num_workers=0),
        progress=False,
    )
    assert result.scores.num_images == 6
    assert result.scores.confusion.sum() == 6
    skipped = {Path(s["path"]).name: s["reason"] for s in result.skipped}
    assert set(skipped) == {"empty.png", "notes.jpg"}
    assert "0 bytes" in skipped["empty.png"]


def test_official_pth_and_timm_specs_load_strictly(tmp_path):
    import timm

    from vit5.reference import OfficialViT5

    official = OfficialViT5(img_size=32, embed_dim=48, depth=2, num_heads=2, num_classes=5).eval()
    ema = OfficialViT5(img_size=32, embed_dim=48, depth=2, num_heads=2, num_classes=5).eval()
    torch.save(
        {"model": official.state_dict(), "model_ema": ema.state_dict()},
        tmp_path / "vit5_official.pth",
    )
    x = torch.randn(2, 3, 32, 32)
    loaded = load_spec(str(tmp_path / "vit5_official.pth"))
    assert (loaded.label, loaded.weights) == ("vit5_official", "raw")
    torch.testing.assert_close(loaded.model(x), official(x), rtol=1e-4, atol=1e-4)
    loaded_ema = load_spec(str(tmp_path / "vit5_official.pth"), use_ema=True)
    torch.testing.assert_close(loaded_ema.model(x), ema(x), rtol=1e-4, atol=1e-4)

    kwargs = dict(img_size=32, depth=2, embed_dim=48, num_heads=2, num_classes=5)
    reference = timm.create_model("vit_small_patch16_224", pretrained=False, **kwargs).eval()
    torch.save(reference.state_dict(), tmp_path / "timm.pth")
    loaded = load_spec(f"timm:vit_small_patch16_224@{tmp_path / 'timm.pth'}", kwargs)
    assert (
        loaded.mean == (0.5, 0.5, 0.5) and loaded.crop_pct == 0.9
    )  # the timm model's own preprocessing
    torch.testing.assert_close(loaded.model(x), reference(x))
    with pytest.raises(InputError, match="does not fit timm model"):
        load_spec(f"timm:vit_small_patch16_224@{tmp_path / 'timm.pth'}", {**kwargs, "depth": 3})


def test_wrong_class_count_and_bad_size_are_clear_errors(models):
    dataset = open_split(digits_folder(), "val")
    wrong = load_spec("vit5_tiny", {"depth": 1, "num_classes": 3}, random_init=True)
    with pytest.raises(InputError, match="3 outputs but .* 10 classes"):
        evaluate(wrong, dataset, SETTINGS, progress=False)
    with pytest.raises(
        InputError, match="not a positive multiple of the patch size 8: use e.g. 32x40"
    ):
        evaluate(models[0], dataset, ClassifySettings(size=(30, 41)), progress=False)
    with pytest.raises(InputError, match="neither an existing checkpoint path nor a vit5 preset"):
        load_spec("vit5_tinny")


def test_sizes_from_scales_round_to_patch_multiples():
    assert round_to_patch((35.2, 60), 8) == (32, 64)
    assert sizes_from_scales(["0.5", "0.75", "1", "1.1", "1x2", "2x1"], (32, 32), 8) == [
        (16, 16),
        (24, 24),
        (32, 32),
        (32, 64),
        (64, 32),
    ]


def test_sweep_matches_classify_at_each_size_and_plots(models, single_process, tmp_path):
    dataset = open_split(digits_folder(), "val")
    with single_thread():
        results = run_sweep(
            models[:1], dataset, [(16, 16), (32, 32), (32, 64)], SETTINGS, progress=False
        )
    assert [r.size for r in results] == [(16, 16), (32, 32), (32, 64)]
    assert results[1].scores.top1 == single_process.scores.top1
    with single_thread():
        direct = evaluate(
            models[0], dataset, ClassifySettings((32, 64), None, 16, 0), progress=False
        )
    np.testing.assert_array_equal(results[2].scores.confusion, direct.scores.confusion)
    table = sweep_table(results)
    assert "32x64" in table and "tiny-digits" in table
    assert sweep_plot(results, tmp_path / "sweep.png", train_size=(32, 32)).stat().st_size > 0


# ------------------------------------------------------------------ class names of the model vs the folders
def named_checkpoint(tmp_path: Path, order: list[int]) -> Path:
    """The trained digits model with its outputs permuted to ``order`` and ``label_names`` saying so."""
    import vit5

    model = vit5.load_model(trained_checkpoint())
    with torch.no_grad():
        model.head.weight.copy_(model.head.weight[order])
        model.head.bias.copy_(model.head.bias[order])
    model.pretrained_cfg["label_names"] = [str(d) for d in order]
    return vit5.save_pretrained(model, tmp_path / f"named-{''.join(map(str, order))}")


def linked_split(tmp_path: Path, names: dict[str, str]) -> Path:
    """A val split whose class folder ``new`` links to the digits' folder ``old``."""
    split = tmp_path / f"linked-{len(list(tmp_path.iterdir()))}" / "val"
    split.mkdir(parents=True)
    for new, old in names.items():
        (split / new).symlink_to(digits_folder() / "val" / old, target_is_directory=True)
    return split.parent


def test_folders_named_otherwise_than_the_model_classes_are_refused(tmp_path):
    loaded = load_spec(str(named_checkpoint(tmp_path, list(range(10)))))
    assert loaded.class_names == tuple("0123456789")
    renamed = linked_split(tmp_path, {("zero" if d == "0" else d): d for d in "0123456789"})
    with pytest.raises(
        InputError, match=r"trained on 10 classes .* has 10 .*; gone: 0; new: zero\. Its outputs"
    ):
        evaluate(loaded, open_split(renamed, "val"), SETTINGS, progress=False)


def test_the_model_classes_in_another_order_or_some_of_them_are_mapped_by_name(
    tmp_path, single_process
):
    order = [3, 1, 4, 0, 5, 9, 2, 6, 8, 7]
    loaded = load_spec(str(named_checkpoint(tmp_path, order)))
    with single_thread():
        permuted = evaluate(loaded, open_split(digits_folder(), "val"), SETTINGS, progress=False)
    assert "the model's classes in another order; labels mapped by class name" in permuted.note
    assert permuted.scores.top1 == single_process.scores.top1  # the same predictions, renumbered
    assert permuted.class_names == [str(d) for d in order]
    np.testing.assert_array_equal(
        permuted.scores.confusion, single_process.scores.confusion[order][:, order]
    )

    subset = linked_split(tmp_path, {d: d for d in "01234"})
    with single_thread():
        part = evaluate(loaded, open_split(subset, "val"), SETTINGS, progress=False)
    assert "5 of the model's 10 classes" in part.note
    confusion = single_process.scores.confusion
    assert part.scores.top1 == np.trace(confusion[:5, :5]) / confusion[:5].sum()
    assert part.scores.num_images == confusion[:5].sum()
