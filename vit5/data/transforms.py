"""Train and eval transforms (albumentations): RGB uint8 HxWx3 array in, normalised float32 CHW tensor out.
Bicubic as the official recipe; ``antialias=True`` downscales with ``INTER_AREA`` (close to PIL's antialiased
bicubic; OpenCV's bicubic does not low-pass)."""

import random
from collections.abc import Sequence
from typing import Any, Literal, get_args

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2
from PIL import Image
from timm.data import auto_augment, rand_augment_transform

from vit5.errors import Rule, rule_problems

# timm.data's IMAGENET_DEFAULT_MEAN/STD (vit5.model uses those): vit5.data imports no timm, to stay light
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)
DEFAULT_RANDAUG_POLICY = "rand-m9-mstd0.5-inc1"

TransformKind = Literal["three_augment", "randaug", "rrc", "pad_crop", "eval", "none"]
# random erasing (Zhong et al., arXiv 1708.04896): area 2-33 %, aspect 0.3-3.3, random noise as their RE-R
ERASING_SCALE = (0.02, 0.33)
ERASING_RATIO = (0.3, 3.3)
Size = int | tuple[int, int]
_BICUBIC: dict[str, Any] = {"interpolation": cv2.INTER_CUBIC, "area_for_downscale": "image"}
# eval with antialias=False: OpenCV's bicubic downscaling too
_ALIASED = {"area_for_downscale": None}
_PROBABILITY = "a probability in [0, 1]"
_RANDAUG_STRING = f"a timm RandAugment string such as {DEFAULT_RANDAUG_POLICY!r}"
# One rule per argument, so a builder checks only the arguments it takes.
_RULES: dict[str, Rule] = {
    rule.names: rule
    for rule in (
        Rule("hflip", lambda v: 0 <= v <= 1, _PROBABILITY),
        Rule("erasing", lambda v: 0 <= v <= 1, _PROBABILITY),
        Rule("color_jitter", lambda v: v >= 0, ">= 0 (0 disables it)"),
        Rule("padding", lambda v: v >= 0, ">= 0 pixels"),
        Rule(
            "crop_ratio",
            lambda v: 0 < v <= 1,
            "in (0, 1] (1.0 = official ViT-5 eval, 0.875 = classic)",
        ),
        Rule("scale", lambda v: 0 < v[0] <= v[1] <= 1, "(min, max) with 0 < min <= max <= 1"),
        Rule("ratio", lambda v: 0 < v[0] <= v[1], "(min, max) with 0 < min <= max"),
        Rule("policy", lambda v: v.startswith("rand-"), _RANDAUG_STRING),
        Rule("mean", lambda v: len(v) == 3, "one value per RGB channel"),
        Rule("std", lambda v: len(v) == 3 and min(v) > 0, "one value > 0 per RGB channel"),
    )
}


def _check(**values: Any) -> None:
    """Raise a ``ValueError`` naming the first of ``values`` that breaks its rule."""
    problems = rule_problems(values, [_RULES[name] for name in values])
    if problems:
        raise ValueError(problems[0])


class ImageTransform:
    """``(H, W, 3) uint8 RGB -> (3, h, w) float32``: ``steps``, normalise, to tensor. Each call seeds the
    steps from torch's global RNG (workers differ and follow the loader seed; albumentations 2.0 alone gives
    forked workers identical states and every step the same seed)."""

    def __init__(
        self,
        steps: Sequence[Any],
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
    ) -> None:
        _check(mean=mean, std=std)
        normalize = A.Normalize(mean=tuple(mean), std=tuple(std), max_pixel_value=255.0)
        self.pipeline = A.Compose([*steps, normalize, ToTensorV2()])

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        seed = int(torch.empty((), dtype=torch.int64).random_())
        numpy_rng = np.random.default_rng(seed)
        self.pipeline.set_random_state(numpy_rng, random.Random(seed))
        return self.pipeline(image=image)["image"]

    def __repr__(self) -> str:
        return f"ImageTransform({self.pipeline!r})"


