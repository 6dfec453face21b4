"""ImageFolderDataset: layout, conversions, bad-file replacement and counting (also across workers)."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from data_images import (
    random_rgb,
    smooth_rgb,
    write_bad_files,
    write_jpeg,
    write_png,
    write_rgba_png,
)
from torch.utils.data import DataLoader

from vit5.data import BadImageWarning, ImageFolderDataset, ImageFolderError, build_transform


@pytest.fixture
def messy_root(tmp_path: Path) -> Path:
    """train/ with 2 classes: 8 decodable files of mixed formats and 3 broken ones, plus noise."""
    train = tmp_path / "train"
    write_png(train / "cat" / "a.png", random_rgb(10, 12, seed=1))
    write_jpeg(train / "cat" / "B.JPG", smooth_rgb(16, 16))
    write_png(train / "cat" / "nested" / "deeper" / "c.PNG", random_rgb(5, 5, seed=2)[..., 0])
    alpha = np.full((6, 6), 9, np.uint8)
    write_rgba_png(train / "cat" / "d.png", np.dstack([random_rgb(6, 6, seed=3), alpha]))
    write_png(train / "dog" / "e.png", np.full((4, 4), 60000, np.uint16))
    write_jpeg(train / "dog" / "f.jpeg", smooth_rgb(20, 30), orientation=6)
    write_png(train / "dog" / "g.png", random_rgb(8, 8, seed=4))
    write_png(train / "dog" / "h.png", random_rgb(8, 8, seed=5))
    write_bad_files(train / "dog" / "broken")
    (train / "cat" / "readme.txt").write_text("not an image extension, ignored")
    (train / "cat" / ".DS_Store").write_bytes(b"\0\1")
    write_png(train / "cat" / ".hidden" / "x.png", random_rgb(4, 4))
    write_png(train / ".ipynb_checkpoints" / "y.png", random_rgb(4, 4))
    return tmp_path


BAD_NAMES = {"empty.jpg", "truncated.jpg", "notes.jpg"}


def names(dataset: ImageFolderDataset) -> list[str]:
    return [Path(path).relative_to(dataset.root).as_posix() for path, _ in dataset.samples]


def test_layout_classes_sorted_recursive_case_insensitive(messy_root):
    ds = ImageFolderDataset(messy_root, "train")
    assert ds.class_names == ["cat", "dog"] and ds.class_to_idx == {"cat": 0, "dog": 1}
    assert names(ds) == [
        "cat/B.JPG",
        "cat/a.png",
        "cat/d.png",
        "cat/nested/deeper/c.PNG",
        "dog/broken/empty.jpg",
        "dog/broken/notes.jpg",
        "dog/broken/truncated.jpg",
        "dog/e.png",
        "dog/f.jpeg",
        "dog/g.png",
        "dog/h.png",
    ]
    assert ds.targets == [0] * 4 + [1] * 7
    assert names(ImageFolderDataset(messy_root / "train", None)) == names(
        ds
    )  # split folder given directly


def test_images_are_converted_to_rgb_uint8(messy_root):
    ds = ImageFolderDataset(messy_root, "train")
    shapes = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BadImageWarning)
        for i, name in enumerate(names(ds)):
            image, _ = ds[i]
            assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
            shapes[name] = image.shape
    assert shapes["dog/f.jpeg"] == (30, 20, 3)  # EXIF orientation 6 applied
    np.testing.assert_array_equal(
        ds[names(ds).index("dog/e.png")][0], np.full((4, 4, 3), 233)
    )  # 60000/257
    rgba = ds[names(ds).index("cat/d.png")][0]
    np.testing.assert_array_equal(rgba, random_rgb(6, 6, seed=3))  # alpha dropped


def test_bad_files_are_replaced_warned_once_and_counted(messy_root):
    ds = ImageFolderDataset(messy_root, "train")
    order = names(ds)
    with pytest.warns(BadImageWarning) as caught:
        first_pass = [ds[i] for i in range(len(ds))]
    warned = [name for w in caught for name in BAD_NAMES if f"/{name}:" in str(w.message)]
    assert sorted(warned) == sorted(BAD_NAMES)
    assert len(caught) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error", BadImageWarning)  # second pass: no new warnings
        second_pass = [ds[i] for i in range(len(ds))]
    replacement = ds[order.index("dog/e.png")]
    for i, name in enumerate(order):
        if name.split("/")[-1] in BAD_NAMES:
            np.testing.assert_array_equal(first_pass[i][0], replacement[0])  # next readable file
            assert first_pass[i][1] == replacement[1]
        np.testing.assert_array_equal(first_pass[i][0], second_pass[i][0])
    assert ds.num_bad == 3
    assert sorted(Path(p).name for p in ds.bad_files) == sorted(BAD_NAMES)
    assert ds.bad_mask.sum() == 3 and "bad=3" in repr(ds)


def test_replacement_wraps_around_to_the_start(tmp_path):
    write_png(tmp_path / "a" / "1.png", random_rgb(4, 4))
    write_bad_files(tmp_path / "b")
    ds = ImageFolderDataset(tmp_path)
    with pytest.warns(BadImageWarning):
        np.testing.assert_array_equal(ds[len(ds) - 1][0], ds[0][0])


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_bad_file_count_reaches_the_main_process_from_workers(messy_root, context):
    ds = ImageFolderDataset(messy_root, "train", transform=build_transform("eval", 8))
    workers = 2 if context == "fork" else 1  # a spawned worker re-imports everything: keep one
    loader = DataLoader(ds, batch_size=4, num_workers=workers, multiprocessing_context=context)
    batches = [images for images, _ in loader]
    assert [len(b) for b in batches] == [4, 4, 3] and batches[0].shape[1:] == (3, 8, 8)
    assert ds.num_bad == 3
    assert sorted(Path(p).name for p in ds.bad_files) == sorted(BAD_NAMES)


def test_verify_scans_up_front(messy_root):
    ds = ImageFolderDataset(messy_root, "train")
    with pytest.warns(BadImageWarning, match="3 of 11 files"):
        errors = ds.verify(num_threads=2)
    assert sorted(Path(e.path).name for e in errors) == sorted(BAD_NAMES)
    assert ds.num_bad == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error", BadImageWarning)  # already flagged: skipped silently
        [ds[i] for i in range(len(ds))]


def test_all_bad_fails_fast_naming_the_folder(tmp_path):
    write_bad_files(tmp_path / "train" / "a")
    write_bad_files(tmp_path / "train" / "b")
    ds = ImageFolderDataset(tmp_path, "train")
    with (
        pytest.warns(BadImageWarning),
        pytest.raises(ImageFolderError, match=r"none of the 6 files .*train"),
    ):
        ds[0]
    fresh = ImageFolderDataset(tmp_path, "train")
    with pytest.raises(ImageFolderError, match="none of the 6 files"):
        fresh.verify()


def test_empty_class_folder_fails_fast(tmp_path):
    write_png(tmp_path / "train" / "a" / "1.png", random_rgb(4, 4))
    (tmp_path / "train" / "b" / "sub").mkdir(parents=True)
    (tmp_path / "train" / "b" / "notes.txt").write_text("x")
    with pytest.raises(
        ImageFolderError, match=r"class folder .*train/b has no images.*delete the folder"
    ):
        ImageFolderDataset(tmp_path, "train")


def test_missing_split_and_root_fail_with_the_fix(tmp_path):
    write_png(tmp_path / "train" / "a" / "1.png", random_rgb(4, 4))
    with pytest.raises(
        ImageFolderError,
        match=r"split folder .*val does not exist \(sub-folders of .*: train\): the data root must "
        r"hold val/<class>/<image>$",
    ):
        ImageFolderDataset(tmp_path, "val")
    # a split given as the root: the message names the root to give
    with pytest.raises(ImageFolderError) as err:
        ImageFolderDataset(tmp_path / "train", "train")
    inner, outer = tmp_path / "train" / "train", tmp_path / "train"
    assert str(err.value) == (
        f"split folder {inner} does not exist, but {outer} does: the data root is {tmp_path}"
    )
    with pytest.raises(ImageFolderError, match="does not exist or is not a folder"):
        ImageFolderDataset(tmp_path / "nope", "train")
    with pytest.raises(ImageFolderError, match="looks like a data set root.*split='train'"):
        ImageFolderDataset(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ImageFolderError, match="no class sub-folders"):
        ImageFolderDataset(tmp_path / "empty")


def test_val_reuses_train_class_mapping(tmp_path):
    for split, classes in [("train", "abc"), ("val", "ac")]:
        for c in classes:
            write_png(tmp_path / split / c / "1.png", random_rgb(4, 4))
    train = ImageFolderDataset(tmp_path, "train")
    with pytest.raises(ImageFolderError, match=r"missing \['b'\]"):
        ImageFolderDataset(tmp_path, "val", class_names=train.class_names)
    write_png(tmp_path / "val" / "b" / "1.png", random_rgb(4, 4))
    val = ImageFolderDataset(tmp_path, "val", class_names=["c", "b", "a"])
    assert val.class_to_idx == {"c": 0, "b": 1, "a": 2} and sorted(val.targets) == [0, 1, 2]


def test_custom_extensions_and_alpha_background(tmp_path):
    write_rgba_png(tmp_path / "a" / "x.png", np.zeros((2, 2, 4), np.uint8))
    write_png(tmp_path / "a" / "y.bmp", random_rgb(2, 2))
    ds = ImageFolderDataset(tmp_path, extensions=["PNG"], alpha_background=(255, 255, 255))
    assert [Path(p).name for p, _ in ds.samples] == ["x.png"]
    assert ds[0][0].tolist() == [[[255, 255, 255]] * 2] * 2


def test_transform_output_is_returned(messy_root):
    ds = ImageFolderDataset(messy_root, "train", transform=build_transform("eval", (8, 12)))
    image, target = ds[0]
    assert isinstance(image, torch.Tensor) and image.shape == (3, 8, 12) and target == 0


def test_preload_reads_each_file_once_and_keeps_the_same_samples(messy_root, tmp_path):
    """After ``verify(keep=True)`` the files can be gone: the samples (bad ones replaced) are unchanged."""
    copy = tmp_path / "copy"
    shutil.copytree(messy_root, copy)
    reference = ImageFolderDataset(messy_root, "train")
    with pytest.warns(BadImageWarning, match="3 of 11 files"):
        reference.verify(num_threads=2)
    preloaded = ImageFolderDataset(copy, "train")
    with pytest.warns(BadImageWarning, match="3 of 11 files"):
        errors = preloaded.verify(num_threads=2, keep=True)
    assert len(errors) == 3 and preloaded.num_bad == 3
    shutil.rmtree(copy)
    for i in range(len(reference)):
        (want, want_target), (got, got_target) = reference[i], preloaded[i]
        assert got_target == want_target and np.array_equal(got, want)
        assert (
            not got.flags.writeable
        )  # a transform writing in place would fail, not change later epochs


def test_preload_beyond_half_the_memory_is_refused(messy_root, monkeypatch):
    monkeypatch.setattr("vit5.data.folder._physical_memory", lambda: 200)
    ds = ImageFolderDataset(messy_root, "train")
    with pytest.raises(
        ImageFolderError, match=r"half of this machine's memory.*data.preload=false"
    ):
        ds.verify(keep=True)
