"""Built-in digits: stratified, disjoint, deterministic split; in-memory dataset; PNG export and CLI."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from vit5.cli import main as cli_main
from vit5.data import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    DigitsDataset,
    ImageFolderDataset,
    build_transform,
    decode_image,
    export_digits_imagefolder,
    load_digits_split,
)
from vit5.data.digits import DIGIT_CLASSES


def run_cli(*args: str) -> int:
    """``vit5 data ARGS`` in this process."""
    return cli_main(["data", *args])


SOURCE = load_digits()


def test_split_is_disjoint_complete_stratified_and_deterministic():
    train, val = load_digits_split("train"), load_digits_split("val")
    assert set(train.source_indices).isdisjoint(val.source_indices)
    assert sorted([*train.source_indices, *val.source_indices]) == list(range(1797))
    assert len(val.targets) == round(1797 * 0.2)
    for c in range(10):
        total = int((SOURCE.target == c).sum())
        assert abs(int((val.targets == c).sum()) - 0.2 * total) <= 1
    np.testing.assert_array_equal(train.targets, SOURCE.target[train.source_indices])
    np.testing.assert_array_equal(load_digits_split("val").source_indices, val.source_indices)
    assert not np.array_equal(load_digits_split("val", seed=1).source_indices, val.source_indices)
    assert len(load_digits_split("val", val_fraction=0.5).targets) == round(1797 * 0.5)


def test_images_are_upscaled_rgb_copies_of_the_sklearn_digits():
    data = load_digits_split("val", size=64)
    assert data.images.shape == (len(data.targets), 64, 64, 3) and data.images.dtype == np.uint8
    assert np.all(data.images == data.images[..., :1])
    assert data.images.max() == 255 and data.images.min() == 0
    back = np.stack(
        [cv2.resize(im[..., 0], (8, 8), interpolation=cv2.INTER_AREA) for im in data.images]
    )
    original = SOURCE.images[data.source_indices] * (255 / 16)
    assert (
        np.corrcoef(back.ravel(), original.ravel())[0, 1] > 0.97
    )  # same digits, 0..16 mapped to 0..255
    assert load_digits_split("val", size=32).images.shape[1:] == (32, 32, 3)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"split": "test"}, "split"),
        ({"size": 4}, "size"),
        ({"val_fraction": 1.0}, "val_fraction"),
        ({"val_fraction": 0.001}, "per class"),
    ],
)
def test_split_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_digits_split(**{"split": "train", **kwargs})


def test_dataset_applies_the_transform_interface():
    raw = DigitsDataset("val")
    image, target = raw[3]
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8 and target == raw.targets[3]
    assert raw.class_names == list(DIGIT_CLASSES) and len(raw) == 359
    plain = DigitsDataset("val", transform=build_transform("none", 32))
    mean = torch.tensor(IMAGENET_MEAN)[:, None, None]
    std = torch.tensor(IMAGENET_STD)[:, None, None]
    expected = (torch.from_numpy(image).permute(2, 0, 1).float() / 255 - mean) / std
    torch.testing.assert_close(plain[3][0], expected)
    augmented = DigitsDataset("val", transform=build_transform("three_augment", 32))
    assert augmented[3][0].shape == (3, 32, 32) and not torch.allclose(augmented[3][0], expected)


def test_export_writes_pngs_that_decode_to_the_same_pixels(tmp_path):
    report = export_digits_imagefolder(tmp_path, size=16)
    assert (report.written, report.unchanged) == (1797, 0)
    for split in ("train", "val"):
        data = load_digits_split(split, size=16)
        per_class = {c: int((data.targets == i).sum()) for i, c in enumerate(DIGIT_CLASSES)}
        assert report.counts[split] == per_class
        for k in range(0, len(data.targets), 50):
            path = (
                tmp_path
                / split
                / DIGIT_CLASSES[data.targets[k]]
                / f"{data.source_indices[k]:04d}.png"
            )
            np.testing.assert_array_equal(decode_image(path), data.images[k])
    folder = ImageFolderDataset(tmp_path, "val")
    assert folder.class_names == list(DIGIT_CLASSES) and len(folder) == 359
    assert "val 359" in str(report)


def test_export_is_idempotent_and_refuses_a_different_split(tmp_path):
    export_digits_imagefolder(tmp_path, size=16)
    again = export_digits_imagefolder(tmp_path, size=16)
    assert (again.written, again.unchanged) == (0, 1797)
    resized = export_digits_imagefolder(tmp_path, size=24)
    assert resized.written == 1797
    assert decode_image(next((tmp_path / "val" / "0").iterdir())).shape == (24, 24, 3)
    with pytest.raises(FileExistsError, match="other arguments"):
        export_digits_imagefolder(tmp_path, size=24, seed=1)


def test_cli_export(tmp_path, monkeypatch, capsys):
    assert run_cli("digits", str(tmp_path), "--size", "16") == 0
    assert "train 1438, val 359 images; 1797 written" in capsys.readouterr().out
    assert run_cli("digits", str(tmp_path), "--size", "16", "--val-fraction", "0.3") == 2
    assert "other arguments" in capsys.readouterr().err
