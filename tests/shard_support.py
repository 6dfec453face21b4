"""Tiny ImageFolder trees whose every image says which sample it is, and their shards."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import torch


def write_indexed_folder(split: Path, count: int, classes: int = 3) -> list[tuple[int, int]]:
    """``split/c<k>/<i>.png`` for i < count (class i % classes): 16x16 PNGs whose pixel (0, 0) holds
    ``i`` as (i % 256, i // 256, 0). Returns ``[(index, label)]``."""
    for i in range(count):
        image = np.zeros((16, 16, 3), np.uint8)
        image[..., 0], image[..., 1] = i % 256, i // 256
        path = split / f"c{i % classes}" / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(path), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    return [(i, i % classes) for i in range(count)]


def index_of(image: np.ndarray) -> int:
    """The sample index a :func:`write_indexed_folder` image carries (decoded RGB uint8)."""
    return int(image[0, 0, 0]) + 256 * int(image[0, 0, 1])


class IndexTransform:
    """A transform that returns the sample index as a 0-d tensor (batches collate into index vectors)."""

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        return torch.tensor(index_of(image))
