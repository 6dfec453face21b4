"""In-memory torch Dataset over the built-in digits split (no files, no download)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from vit5.data.digits.split import DIGIT_CLASSES, DigitsSplitName, load_digits_split


class DigitsDataset(Dataset):
    """Digits split with the same interface as :class:`~vit5.data.folder.ImageFolderDataset`.

    ``transform`` receives the RGB uint8 (size, size, 3) array, exactly like a decoded file, so
    any :func:`~vit5.data.transforms.build_transform` pipeline (or ``None`` for the raw array)
    works; use ``"none"`` or ``"eval"`` to switch augmentation off.
    """

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
