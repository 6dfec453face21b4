"""Tiny ImageFolder trees whose every image says which sample it is, and their shards."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import cv2
import numpy as np
import torch

from vit5.data import ShardDataset, build_transform


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


class RecordingTransform:
    """``inner`` (a vit5 transform), noting ``epoch index`` of every image it sees in
    ``folder/<role>-<loader worker>-<pid>.txt``; ``position`` is the data set's shared (epoch, skip)."""

    def __init__(self, inner, role: str, folder: Path) -> None:
        self.inner, self.role, self.folder, self.position = inner, role, Path(folder), None

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        info = torch.utils.data.get_worker_info()
        name = f"{self.role}-{info.id if info is not None else 0}-{os.getpid()}.txt"
        with open(self.folder / name, "a") as f:
            f.write(f"{int(self.position[0])} {index_of(image)}\n")
        return self.inner(image)


def recording_shards(
    shards: Path, role: str, folder: Path, batch_size: int, **options
) -> ShardDataset:
    """A :class:`ShardDataset` of ``shards/role`` whose transform is a :class:`RecordingTransform`."""
    transform = RecordingTransform(
        build_transform("none" if role == "train" else "eval", 16), role, folder
    )
    dataset = ShardDataset(
        shards / role, transform, batch_size=batch_size, train=role == "train", **options
    )
    transform.position = dataset._position
    return dataset


def read_records(folder: Path, role: str) -> Counter:
    """``Counter((epoch, index))`` of what :class:`RecordingTransform` noted in ``folder``."""
    lines = [
        line for f in Path(folder).glob(f"{role}-*.txt") for line in f.read_text().splitlines()
    ]
    return Counter(tuple(int(v) for v in line.split()) for line in lines)
