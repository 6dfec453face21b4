"""Train and eval transforms: RGB uint8 HxWx3 array in, normalised float32 CHW tensor out.

Three recipes from the ViT-5 / DeiT-III training code, built on albumentations:

* :func:`three_augment`  - pre-training "3-Augment" (DeiT III, arXiv 2204.07118; official ViT-5
  ``augment.py:90`` ``new_data_aug_generator`` at github.com/wangf3014/ViT-5 commit b7b0796);
* :func:`randaug_transform` - fine-tuning RRC + flip + RandAugment ``rand-m9-mstd0.5-inc1``;
* :func:`pad_crop_transform` - the small-image recipe of the CIFAR / Fashion-MNIST literature: reflect-pad,
  random crop, flip and random erasing (Zhong et al., arXiv 1708.04896), no colour changes;
* :func:`eval_transform` - resize by ``1 / crop_ratio`` then centre crop (official ``datasets.py:101-105``
  at b7b0796, ``--eval-crop-ratio 0.875``);

plus :func:`resize_transform` (no augmentation) and the :func:`build_transform` factory.

Resampling is bicubic as in the official recipe. OpenCV's bicubic does not low-pass when shrinking
(PIL's does), so with ``antialias=True`` (default) downscaling uses ``INTER_AREA``, which is much
closer to PIL's antialiased bicubic that produced the released checkpoints.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Literal, get_args

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2

from vit5.data.randaug import TimmRandAugment

# timm.data's IMAGENET_DEFAULT_MEAN/STD (vit5.model uses those): vit5.data imports no timm, to stay light
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)
DEFAULT_RANDAUG_POLICY = "rand-m9-mstd0.5-inc1"

TransformKind = Literal["three_augment", "randaug", "pad_crop", "eval", "none"]
Size = int | tuple[int, int]


class ImageTransform:
    """Callable ``(H, W, 3) uint8 RGB array -> (3, h, w) float32 tensor``; wraps ``pipeline``.

    Randomness comes from torch's global RNG, as with torchvision transforms: each call draws a
    seed from it for the albumentations generators. DataLoader workers seed torch from the loader
    generator, so workers draw different augmentations and a run with the same loader seed repeats
    exactly; in the main process it follows ``torch.manual_seed``. Left alone, albumentations 2.0
    would give forked workers identical copies of one OS-seeded state, and a fixed ``seed`` gives
    every step its own generator with the *same* seed, so their random draws move in lockstep;
    here one generator pair is shared by all steps.
    """

    def __init__(
        self,
        steps: Sequence[A.BasicTransform | A.BaseCompose],
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
    ) -> None:
        mean, std = _validate_mean_std(mean, std)
        normalize = A.Normalize(mean=mean, std=std, max_pixel_value=255.0)
        self.pipeline = A.Compose([*steps, normalize, ToTensorV2()])

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        seed = int(torch.empty((), dtype=torch.int64).random_())
        self.pipeline.set_random_state(np.random.default_rng(seed), random.Random(seed))
        return self.pipeline(image=image)["image"]

    def __repr__(self) -> str:
        return f"ImageTransform({self.pipeline!r})"


def three_augment(
    size: Size,
    *,
    color_jitter: float = 0.3,
    simple_random_crop: bool = False,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    hflip: float = 0.5,
    antialias: bool = True,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> ImageTransform:
    """DeiT-III 3-Augment, the ViT-5 pre-training augmentation (``--ThreeAugment``).

    RandomResizedCrop(scale, ratio, bicubic) + horizontal flip, then exactly one of {grayscale
    (3 channels), solarize (inverts values >= 128, PIL's default), Gaussian blur (sigma ~ U(0.1, 2))},
    then ColorJitter(brightness, contrast, saturation = ``color_jitter``, no hue; skipped when 0).
    ``simple_random_crop`` is DeiT-III's ``--src`` variant: resize shorter side to ``size``,
    reflect-pad 4 px, random crop, flip.
    """
    height, width = _size_hw(size)
    _check_range("scale", scale, low=0.0, high=1.0)
    _check_range("ratio", ratio, low=0.0, high=None)
    _check_probability("hflip", hflip)
    if color_jitter < 0:
        raise ValueError(f"color_jitter must be >= 0 (0 disables it), got {color_jitter}")
    if simple_random_crop:
        primary: list[A.BasicTransform] = [
            _cover_resize(height, width, antialias),
            A.Pad(padding=4, border_mode=cv2.BORDER_REFLECT_101),
            A.RandomCrop(height, width),
        ]
    else:
        primary = [_random_resized_crop(height, width, scale, ratio, antialias)]
    steps: list[A.BasicTransform | A.BaseCompose] = [
        *primary,
        A.HorizontalFlip(p=hflip),
        A.OneOf(
            [
                A.ToGray(num_output_channels=3, method="weighted_average", p=1.0),
                # albumentations inverts v >= threshold * 255 = 127.5, i.e. v >= 128 like PIL.
                A.Solarize(threshold_range=(0.5, 0.5), p=1.0),
                # blur_limit=0 derives the kernel from sigma the way PIL's GaussianBlur(radius) does.
                A.GaussianBlur(blur_limit=0, sigma_limit=(0.1, 2.0), p=1.0),
            ],
            p=1.0,
        ),
    ]
    if color_jitter > 0:
        jitter = color_jitter
        steps.append(A.ColorJitter(brightness=jitter, contrast=jitter, saturation=jitter, hue=0.0, p=1.0))
    return ImageTransform(steps, mean, std)


def randaug_transform(
    size: Size,
    *,
    policy: str = DEFAULT_RANDAUG_POLICY,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    hflip: float = 0.5,
    antialias: bool = True,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> ImageTransform:
    """ViT-5 fine-tuning augmentation: RRC(bicubic) + flip + timm RandAugment ``policy``.

    As in timm's ``create_transform`` with ``auto_augment`` set, there is no colour jitter and
    (``--reprob 0``) no random erasing. RandAugment runs on PIL; see :mod:`vit5.data.randaug`.
    """
    height, width = _size_hw(size)
    _check_range("scale", scale, low=0.0, high=1.0)
    _check_range("ratio", ratio, low=0.0, high=None)
    _check_probability("hflip", hflip)
    if not policy.startswith("rand-"):
        raise ValueError(
            f"policy must be a timm RandAugment string such as {DEFAULT_RANDAUG_POLICY!r}, got {policy!r}"
        )
    mean, std = _validate_mean_std(mean, std)
    steps = [
        _random_resized_crop(height, width, scale, ratio, antialias),
        A.HorizontalFlip(p=hflip),
        TimmRandAugment(policy, (height, width), mean, p=1.0),
    ]
    return ImageTransform(steps, mean, std)


def pad_crop_transform(
    size: Size,
    *,
    padding: int = 4,
    hflip: float = 0.5,
    erasing: float = 0.25,
    antialias: bool = True,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> ImageTransform:
    """Augmentation for small framed images (Fashion-MNIST, CIFAR): resize to ``size``, pad ``padding``
    px (reflect), random crop back to ``size``, horizontal flip, then random erasing with probability
    ``erasing`` (Zhong et al., arXiv 1708.04896: area 2-33 %, aspect 0.3-3.3, filled with random noise
    as their RE-R; albumentations ``Erasing``). No colour changes: the images are grey and their
    intensity carries the class (DeiT-III's ``--src`` crop, without 3-Augment's colour ops).
    """
    height, width = _size_hw(size)
    _check_probability("hflip", hflip)
    _check_probability("erasing", erasing)
    if padding < 0:
        raise ValueError(f"padding must be >= 0 pixels, got {padding}")
    steps: list[A.BasicTransform] = [A.Resize(height, width, **_interpolation(antialias))]
    if padding:
        steps += [A.Pad(padding=padding, border_mode=cv2.BORDER_REFLECT_101), A.RandomCrop(height, width)]
    steps.append(A.HorizontalFlip(p=hflip))
    if erasing > 0:
        steps.append(A.Erasing(scale=(0.02, 0.33), ratio=(0.3, 3.3), fill="random", p=erasing))
    return ImageTransform(steps, mean, std)


def eval_transform(
    size: Size,
    *,
    crop_ratio: float = 1.0,
    antialias: bool = True,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> ImageTransform:
    """Evaluation preprocessing (``--eval-crop-ratio``; 1.0 in the official ViT-5 recipe).

    Resize, keeping the aspect ratio, to the smallest image that covers
    ``(int(h / crop_ratio), int(w / crop_ratio))`` (for a square size: shorter side =
    ``int(size / crop_ratio)``), then centre crop ``(h, w)``. Bicubic; area when shrinking.
    """
    height, width = _size_hw(size)
    if not 0.0 < crop_ratio <= 1.0:
        raise ValueError(
            f"crop_ratio must be in (0, 1] (1.0 = official ViT-5 eval, 0.875 = classic), got {crop_ratio}"
        )
    steps = [
        _cover_resize(int(height / crop_ratio), int(width / crop_ratio), antialias),
        A.CenterCrop(height, width),
    ]
    return ImageTransform(steps, mean, std)


def resize_transform(
    size: Size,
    *,
    antialias: bool = True,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> ImageTransform:
    """No augmentation: resize to exactly ``size`` (aspect not kept) and normalise.

    Meant for data that is already framed, e.g. the built-in digits set.
    """
    height, width = _size_hw(size)
    return ImageTransform([A.Resize(height, width, **_interpolation(antialias))], mean, std)


_BUILDERS = {
    "three_augment": three_augment,
    "randaug": randaug_transform,
    "pad_crop": pad_crop_transform,
    "eval": eval_transform,
    "none": resize_transform,
}


def build_transform(kind: TransformKind, size: Size, **options: Any) -> ImageTransform:
    """Build a transform by name; ``options`` go to the matching builder.

    ``"three_augment"`` -> :func:`three_augment` (pre-training), ``"randaug"`` ->
    :func:`randaug_transform` (fine-tuning), ``"pad_crop"`` -> :func:`pad_crop_transform` (small
    framed images), ``"eval"`` -> :func:`eval_transform`,
    ``"none"`` -> :func:`resize_transform`. An option the builder does not take is an error.
    """
    if kind not in _BUILDERS:
        raise ValueError(f"unknown transform kind {kind!r}; choose one of {list(get_args(TransformKind))}")
    builder = _BUILDERS[kind]
    accepted = set(builder.__kwdefaults__ or {})
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise TypeError(
            f"build_transform(kind={kind!r}) got unknown option(s) {unknown}; it accepts {sorted(accepted)}"
        )
    return builder(size, **options)


def _size_hw(size: Size) -> tuple[int, int]:
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        height = width = int(size)
    elif (
        isinstance(size, (tuple, list))
        and len(size) == 2
        and all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in size)
    ):
        height, width = int(size[0]), int(size[1])
    else:
        raise TypeError(f"size must be an int or a (height, width) pair of ints, got {size!r}")
    if height <= 0 or width <= 0:
        raise ValueError(f"size must be positive, got {size!r}")
    return height, width


def _validate_mean_std(
    mean: Sequence[float], std: Sequence[float]
) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    mean_t, std_t = tuple(float(m) for m in mean), tuple(float(s) for s in std)
    if len(mean_t) != 3 or len(std_t) != 3:
        raise ValueError(f"mean and std need one value per RGB channel, got mean={mean!r}, std={std!r}")
    if min(std_t) <= 0:
        raise ValueError(f"std values must be > 0, got {std!r}")
    return mean_t, std_t  # type: ignore[return-value]


def _check_range(name: str, value: tuple[float, float], low: float, high: float | None) -> None:
    lo, hi = value
    if not (low < lo <= hi and (high is None or hi <= high)):
        bound = f"{low} < min <= max" + (f" <= {high}" if high is not None else "")
        raise ValueError(f"{name} must satisfy {bound}, got {value!r}")


def _check_probability(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} is a probability in [0, 1], got {value}")


def _interpolation(antialias: bool) -> dict[str, Any]:
    return {"interpolation": cv2.INTER_CUBIC, "area_for_downscale": "image" if antialias else None}


def _random_resized_crop(
    height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float], antialias: bool
) -> A.RandomResizedCrop:
    return A.RandomResizedCrop(
        size=(height, width), scale=scale, ratio=ratio, p=1.0, **_interpolation(antialias)
    )


def _cover_resize(height: int, width: int, antialias: bool) -> A.SmallestMaxSize:
    """Keep aspect, smallest result with both sides >= (height, width)."""
    return A.SmallestMaxSize(max_size_hw=(height, width), p=1.0, **_interpolation(antialias))