class TimmRandAugment(A.ImageOnlyTransform):
    """``timm.data.rand_augment_transform(policy)`` unchanged (through PIL), with timm ``create_transform``'s
    hyper-parameters: translation ``0.45 * min(size)`` px, fill = the normalisation mean, bicubic. It draws
    from Python's ``random`` and NumPy's global RNG (seeded per worker)."""

    def __init__(
        self,
        policy: str,
        size: tuple[int, int],
        mean: Sequence[float],
        p: float = 1.0,
    ) -> None:
        super().__init__(p=p)
        self.policy = policy
        self.size = size
        self.mean = mean
        hparams = {
            "translate_const": int(min(size) * 0.45),
            "img_mean": tuple(min(255, round(255 * m)) for m in mean),
            "interpolation": Image.BICUBIC,
        }
        self._randaugment = rand_augment_transform(policy, hparams)
        for op in self._randaugment.ops:
            if op.aug_fn is auto_augment.posterize:
                op.aug_fn = posterize

    def apply(self, img: np.ndarray, **params: Any) -> np.ndarray:
        return np.asarray(self._randaugment(Image.fromarray(img)))

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("policy", "size", "mean")


def posterize(img: Image.Image, bits_to_keep: int, **kwargs: Any) -> Image.Image:
    """timm's posterize, keeping 0 bits as Pillow < 13 did (a black image) where Pillow 13 raises ``bits
    must be between or equal to 1 and 8`` (RandAugment's increasing posterize at magnitude 10)."""
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    return auto_augment.posterize(img, bits_to_keep, **kwargs)


def three_augment(
    size: Size,
    *,
    color_jitter: float = 0.3,
    simple_random_crop: bool = False,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    hflip: float = 0.5,
) -> ImageTransform:
    """DeiT-III 3-Augment (arXiv 2204.07118; official ``augment.py:90``, github.com/wangf3014/ViT-5 b7b0796):
    RandomResizedCrop (``simple_random_crop``: DeiT-III's ``--src`` resize, reflect-pad 4, crop) + flip, one
    of {grayscale, solarize, Gaussian blur sigma ~ U(0.1, 2)}, ColorJitter(``color_jitter``, no hue)."""
    _check(color_jitter=color_jitter)
    height, width, crop_flip = _crop_flip(size, scale, ratio, hflip)
    if simple_random_crop:
        crop_flip[0:1] = [
            A.SmallestMaxSize(max_size_hw=(height, width), p=1.0, **_BICUBIC),
            A.Pad(padding=4, border_mode=cv2.BORDER_REFLECT_101),
            A.RandomCrop(height, width),
        ]
    one_of = [
        A.ToGray(num_output_channels=3, method="weighted_average", p=1.0),
        # inverts v >= 0.5 * 255, i.e. v >= 128 like PIL
        A.Solarize(threshold_range=(0.5, 0.5), p=1.0),
        # the kernel from sigma, as PIL's
        A.GaussianBlur(blur_limit=0, sigma_limit=(0.1, 2.0), p=1.0),
    ]
    steps = [*crop_flip, A.OneOf(one_of, p=1.0)]
    if color_jitter > 0:
        c = color_jitter
        steps.append(A.ColorJitter(brightness=c, contrast=c, saturation=c, hue=0.0, p=1.0))
    return ImageTransform(steps)


def randaug_transform(
    size: Size,
    *,
    policy: str = DEFAULT_RANDAUG_POLICY,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    hflip: float = 0.5,
) -> ImageTransform:
    """ViT-5 fine-tuning: RRC + flip + timm RandAugment ``policy`` (as timm's ``create_transform`` with
    ``auto_augment``: no colour jitter, no random erasing)."""
    _check(policy=policy)
    height, width, crop_flip = _crop_flip(size, scale, ratio, hflip)
    randaugment = TimmRandAugment(policy, (height, width), IMAGENET_MEAN)
    return ImageTransform([*crop_flip, randaugment])


def rrc_transform(
    size: Size,
    *,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    hflip: float = 0.5,
    erasing: float = 0.0,
) -> ImageTransform:
    """Crop and flip only: RandomResizedCrop(``scale``, ``ratio``, bicubic) + flip, then random erasing
    with probability ``erasing``; timm's training transform without colour jitter or auto-augment
    (``timm.data.create_transform(is_training=True, color_jitter=None)``), e.g. for small grey images."""
    _check(erasing=erasing)
    height, width, crop_flip = _crop_flip(size, scale, ratio, hflip)
    return ImageTransform([*crop_flip, *_erasing(erasing)])


