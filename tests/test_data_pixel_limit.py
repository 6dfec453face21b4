"""Decompression bombs (an image whose header declares more pixels than the limit) are refused from the
header, and every tool lists them as failed while it processes the rest: training folders, feature
export, viz, classification."""

from __future__ import annotations

from pathlib import Path

import pytest
from data_images import random_rgb, write_png, write_png_bomb
from eval_helpers import tiny_model

from vit5.data import BadImageWarning, ImageFolderDataset, build_transform
from vit5.eval import (
    ClassifySettings,
    FeatureSettings,
    LoadedModel,
    evaluate,
    export_features,
    open_split,
)
from vit5.introspect import Preprocessing
from vit5.viz.images import load_images

BOMB = (
    12000,
    12000,
)  # 144 million pixels, over the default limit (PIL's, 89,478,485); a few KB on disk


def _is_the_limit(reason: str) -> bool:
    return (
        "declares 12000x12000 = 144,000,000 pixels" in reason and "VIT5_MAX_IMAGE_PIXELS=" in reason
    )


@pytest.fixture
def folder(tmp_path) -> Path:
    for c in ("a", "b"):
        for i in range(2):
            write_png(tmp_path / "val" / c / f"{i}.png", random_rgb(40, 40, seed=i))
    write_png_bomb(tmp_path / "val" / "a" / "bomb.png", *BOMB)
    return tmp_path


def test_training_folder_counts_a_bomb_as_bad_and_serves_the_rest(folder):
    ds = ImageFolderDataset(folder, "val", transform=build_transform("eval", 8))
    with pytest.warns(BadImageWarning):
        errors = ds.verify(num_threads=1)
    assert [Path(e.path).name for e in errors] == ["bomb.png"] and _is_the_limit(errors[0].reason)
    assert ds.num_bad == 1 and all(ds[i][0].shape == (3, 8, 8) for i in range(len(ds)))


def test_feature_export_lists_a_bomb_as_failed(folder, tmp_path):
    summary = export_features(
        tiny_model(depth=1).eval(),
        folder / "val",
        tmp_path / "out",
        FeatureSettings(),
        progress=False,
    )
    assert summary.written == 4 and [f.path.name for f in summary.failed] == ["bomb.png"]
    assert _is_the_limit(summary.failed[0].reason)


def test_viz_skips_a_bomb(folder):
    images, skipped = load_images([str(folder / "val")], (32, 32), 8)
    assert (
        len(images) == 4
        and len(skipped) == 1
        and "bomb.png" in skipped[0]
        and _is_the_limit(skipped[0])
    )


def test_classification_skips_and_lists_a_bomb(folder):
    model = LoadedModel(
        tiny_model(depth=1, num_classes=2).eval(),
        label="tiny",
        spec="tiny",
        weights="random",
        description="tiny",
        preprocessing=Preprocessing(
            input_size=(32, 32), mean=(0.5,) * 3, std=(0.5,) * 3, crop_pct=1.0
        ),
        info=None,
    )
    settings = ClassifySettings(batch_size=4, num_workers=0)
    result = evaluate(model, open_split(folder, "val"), settings, progress=False)
    assert result.scores.num_images == 4
    assert [Path(s["path"]).name for s in result.skipped] == ["bomb.png"]
    assert _is_the_limit(result.skipped[0]["reason"])
