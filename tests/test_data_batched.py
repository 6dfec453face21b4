"""Batch augmentation of preloaded images (vit5.data.batched) against the per-sample transforms: the same
crops, flips and erasing boxes in law, the same eval images, identical batches after a mid-epoch resume,
and the per-sample loader where images differ in size."""

from __future__ import annotations

import albumentations as A
import cv2
import numpy as np
import pytest
import torch
from data_images import random_rgb, write_png
from test_train_support import tiny_config
from torch.utils.data import DataLoader

from vit5.data import (
    BatchAugment,
    BatchLoader,
    ImageFolderDataset,
    RepeatAugSampler,
    batch_augment,
    build_loader,
    eval_transform,
    pad_crop_transform,
    rrc_transform,
)

MEAN = torch.tensor((0.485, 0.456, 0.406)) * 255
STD = torch.tensor((0.229, 0.224, 0.225)) * 255


def to_uint8(normalised: torch.Tensor) -> torch.Tensor:
    """Normalised ``[C, H, W]`` back to pixel values ``[H, W, C]``."""
    return (normalised.permute(1, 2, 0) * STD + MEAN).round().to(torch.uint8)


def folder(root, sizes=(12,), per_class=3, split="train"):
    for label in range(2):
        for i in range(per_class):
            size = sizes[i % len(sizes)]
            image = random_rgb(size, size, 10 * label + i)
            write_png(root / split / f"c{label}" / f"{i}.png", image)
    return root


def images_loader(count=40, batch=8, seed=0, world=1, rank=0, **options):
    images = torch.from_numpy(np.stack([random_rgb(12, 12, i) for i in range(count)]))
    labels = torch.arange(count)
    sampler = RepeatAugSampler(
        count, num_replicas=world, rank=rank, num_repeats=1, seed=seed, selected_round=0
    )
    augment = BatchAugment(size=(12, 12), **options)
    return BatchLoader(None, images, labels, batch, augment, sampler=sampler)


def test_pad_crop_is_numpys_reflect_pad_crop_and_flip():
    loader = images_loader(padding=3, hflip=0.5)
    images, labels = next(iter(loader))
    table = loader._params(0)
    positions = list(loader.sampler.positions())
    flips = 0
    for image, label, position in zip(images, labels.tolist(), positions):
        padded = np.pad(loader.images[label].numpy(), ((3, 3), (3, 3), (0, 0)), mode="reflect")
        top = int(table["top"][position])
        left = int(table["left"][position])
        want = padded[top : top + 12, left : left + 12]
        if table["flip"][position]:
            flips += 1
            want = want[:, ::-1]
        assert torch.equal(to_uint8(image), torch.from_numpy(want.copy()))
    assert 0 < flips < len(labels)


def per_sample_offset(transform, image: np.ndarray, padding: int) -> tuple[int, int, bool]:
    """The (top, left, flip) that the per-sample transform chose, found among all candidates."""
    out = to_uint8(transform(image)).numpy()
    padded = np.pad(image, ((padding, padding), (padding, padding), (0, 0)), mode="reflect")
    size = image.shape[0]
    span = range(2 * padding + 1)
    for top in span:
        for left in span:
            crop = padded[top : top + size, left : left + size]
            for flip in (False, True):
                if np.array_equal(crop[:, ::-1] if flip else crop, out):
                    return top, left, flip
    raise AssertionError("no candidate crop matches")


def test_crop_offsets_and_flip_rate_follow_the_per_sample_transform():
    image = random_rgb(10, 10, 3)
    transform = pad_crop_transform(10, padding=2, hflip=0.3, erasing=0.0)
    chosen = [per_sample_offset(transform, image, 2) for _ in range(500)]
    params = BatchAugment(size=(10, 10), padding=2, hflip=0.3).draw(
        20000, (10, 10), torch.Generator().manual_seed(0)
    )
    for key, column in (("top", 0), ("left", 1)):
        theirs = np.bincount([c[column] for c in chosen], minlength=5) / len(chosen)
        ours = np.bincount(params[key].numpy(), minlength=5) / 20000
        assert len(ours) == 5 and np.abs(ours - 0.2).max() < 0.01  # uniform over 0..2p
        assert np.abs(theirs - ours).max() < 0.07  # 4 standard errors of 500 draws
    theirs = np.mean([c[2] for c in chosen])
    assert abs(params["flip"].double().mean() - 0.3) < 0.01 and abs(theirs - 0.3) < 0.07