def pad_crop_transform(
    size: Size,
    *,
    padding: int = 4,
    hflip: float = 0.5,
    erasing: float = 0.25,
) -> ImageTransform:
    """Small framed images (Fashion-MNIST, CIFAR): resize, reflect-pad ``padding`` px, random crop, flip, then
    random erasing with probability ``erasing`` (Zhong et al., arXiv 1708.04896: area 2-33 %, aspect 0.3-3.3,
    random noise as their RE-R). No colour changes: grey intensity carries the class."""
    height, width = _size_hw(size)
    _check(hflip=hflip, erasing=erasing, padding=padding)
    steps: list[A.BasicTransform] = [A.Resize(height, width, **_BICUBIC)]
    if padding:
        steps.append(A.Pad(padding=padding, border_mode=cv2.BORDER_REFLECT_101))
        steps.append(A.RandomCrop(height, width))
    steps.append(A.HorizontalFlip(p=hflip))
    return ImageTransform([*steps, *_erasing(erasing)])


def eval_transform(
    size: Size,
    *,
    crop_ratio: float = 1.0,
    antialias: bool = True,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> ImageTransform:
    """Evaluation (official ``datasets.py:101-105`` at b7b0796, ``--eval-crop-ratio``, 1.0 in ViT-5): resize,
    keeping aspect, to the smallest image covering ``(int(h / crop_ratio), int(w / crop_ratio))``; centre
    crop."""
    height, width = _size_hw(size)
    _check(crop_ratio=crop_ratio)
    cover = (int(height / crop_ratio), int(width / crop_ratio))
    interpolation = _BICUBIC if antialias else {**_BICUBIC, **_ALIASED}
    resize = A.SmallestMaxSize(max_size_hw=cover, p=1.0, **interpolation)
    return ImageTransform([resize, A.CenterCrop(height, width)], mean, std)


def resize_transform(
    size: Size, *, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD
) -> ImageTransform:
    """No augmentation: resize to exactly ``size`` (aspect not kept), for already framed data (digits)."""
    return ImageTransform([A.Resize(*_size_hw(size), **_BICUBIC)], mean, std)


_BUILDERS = {
    "three_augment": three_augment,
    "randaug": randaug_transform,
    "rrc": rrc_transform,
    "pad_crop": pad_crop_transform,
    "eval": eval_transform,
    "none": resize_transform,
}


def build_transform(kind: TransformKind, size: Size, **options: Any) -> ImageTransform:
    """The builder of ``kind`` (``"none"``: :func:`resize_transform`) called with ``options``."""
    if kind not in _BUILDERS:
        kinds = list(get_args(TransformKind))
        raise ValueError(f"unknown transform kind {kind!r}; choose one of {kinds}")
    return _BUILDERS[kind](size, **options)


def _size_hw(size: Size) -> tuple[int, int]:
    pair = (size, size) if not isinstance(size, (tuple, list)) else tuple(size)
    whole = all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in pair)
    if len(pair) != 2 or not whole:
        raise TypeError(f"size must be an int or a (height, width) pair of ints, got {size!r}")
    if min(pair) <= 0:
        raise ValueError(f"size must be positive, got {size!r}")
    return int(pair[0]), int(pair[1])


def _erasing(probability: float) -> list[A.BasicTransform]:
    """Random erasing with ``probability`` (none at 0)."""
    if probability == 0:
        return []
    erasing = A.Erasing(scale=ERASING_SCALE, ratio=ERASING_RATIO, fill="random", p=probability)
    return [erasing]


def _crop_flip(
    size: Size, scale: tuple[float, float], ratio: tuple[float, float], hflip: float
) -> tuple[int, int, list[A.BasicTransform]]:
    """``(height, width, [RandomResizedCrop(scale, ratio, bicubic), HorizontalFlip(hflip)])``, checked."""
    height, width = _size_hw(size)
    _check(scale=scale, ratio=ratio, hflip=hflip)
    rrc = A.RandomResizedCrop(size=(height, width), scale=scale, ratio=ratio, p=1.0, **_BICUBIC)
    return height, width, [rrc, A.HorizontalFlip(p=hflip)]
