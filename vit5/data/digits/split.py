"""The scikit-learn handwritten digits as a seeded, stratified, upscaled train/val split.

``sklearn.datasets.load_digits`` ships 1797 real 8x8 digits (values 0..16) inside scikit-learn,
so the toolkit has a real classification set with no download. Images are scaled to 0..255,
upscaled with bicubic interpolation to ``size`` (e.g. 32 = a 2x2 grid of 16-px patches) and
replicated to RGB, matching what :func:`vit5.data.decode.decode_image` returns for a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import cv2
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

DIGIT_CLASSES: tuple[str, ...] = tuple(str(d) for d in range(10))
DigitsSplitName = Literal["train", "val"]
_MAX_VALUE = 16.0


@dataclass(frozen=True)
class DigitsSplit:
    """One split: ``images`` (N, size, size, 3) uint8 RGB, ``targets`` (N,) int64, and
    ``source_indices`` (N,) positions in ``load_digits()`` (stable ids, used as file names)."""

    images: np.ndarray
    targets: np.ndarray
    source_indices: np.ndarray


def load_digits_split(
    split: DigitsSplitName,
    size: int = 32,
    val_fraction: float = 0.2,
    seed: int = 0,
) -> DigitsSplit:
    """Return ``split`` of the digits set; the split is stratified by class and fixed by ``seed``.

    Train and val are disjoint and together cover all 1797 images; samples are ordered by
    ``source_indices``.
    """
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 8:
        raise ValueError(f"size must be an int >= 8 (the source digits are 8x8), got {size!r}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    digits = load_digits()
    targets = digits.target.astype(np.int64)
    num_val = round(len(targets) * val_fraction)
    if not len(DIGIT_CLASSES) <= num_val <= len(targets) - len(DIGIT_CLASSES):
        raise ValueError(
            f"val_fraction={val_fraction} puts {num_val} of {len(targets)} images in val; "
            f"each split needs at least one image per class ({len(DIGIT_CLASSES)})"
        )
    train_idx, val_idx = train_test_split(
        np.arange(len(targets)), test_size=num_val, stratify=targets, random_state=seed
    )
    chosen = np.sort(train_idx if split == "train" else val_idx)
    images = np.stack([_upscale(digits.images[i], size) for i in chosen])
    return DigitsSplit(images=images, targets=targets[chosen], source_indices=chosen)


def _upscale(digit: np.ndarray, size: int) -> np.ndarray:
    scaled = (digit * (255.0 / _MAX_VALUE)).astype(np.float32)
    gray = cv2.resize(scaled, (size, size), interpolation=cv2.INTER_CUBIC)
    gray = np.rint(gray).clip(0, 255).astype(np.uint8)
    return np.repeat(gray[:, :, None], 3, axis=2)
