"""Transforms checked against independent cv2 / PIL / torchvision computations."""

from __future__ import annotations

import random

import albumentations as A
import cv2
import numpy as np
import pytest
import torch
from data_images import random_rgb, smooth_rgb
from PIL import Image, ImageFilter
from timm.data import rand_augment_transform
from torchvision import transforms as T

from vit5.data import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    build_transform,
    eval_transform,
    pad_crop_transform,
    randaug_transform,
    three_augment,
)
from vit5.data.transforms import ImageTransform, TimmRandAugment

MEAN = np.array(IMAGENET_MEAN, np.float32)
STD = np.array(IMAGENET_STD, np.float32)


def normalise(rgb: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(((rgb.astype(np.float32) / 255 - MEAN) / STD).transpose(2, 0, 1).copy())


def denormalise(x: torch.Tensor) -> np.ndarray:
    return np.rint((x.numpy().transpose(1, 2, 0) * STD + MEAN) * 255).astype(int)


def reference_eval(rgb: np.ndarray, height: int, width: int, crop_ratio: float) -> torch.Tensor:
    """Cover-resize to (int(h / r), int(w / r)) keeping aspect (area down, cubic up), centre crop."""
    target_h, target_w = int(height / crop_ratio), int(width / crop_ratio)
    h, w = rgb.shape[:2]
    scale = max(target_h / h, target_w / w)
    new_h, new_w = round(h * scale), round(w * scale)
    resized = cv2.resize(
        rgb, (new_w, new_h), interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC
    )
    top, left = (new_h - height) // 2, (new_w - width) // 2
    return normalise(resized[top : top + height, left : left + width])


def one_of(transform: ImageTransform) -> A.OneOf:
    return next(t for t in transform.pipeline.transforms if isinstance(t, A.OneOf))


def force_choice(transform: ImageTransform, op: type) -> None:
    choice = one_of(transform)
    choice.transforms_ps = [float(isinstance(t, op)) for t in choice.transforms]


@pytest.mark.parametrize(
    ("shape", "size", "crop_ratio"),
    [
        ((100, 70), 32, 1.0),
        ((100, 70), 32, 0.875),
        ((20, 30), 32, 1.0),
        ((90, 90), (32, 48), 0.9),
        ((40, 120), (48, 32), 1.0),
    ],
)
def test_eval_transform_equals_explicit_resize_crop_normalise(shape, size, crop_ratio):
    rgb = random_rgb(*shape)
    height, width = (size, size) if isinstance(size, int) else size
    out = eval_transform(size, crop_ratio=crop_ratio)(rgb)
    assert out.shape == (3, height, width) and out.dtype == torch.float32
    torch.testing.assert_close(
        out, reference_eval(rgb, height, width, crop_ratio), atol=1e-5, rtol=0
    )


def test_eval_square_resizes_shorter_side_to_size_over_crop_ratio():
    resize = eval_transform(32, crop_ratio=0.875).pipeline.transforms[0]
    assert resize(image=random_rgb(100, 70))["image"].shape[:2] == (51, 36)  # int(32 / 0.875) = 36


def test_eval_is_close_to_the_official_pil_pipeline_only_with_antialias():
    noise = np.random.default_rng(0).integers(-30, 30, (150, 200, 3))
    rgb = np.clip(smooth_rgb(150, 200).astype(int) + noise, 0, 255).astype(np.uint8)
    resize = T.Resize(64, interpolation=T.InterpolationMode.BICUBIC)
    official = T.Compose(
        [resize, T.CenterCrop(64), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    )(Image.fromarray(rgb))
    close = (eval_transform(64)(rgb) - official).abs().mean().item()
    aliased = (eval_transform(64, antialias=False)(rgb) - official).abs().mean().item()
    assert close < 0.05 and aliased > 3 * close


def test_custom_mean_std():
    transform = build_transform("none", 4, mean=(0.5, 0.5, 0.5), std=(0.5, 0.25, 1.0))
    out = transform(np.full((4, 4, 3), 255, np.uint8))
    torch.testing.assert_close(out[:, 0, 0], torch.tensor([1.0, 2.0, 0.5]))


def test_three_augment_applies_exactly_one_of_the_three_ops(monkeypatch):
    calls: list[str] = []
    for op in (A.ToGray, A.Solarize, A.GaussianBlur):
        original = op.apply

        def recording_apply(self, img, _name=op.__name__, _apply=original, **params):
            calls.append(_name)
            return _apply(self, img, **params)

        monkeypatch.setattr(op, "apply", recording_apply)
    transform = three_augment(16)  # after patching: steps bind `apply` when built
    counts = {"ToGray": 0, "Solarize": 0, "GaussianBlur": 0}
    rgb = random_rgb(24, 24)
    for _ in range(300):
        calls.clear()
        transform(rgb)
        assert len(calls) == 1
        counts[calls[0]] += 1
    assert all(n >= 60 for n in counts.values()), counts  # uniform choice: ~100 each


def test_three_augment_solarize_threshold_is_128():
    transform = three_augment(8, color_jitter=0.0)
    force_choice(transform, A.Solarize)
    rgb = np.empty((12, 12, 3), np.uint8)
    rgb[...] = (127, 128, 255)  # constant: crop, resize and flip keep it
    expected = np.empty((8, 8, 3), np.uint8)
    expected[...] = (127, 255 - 128, 0)
    torch.testing.assert_close(transform(rgb), normalise(expected), atol=1e-6, rtol=0)


def test_three_augment_grayscale_gives_three_equal_luma_channels():
    transform = three_augment(8, color_jitter=0.0)
    force_choice(transform, A.ToGray)
    rgb = np.empty((12, 12, 3), np.uint8)
    rgb[...] = (200, 100, 50)
    luma = 0.299 * 200 + 0.587 * 100 + 0.114 * 50  # ITU-R 601, as torchvision Grayscale
    out = denormalise(transform(rgb))
    assert np.all(out == out[..., :1]) and np.abs(out - luma).max() <= 1


def test_three_augment_blur_matches_pil_gaussian_blur_with_sigma_in_range():
    rgb = cv2.GaussianBlur(random_rgb(32, 32, seed=3), (0, 0), 1.0)
    transform = three_augment(32, color_jitter=0.0, scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=0.0)
    force_choice(transform, A.GaussianBlur)
    grid = np.arange(0.1, 2.0001, 0.02)
    pil = Image.fromarray(rgb)
    pil_blurs = [
        np.asarray(pil.filter(ImageFilter.GaussianBlur(float(s)))).astype(int) for s in grid
    ]
    fitted = []
    for _ in range(25):
        out = denormalise(transform(rgb))
        errors = [np.abs(out - b).mean() for b in pil_blurs]
        assert min(errors) < 1.0
        fitted.append(grid[int(np.argmin(errors))])
    assert max(fitted) > 1.4  # draws span the range up to sigma 2


def test_three_augment_colour_jitter_has_no_hue():
    jitter = next(t for t in three_augment(8).pipeline.transforms if isinstance(t, A.ColorJitter))
    assert jitter.brightness == jitter.contrast == jitter.saturation == (0.7, 1.3)
    assert jitter.hue == (0.0, 0.0)
    assert not any(
        isinstance(t, A.ColorJitter) for t in three_augment(8, color_jitter=0).pipeline.transforms
    )


def test_simple_random_crop_is_a_window_of_the_reflect_padded_image():
    gray = random_rgb(16, 16)[..., 0]
    rgb = np.stack([gray] * 3, axis=-1)
    padded = cv2.copyMakeBorder(gray, 4, 4, 4, 4, cv2.BORDER_REFLECT_101).astype(int)
    transform = three_augment(16, simple_random_crop=True, color_jitter=0.0)
    force_choice(transform, A.ToGray)  # grey stays grey exactly
    offsets = set()
    for _ in range(20):
        out = denormalise(transform(rgb))[..., 0]
        matches = [
            (dy, dx)
            for dy in range(9)
            for dx in range(9)
            for window in [padded[dy : dy + 16, dx : dx + 16]]
            if np.array_equal(out, window) or np.array_equal(out, window[:, ::-1])
        ]
        assert matches
        offsets.update(matches)
    assert len(offsets) > 3


def test_pad_crop_is_a_flipped_or_unflipped_window_of_the_reflect_padded_image():
    gray = random_rgb(12, 12)[..., 0]
    padded = cv2.copyMakeBorder(gray, 3, 3, 3, 3, cv2.BORDER_REFLECT_101).astype(int)
    transform = pad_crop_transform(12, padding=3, erasing=0.0)
    seen = set()
    for _ in range(30):
        out = denormalise(transform(np.stack([gray] * 3, axis=-1)))
        assert (out == out[..., :1]).all()  # no colour op: grey stays grey
        windows = [
            (dy, dx, padded[dy : dy + 12, dx : dx + 12]) for dy in range(7) for dx in range(7)
        ]
        matches = [(dy, dx, False) for dy, dx, w in windows if np.array_equal(out[..., 0], w)]
        matches += [
            (dy, dx, True) for dy, dx, w in windows if np.array_equal(out[..., 0], w[:, ::-1])
        ]
        assert matches
        seen.update(matches)
    assert len({m[:2] for m in seen}) > 3 and {m[2] for m in seen} == {False, True}


def test_pad_crop_erasing_replaces_one_rectangle_with_noise():
    gray = np.full((20, 20), 100, np.uint8)
    transform = pad_crop_transform(20, padding=0, hflip=0.0, erasing=1.0)
    for _ in range(10):
        changed = denormalise(transform(np.stack([gray] * 3, axis=-1)))[..., 0] != 100
        rows, cols = np.flatnonzero(changed.any(1)), np.flatnonzero(changed.any(0))
        area = (rows[-1] - rows[0] + 1) * (cols[-1] - cols[0] + 1)
        assert (
            0.02 * 400 * 0.5 <= area <= 0.33 * 400
        )  # one box of 2-33 % (noise may match 100 at its edge)
        assert changed[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1].mean() > 0.9
    plain = pad_crop_transform(20, padding=0, hflip=0.0, erasing=0.0)
    assert (denormalise(plain(np.stack([gray] * 3, axis=-1))) == 100).all()


def test_augmentation_steps_do_not_move_in_lockstep():
    # albumentations 2.0 seeds every step with the same seed, so two p=0.5 flips would always agree.
    transform = ImageTransform([A.HorizontalFlip(p=0.5), A.VerticalFlip(p=0.5)])
    rgb = random_rgb(4, 4)
    variants = {tuple(transform(rgb).flatten().tolist()) for _ in range(64)}
    assert len(variants) == 4


def test_augmentation_follows_the_torch_seed():
    transform, rgb = three_augment(16), random_rgb(24, 24)
    torch.manual_seed(1)
    first = [transform(rgb) for _ in range(3)]
    torch.manual_seed(1)
    again = [transform(rgb) for _ in range(3)]
    torch.manual_seed(2)
    other = transform(rgb)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other) and not torch.equal(first[0], first[1])


def test_randaug_step_is_timm_rand_augment_unchanged():
    rgb = smooth_rgb(32, 32)
    step = TimmRandAugment("rand-m9-mstd0.5-inc1", (32, 32), IMAGENET_MEAN)
    timm_op = rand_augment_transform(
        "rand-m9-mstd0.5-inc1",
        {"translate_const": 14, "img_mean": (124, 116, 104), "interpolation": Image.BICUBIC},
    )
    for seed in range(5):
        random.seed(seed), np.random.seed(seed)
        ours = step(image=rgb)["image"]
        random.seed(seed), np.random.seed(seed)
        np.testing.assert_array_equal(ours, np.asarray(timm_op(Image.fromarray(rgb))))


def test_randaug_pipeline_order_and_output():
    transform = randaug_transform((32, 48))
    names = [type(t).__name__ for t in transform.pipeline.transforms]
    assert names == [
        "RandomResizedCrop",
        "HorizontalFlip",
        "TimmRandAugment",
        "Normalize",
        "ToTensorV2",
    ]
    assert transform(random_rgb(50, 60)).shape == (3, 32, 48)


@pytest.mark.parametrize("kind", ["three_augment", "randaug", "rrc", "pad_crop", "eval", "none"])
@pytest.mark.parametrize("size", [32, (32, 48)])
def test_build_transform_kinds_give_normalised_chw_tensors(kind, size):
    out = build_transform(kind, size)(random_rgb(40, 70))
    height, width = (size, size) if isinstance(size, int) else size
    assert out.shape == (3, height, width) and out.dtype == torch.float32


@pytest.mark.parametrize(
    ("args", "options", "error", "match"),
    [
        (("rand", 32), {}, ValueError, "unknown transform kind"),
        (("eval", 32), {"color_jitter": 0.3}, TypeError, "unexpected keyword"),
        (("eval", 0), {}, ValueError, "size must be positive"),
        (("eval", 32.0), {}, TypeError, "size must be an int"),
        (("eval", (32, 32, 3)), {}, TypeError, "size must be an int"),
        (("eval", 32), {"crop_ratio": 1.2}, ValueError, "crop_ratio"),
        (("eval", 32), {"mean": (0.5, 0.5)}, ValueError, "one value per RGB channel"),
        (
            ("none", 32),
            {"std": (0.5, 0.0, 0.5)},
            ValueError,
            r"std=\(0.5, 0.0, 0.5\) must be one value > 0",
        ),
        (("three_augment", 32), {"scale": (0.5, 0.1)}, ValueError, "scale"),
        (("three_augment", 32), {"color_jitter": -1}, ValueError, "color_jitter"),
        (("three_augment", 32), {"hflip": 2}, ValueError, "hflip"),
        (("randaug", 32), {"policy": "m9"}, ValueError, "RandAugment string"),
        (("rrc", 32), {"ratio": (2.0, 1.0)}, ValueError, "ratio"),
        (("rrc", 32), {"erasing": -0.1}, ValueError, "erasing"),
        (("pad_crop", 32), {"erasing": 1.5}, ValueError, "erasing"),
        (("pad_crop", 32), {"padding": -1}, ValueError, "padding"),
    ],
)
def test_build_transform_validates(args, options, error, match):
    with pytest.raises(error, match=match):
        build_transform(*args, **options)


@pytest.mark.parametrize("recipe", ["finetune_in1k", "vit5_small_in1k"])
def test_shipped_recipe_augmentation_survives_thousands_of_images(recipe):
    """The recipes' train transforms over 3000 random images: RandAugment's posterize at magnitude 10
    keeps 0 bits, which Pillow >= 13 rejects (ValueError: bits must be between ... 1 and 8)."""
    from importlib.resources import files

    from omegaconf import OmegaConf

    aug = OmegaConf.load(files("vit5") / "configs" / f"{recipe}.yaml").aug
    options = {"hflip": aug.get("hflip", 0.5)}
    if aug.train == "randaug":
        options["policy"] = aug.randaug
    else:
        options["color_jitter"] = aug.color_jitter
    transform = build_transform(aug.train, 16, **options)
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    rng = np.random.default_rng(0)
    for _ in range(3000):
        assert transform(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).shape == (3, 16, 16)


def test_posterize_to_zero_bits_clears_every_bit_on_any_pillow():
    from vit5.data.transforms import posterize

    image = Image.fromarray(random_rgb(8, 8))
    assert not np.asarray(posterize(image, 0)).any()  # what Pillow < 13 returned for 0 bits
    np.testing.assert_array_equal(np.asarray(posterize(image, 3)), np.asarray(image) & 0b11100000)