def erased_box(changed: np.ndarray) -> tuple[int, int]:
    rows = np.flatnonzero(changed.any(axis=1))
    cols = np.flatnonzero(changed.any(axis=0))
    if len(rows) == 0:
        return 0, 0
    return rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1


def test_erasing_boxes_follow_the_per_sample_law():
    grey = np.full((20, 20, 3), 128, np.uint8)
    transform = pad_crop_transform(20, padding=0, hflip=0.0, erasing=1.0)
    theirs = np.array(
        [erased_box((to_uint8(transform(grey)).numpy() != 128).any(-1)) for _ in range(400)]
    )
    augment = BatchAugment(size=(20, 20), erasing=1.0)
    generator = torch.Generator().manual_seed(1)
    rows = torch.zeros(4000, dtype=torch.long)
    params = augment.draw(4000, (20, 20), generator)
    outputs = augment(torch.from_numpy(grey[None]), rows, params, generator)
    changed = torch.stack([to_uint8(o) for o in outputs]).numpy() != 128
    ours = np.array([erased_box(c.any(-1)) for c in changed])
    # boxes as drawn (a noise value equal to the grey pixel in all 3 channels is 1 in 2**24)
    drawn = torch.stack([params["erase_height"], params["erase_width"]], 1).numpy()
    assert np.array_equal(ours, drawn)
    for boxes in (theirs, ours):
        area = boxes.prod(1)
        # sides rounded to whole pixels: the smallest box (area 8) may round to 2 x 3
        assert area.min() >= 0.02 * 400 * 0.7 and area.max() <= 0.33 * 400 * 1.2
        assert boxes.min() >= 1 and boxes.max() <= 20
    assert abs(theirs.prod(1).mean() - ours.prod(1).mean()) < 8  # about 4 standard errors
    # the aspect w / h is uniform over 0.3-3.3 (not log-uniform): both lean wide, by the same amount
    their_aspect = np.log(theirs[:, 1] / theirs[:, 0]).mean()
    our_aspect = np.log(ours[:, 1] / ours[:, 0]).mean()
    assert their_aspect > 0.2 and abs(their_aspect - our_aspect) < 0.15  # about 5 standard errors
    rate = BatchAugment(size=(20, 20), erasing=0.25).draw(8000, (20, 20), generator)
    assert abs((rate["erase_height"] > 0).double().mean() - 0.25) < 0.02


def test_eval_batches_equal_the_per_sample_eval_transform(tmp_path):
    root = folder(tmp_path, per_class=5)
    dataset = ImageFolderDataset(root, "train", eval_transform(12))
    dataset.verify(num_threads=2, keep=True)
    loader = build_loader(dataset, 4, train=False, augment=batch_augment("eval", 12))
    assert isinstance(loader, BatchLoader) and len(loader) == 3
    images = torch.cat([b[0] for b in loader])
    labels = torch.cat([b[1] for b in loader])
    for i in range(len(dataset)):
        image, label = dataset[i]
        assert (images[i] - image).abs().max() <= 1e-6 and labels[i] == label
    shares = [
        list(
            build_loader(
                dataset, 4, False, augment=batch_augment("eval", 12), num_replicas=2, rank=r
            )
        )
        for r in (0, 1)
    ]
    assert len(shares[0]) == len(shares[1]) == 2
    rank_labels = [torch.cat([b[1] for b in share]) for share in shares]
    assert torch.equal(rank_labels[0], labels[0::2]) and torch.equal(rank_labels[1], labels[1::2])


