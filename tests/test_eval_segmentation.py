"""Digits segmentation set and the dense linear probe: masks match the pastes, bad masks name the file."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from eval_helpers import TINY, single_thread
from sklearn.datasets import load_digits

from vit5.data.digits.segmentation import (
    SEG_CLASSES,
    SegSetConfig,
    digit_seg_samples,
    make_digit_segmentation,
)
from vit5.errors import InputError
from vit5.eval import (
    SegDatasetInfo,
    SegProbeSettings,
    dataset_info,
    default_splits,
    list_pairs,
    read_mask,
    run_segmentation_probe,
)
from vit5.eval.probes import EncodedSplit, score_linear_head, train_linear_head
from vit5.introspect.load import load_spec

SMALL = SegSetConfig(num_train=24, num_val=8, size=48, seed=3)


def test_masks_agree_with_where_the_digits_were_pasted():
    digits = load_digits()
    samples = digit_seg_samples("train", SMALL)
    assert len(samples) == 24
    for sample in samples:
        expected = np.zeros((48, 48), dtype=np.uint8)
        for p in sample.placements:
            assert digits.target[p.source_index] == p.digit
            assert 0 <= p.top <= 48 - p.side and 0 <= p.left <= 48 - p.side
            matte = (digits.images[p.source_index] / 16.0).astype(
                np.float32
            )  # bilinear float32 matte, as documented
            alpha = cv2.resize(matte, (p.side, p.side), interpolation=cv2.INTER_LINEAR)
            expected[p.top : p.top + p.side, p.left : p.left + p.side][alpha >= 0.5] = p.digit + 1
        np.testing.assert_array_equal(sample.mask, expected)
        grey = sample.image.mean(axis=2)
        assert (
            grey[sample.mask > 0].mean() > grey[sample.mask == 0].mean() + 60
        )  # pasted digits are bright
        assert 2 <= len(sample.placements) <= 4


def test_deterministic_and_train_val_use_disjoint_digits():
    a, b = digit_seg_samples("val", SMALL), digit_seg_samples("val", SMALL)
    assert all(
        np.array_equal(x.image, y.image) and x.placements == y.placements for x, y in zip(a, b)
    )
    train_sources = {
        p.source_index for s in digit_seg_samples("train", SMALL) for p in s.placements
    }
    assert not train_sources & {p.source_index for s in a for p in s.placements}


def test_written_set_reads_back_in_the_probe_layout(tmp_path):
    info = make_digit_segmentation(tmp_path, SMALL)
    assert info["num_classes"] == len(SEG_CLASSES) == 11
    assert default_splits(tmp_path) == ("train", "val")
    seg_info = dataset_info(tmp_path)
    assert seg_info.num_classes == 11 and seg_info.class_names[1] == "0"
    pairs = list_pairs(tmp_path, "val")
    for (image_path, mask_path), sample in zip(pairs, digit_seg_samples("val", SMALL)):
        np.testing.assert_array_equal(cv2.imread(str(image_path))[..., ::-1], sample.image)
        np.testing.assert_array_equal(read_mask(mask_path, (48, 48), seg_info), sample.mask)
    make_digit_segmentation(tmp_path, SMALL)  # same arguments: fine
    with pytest.raises(FileExistsError, match="other arguments"):
        make_digit_segmentation(tmp_path, SegSetConfig(num_train=5, num_val=2, size=48))


@pytest.fixture
def seg_root(tmp_path) -> Path:
    make_digit_segmentation(tmp_path, SegSetConfig(num_train=6, num_val=3, size=48))
    return tmp_path


def test_mask_of_the_wrong_size_names_the_file(seg_root):
    bad = seg_root / "annotations" / "val" / "00001.png"
    cv2.imwrite(str(bad), np.zeros((40, 48), np.uint8))
    with pytest.raises(InputError, match=f"{bad}.* is 40x48 but its image is 48x48"):
        _probe(seg_root)


def test_class_ids_beyond_num_classes_name_the_file(seg_root):
    bad = seg_root / "annotations" / "train" / "00002.png"
    mask = cv2.imread(str(bad), cv2.IMREAD_UNCHANGED)
    mask[0, :3] = 12
    cv2.imwrite(str(bad), mask)
    with pytest.raises(InputError, match=f"{bad} has class id\\(s\\) \\[12\\] outside 0..10"):
        _probe(seg_root)
    ignored = dataset_info(seg_root, ignore_index=12)  # the same value declared as ignore: accepted
    assert (read_mask(bad, (48, 48), ignored)[0, :3] == 12).all()


def test_palette_and_16_bit_masks_give_class_ids(tmp_path):
    from PIL import Image

    ids = np.arange(48 * 48).reshape(48, 48) % 11
    palette = Image.fromarray(ids.astype(np.uint8), mode="P")
    palette.putpalette(
        [v for i in range(256) for v in (i * 7 % 256, 255 - i, i * 3 % 256)]
    )  # colours != ids
    palette.save(tmp_path / "palette.png")
    cv2.imwrite(str(tmp_path / "deep.png"), (ids * 1000).astype(np.uint16))
    info = SegDatasetInfo(11, SEG_CLASSES)
    np.testing.assert_array_equal(read_mask(tmp_path / "palette.png", (48, 48), info), ids)
    deep = read_mask(
        tmp_path / "deep.png",
        (48, 48),
        SegDatasetInfo(10001, tuple(map(str, range(10001))), ignore_index=-1),
    )
    np.testing.assert_array_equal(deep, ids * 1000)
    ade = read_mask(
        tmp_path / "palette.png",
        (48, 48),
        SegDatasetInfo(10, SEG_CLASSES[1:], reduce_zero_label=True),
    )
    np.testing.assert_array_equal(
        ade, np.where(ids == 0, 255, ids - 1)
    )  # ADE20K: 0 = ignore, 1..N -> 0..N-1


def test_colour_and_missing_masks_name_the_file(seg_root):
    colour = seg_root / "annotations" / "val" / "00000.png"
    cv2.imwrite(str(colour), np.zeros((48, 48, 3), np.uint8))
    with pytest.raises(InputError, match=f"{colour} has 3 channels"):
        read_mask(colour, (48, 48), dataset_info(seg_root))
    (seg_root / "annotations" / "val" / "00002.png").unlink()
    with pytest.raises(InputError, match="00002.png has no label mask"):
        list_pairs(seg_root, "val")


def _probe(root: Path, model=None, **settings):
    model = model or load_spec("vit5_tiny", TINY, random_init=True)
    defaults = dict(size=(48, 48), epochs=2, batch_size=4)
    return run_segmentation_probe(
        model,
        str(root),
        dataset_info(root),
        ("train", "val"),
        SegProbeSettings(**{**defaults, **settings}),
        progress=False,
    )


def test_probe_runs_end_to_end_and_is_deterministic(seg_root):
    with single_thread():
        model = load_spec("vit5_tiny", TINY, random_init=True)
        first, second = (
            _probe(seg_root, model, layers=(0, 1)),
            _probe(seg_root, model, layers=(0, 1)),
        )
    assert first.scores.confusion.sum() == 3 * 48 * 48
    assert (
        first.scores.miou == second.scores.miou
        and first.final_train_loss == second.final_train_loss
    )
    assert first.blocks == [0, 1] and 0 <= first.scores.miou <= 1


def _encoded(samples, oracle: bool, seed: int = 0) -> EncodedSplit:
    masks = [s.mask.astype(np.int64) for s in samples]
    if oracle:  # per-patch class fractions: everything a linear head needs
        one_hot = torch.stack(
            [F.one_hot(torch.from_numpy(m), 11).permute(2, 0, 1).float() for m in masks]
        )
        features = F.avg_pool2d(one_hot, 4)
    else:
        features = torch.randn(
            len(masks), 11, 12, 12, generator=torch.Generator().manual_seed(seed)
        )
    return EncodedSplit(features.half(), masks, [])


def test_linear_head_learns_informative_features_and_not_noise():
    cfg = SegSetConfig(num_train=120, num_val=30, size=48, seed=1)
    train, val = digit_seg_samples("train", cfg), digit_seg_samples("val", cfg)
    info = SegDatasetInfo(11, SEG_CLASSES)
    settings = SegProbeSettings(epochs=15, lr=0.1, batch_size=16)
    with single_thread():
        oracle = score_linear_head(
            train_linear_head(_encoded(train, True), info, (48, 48), settings),
            _encoded(val, True),
            info,
        )[0]
        noise = score_linear_head(
            train_linear_head(_encoded(train, False), info, (48, 48), settings),
            _encoded(val, False, 1),
            info,
        )[0]
    background_share = np.mean([(s.mask == 0).mean() for s in val])
    assert oracle.miou > 0.7 and oracle.pixel_accuracy > 0.93
    assert noise.miou < 0.15  # nothing but background can be found
    assert noise.pixel_accuracy == pytest.approx(background_share, abs=0.02)
