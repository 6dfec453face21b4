"""scikit-learn's 1797 real 8x8 handwritten digits (no download) as a seeded, stratified train/val split,
bicubically upscaled to ``size`` and replicated to RGB (what :func:`vit5.data.decode_image` gives for a
file), in memory as arrays or as a torch Dataset."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import cv2
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import Dataset

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
    """``split`` of the digits: disjoint train/val covering all images, stratified by class, fixed by
    ``seed``, ordered by ``source_indices``."""
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


class DigitsDataset(Dataset):
    """A digits split with the interface of :class:`~vit5.data.folder.ImageFolderDataset`; ``transform``
    receives the RGB uint8 array like a decoded file (``None``: the array itself)."""

    def __init__(
        self,
        split: DigitsSplitName = "train",
        transform: Callable[[np.ndarray], Any] | None = None,
        *,
        size: int = 32,
        val_fraction: float = 0.2,
        seed: int = 0,
    ) -> None:
        data = load_digits_split(split, size=size, val_fraction=val_fraction, seed=seed)
        self.split = split
        self.transform = transform
        self.images = data.images
        self.targets: list[int] = data.targets.tolist()
        self.source_indices = data.source_indices
        self.class_names = list(DIGIT_CLASSES)
        self.class_to_idx = {name: i for i, name in enumerate(self.class_names)}

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image = self.images[index]
        return (self.transform(image) if self.transform is not None else image.copy()), self.targets[index]

    def __repr__(self) -> str:
        size = self.images.shape[1]
        return f"{type(self).__name__}(split={self.split!r}, samples={len(self)}, size={size})"