def test_eval_crop_that_resizes_has_no_batch_form():
    assert batch_augment("eval", 12, crop_ratio=0.875) is None
    assert batch_augment("three_augment", 12) is None
    assert batch_augment("pad_crop", 12, padding=2, hflip=0.5, erasing=0.1).padding == 2
    rrc = batch_augment("rrc", 12, scale=(0.75, 1.0), ratio=(1.0, 1.0), hflip=0.5, erasing=0.1)
    assert rrc.scale == (0.75, 1.0) and rrc.ratio == (1.0, 1.0) and rrc.erasing == 0.1
    assert rrc.fits((12, 12)) and rrc.fits((10, 12))  # its boxes grow: OpenCV's bicubic
    assert not rrc.fits((14, 12))  # a shrinking box would need INTER_AREA: per sample


@pytest.mark.parametrize("world", [1, 2])
def test_resume_mid_epoch_gives_identical_batches(world):
    for rank in range(world):
        loader = images_loader(world=world, rank=rank, padding=2, hflip=0.5, erasing=0.5)
        loader.sampler.set_epoch(3)
        epoch = list(loader)
        assert len(epoch) == 40 // world // 8
        loader.sampler.set_epoch(3, consumed=8 * world)
        resumed = list(loader)
        assert len(resumed) == len(epoch) - 1
        for (images, labels), (again, again_labels) in zip(epoch[1:], resumed):
            assert torch.equal(images, again) and torch.equal(labels, again_labels)
    loader.sampler.set_epoch(4)
    assert not torch.equal(next(iter(loader))[0], epoch[0][0])


def test_a_sample_gets_the_same_crop_on_any_number_of_processes():
    whole = images_loader(padding=2, hflip=0.5)
    images = torch.cat([b[0] for b in whole])
    halves = [images_loader(world=2, rank=r, padding=2, hflip=0.5) for r in (0, 1)]
    for rank, half in enumerate(halves):
        taken = torch.cat([b[0] for b in half])  # 2 full batches of 8 of the rank's 20 positions
        assert len(taken) == 16 and torch.equal(taken, images[rank::2][:16])


def test_resized_crop_boxes_and_pixels():
    augment = BatchAugment(size=(12, 12), scale=(0.3, 0.9), ratio=(0.5, 2.0), hflip=0.5)
    params = augment.draw(5000, (12, 12), torch.Generator().manual_seed(0))
    area = (params["height"] * params["width"]).double() / 144
    aspect = params["width"] / params["height"]
    assert area.min() >= 0.25 and area.max() <= 0.95 and aspect.min() >= 0.4 and aspect.max() <= 2.5
    assert (params["top"] + params["height"]).max() <= 12 and params["top"].min() >= 0
    assert (params["left"] + params["width"]).max() <= 12 and params["left"].min() >= 0
    image = torch.from_numpy(random_rgb(12, 12, 5))[None]
    whole = {
        "top": torch.zeros(2, dtype=torch.long),
        "left": torch.zeros(2, dtype=torch.long),
        "height": torch.full((2,), 12),
        "width": torch.full((2,), 12),
        "flip": torch.tensor([False, True]),
    }
    out = augment(image, torch.zeros(2, dtype=torch.long), whole)
    assert torch.equal(to_uint8(out[0]), image[0])
    assert torch.equal(to_uint8(out[1]), image[0].flip(1))


def test_resized_crop_sizes_follow_albumentations_random_resized_crop():
    """The crop box's side lengths in law against albumentations' own box draw (the per-sample ``rrc``)."""
    scale = (0.5, 1.0)
    ratio = (0.75, 1.25)
    theirs = rrc_transform(20, scale=scale, ratio=ratio).pipeline.transforms[0]
    assert isinstance(theirs, A.RandomResizedCrop)
    boxes = [theirs.get_params_dependent_on_data({"shape": (20, 20, 3)}, {}) for _ in range(2000)]
    coords = np.array([box["crop_coords"] for box in boxes])  # x_min, y_min, x_max, y_max
    their_widths = np.bincount(coords[:, 2] - coords[:, 0], minlength=21) / len(coords)
    their_heights = np.bincount(coords[:, 3] - coords[:, 1], minlength=21) / len(coords)
    augment = BatchAugment(size=(20, 20), scale=scale, ratio=ratio)
    params = augment.draw(20000, (20, 20), torch.Generator().manual_seed(0))
    our_widths = np.bincount(params["width"].numpy(), minlength=21) / 20000
    our_heights = np.bincount(params["height"].numpy(), minlength=21) / 20000
    assert their_widths[:10].sum() == 0 and our_widths[:10].sum() == 0  # area >= 0.5 of 400
    assert np.abs(their_widths - our_widths).max() < 0.045  # 4 standard errors of 2000 draws
    assert np.abs(their_heights - our_heights).max() < 0.045


def test_resized_crop_pixels_are_opencvs_bicubic_resize_of_the_box():
    """An upscaled box equals ``cv2.resize(INTER_CUBIC)`` of the box (albumentations' interpolation for
    RandomResizedCrop), flipped where drawn."""
    image = random_rgb(16, 16, 7)
    augment = BatchAugment(size=(20, 20), scale=(0.5, 1.0))
    box = {
        "top": torch.tensor([3, 3]),
        "left": torch.tensor([2, 2]),
        "height": torch.tensor([11, 11]),
        "width": torch.tensor([13, 13]),
        "flip": torch.tensor([False, True]),
    }
    out = augment(torch.from_numpy(image)[None], torch.zeros(2, dtype=torch.long), box)
    crop = np.ascontiguousarray(image[3:14, 2:15])
    expected = torch.from_numpy(cv2.resize(crop, (20, 20), interpolation=cv2.INTER_CUBIC))
    unflipped = (to_uint8(out[0]).int() - expected.int()).abs()
    flipped = (to_uint8(out[1]).int() - expected.flip(1).int()).abs()
    assert unflipped.max() <= 1 and flipped.max() <= 1  # uint8 rounding


def test_images_of_different_sizes_use_the_per_sample_loader(tmp_path):
    dataset = ImageFolderDataset(folder(tmp_path, sizes=(12, 14)), "train", eval_transform(12))
    dataset.verify(num_threads=2, keep=True)
    assert dataset.preloaded() is None
    loader = build_loader(dataset, 2, train=False, augment=batch_augment("eval", 12))
    assert isinstance(loader, DataLoader)
    images = torch.zeros(4, 14, 14, 3, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"cannot be cropped to \(12, 12\) without resizing"):
        BatchLoader(None, images, torch.zeros(4), 2, BatchAugment(size=(12, 12)))


@pytest.mark.filterwarnings("ignore::vit5.data.BadImageWarning")  # planted
def test_an_unreadable_file_is_its_next_readable_neighbour(tmp_path):
    root = folder(tmp_path)
    (root / "train" / "c0" / "1.png").write_bytes(b"not a png")
    dataset = ImageFolderDataset(root, "train")
    dataset.verify(num_threads=2, keep=True)
    images, labels = dataset.preloaded()
    assert images.shape == (6, 12, 12, 3) and dataset.preloaded()[0] is images
    for i in range(6):
        image, label = dataset[i]
        assert np.array_equal(images[i].numpy(), image) and labels[i] == label
    assert np.array_equal(images[1].numpy(), images[2].numpy())


def test_a_run_on_preloaded_folder_data_takes_the_batch_path(tmp_path):
    from accelerate import Accelerator

    from vit5.train.data import build_datasets, build_run_data

    root = folder(tmp_path / "data", per_class=4)
    folder(root, per_class=2, split="val")
    common = ["data.dataset=folder", f"data.root={root}", "data.preload=true", "model.img_size=12",
              "data.batch_size=2", "model.overrides.patch_size=4"]  # fmt: skip
    for kind, batched in (("pad_crop", True), ("rrc", True), ("three_augment", False)):
        cfg = tiny_config(tmp_path, *common, f"aug.train={kind}")
        train_set, val_set, _ = build_datasets(cfg)
        data = build_run_data(cfg, Accelerator(cpu=True), train_set, val_set)
        assert isinstance(data.train_loader, BatchLoader) == batched
        assert isinstance(data.val_loader, BatchLoader)
        assert len(data.train_loader) == 4 and data.train_loader.sampler.seed == cfg.run.seed
