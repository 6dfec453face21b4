"""scikit-learn's 1797 real 8x8 handwritten digits (no download) as a seeded, stratified train/val split,
bicubically upscaled to ``size`` and replicated to RGB (what :func:`vit5.data.decode_image` gives for a
file): arrays, a torch Dataset, or an ImageFolder tree of PNG files (``vit5 data digits``)."""

import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import Dataset

from vit5.files import atomic_write_bytes

DIGIT_CLASSES: tuple[str, ...] = tuple(str(d) for d in range(10))
DigitsSplitName = Literal["train", "val"]


@dataclass(frozen=True)
class DigitsSplit:
    """``images`` (N, size, size, 3) uint8 RGB, ``targets`` (N,) int64, ``source_indices`` (N,) positions in
    ``load_digits()`` (stable ids, used as file names)."""

    images: np.ndarray
    targets: np.ndarray
    source_indices: np.ndarray


def load_digits_split(
    split: DigitsSplitName, size: int = 32, val_fraction: float = 0.2, seed: int = 0
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
    chosen = stratified_split(targets, num_val, seed)[split == "val"]
    scaled = (digits.images[chosen] * (255.0 / 16.0)).astype(np.float32)
    resized = np.stack([cv2.resize(d, (size, size), interpolation=cv2.INTER_CUBIC) for d in scaled])
    gray = np.rint(resized).clip(0, 255).astype(np.uint8)
    return DigitsSplit(np.repeat(gray[..., None], 3, axis=3), targets[chosen], chosen)


def stratified_split(targets: np.ndarray, num_val: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted train and val positions of ``targets``, ``num_val`` in val, class-stratified, fixed by seed."""
    positions = np.arange(len(targets))
    parts = train_test_split(positions, test_size=num_val, stratify=targets, random_state=seed)
    return np.sort(parts[0]), np.sort(parts[1])


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
        self.class_names = list(DIGIT_CLASSES)
        self.class_to_idx = {name: i for i, name in enumerate(self.class_names)}

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image = self.images[index]
        sample = self.transform(image) if self.transform is not None else image.copy()
        return sample, self.targets[index]

    def __repr__(self) -> str:
        size = self.images.shape[1]
        return f"{type(self).__name__}(split={self.split!r}, samples={len(self)}, size={size})"


@dataclass(frozen=True)
class ExportReport:
    """What an export did; ``counts[split][class]`` = number of images."""

    root: Path
    written: int
    unchanged: int
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    name: str = "digits"

    def __str__(self) -> str:
        totals = ", ".join(f"{split} {sum(c.values())}" for split, c in self.counts.items())
        files = f"{self.written} written, {self.unchanged} unchanged"
        return f"{self.name} -> {self.root}: {totals} images; {files}"


def write_pngs(root: Path, plan: dict[Path, np.ndarray], digits: int) -> int:
    """Write each ``plan`` image (RGB or grey uint8) as a PNG unless its file holds those bytes already (a
    rerun writes nothing, an interrupted one completes); the number written. A ``<digits digits>.png`` in a
    planned folder that ``plan`` lacks is a ``FileExistsError``: an export with other arguments."""
    exported = re.compile(rf"^\d{{{digits}}}\.png$")
    folders = {path.parent for path in plan if path.parent.is_dir()}
    present = (p for d in folders for p in d.iterdir())
    stale = sorted(p for p in present if exported.match(p.name) and p not in plan)
    if stale:
        raise FileExistsError(
            f"{root} holds {len(stale)} image(s) this export would not write (e.g. {stale[0]}): "
            f"an export with other arguments; delete {root} or export to another folder"
        )
    written = 0
    for path, image in plan.items():
        ok, buffer = cv2.imencode(
            ".png", image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
        )
        if not ok:
            raise RuntimeError(f"OpenCV failed to encode {path}")
        if not (path.is_file() and path.read_bytes() == buffer.tobytes()):
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, buffer.tobytes(), durable=False)
            written += 1
    return written


def write_image_tree(
    root: Path,
    splits: dict[str, Iterable[tuple[int, int, np.ndarray]]],
    classes: Sequence[str],
    digits: int,
    name: str = "digits",
) -> ExportReport:
    """Write ``splits[split]`` = ``(index, target, image)`` as ``root/split/classes[target]/<index>.png``
    (:func:`write_pngs`)."""
    plan: dict[Path, np.ndarray] = {}
    counts: dict[str, dict[str, int]] = {}
    for split, samples in splits.items():
        counts[split] = dict.fromkeys(classes, 0)
        for index, target, image in samples:
            plan[root / split / classes[target] / f"{index:0{digits}d}.png"] = image
            counts[split][classes[target]] += 1
    written = write_pngs(root, plan, digits)
    return ExportReport(root, written, len(plan) - written, counts, name)


def export_digits_imagefolder(
    root: str | os.PathLike[str], size: int = 32, val_fraction: float = 0.2, seed: int = 0
) -> ExportReport:
    """Export the :func:`load_digits_split` split as ``root/{train,val}/<digit>/<source index>.png``."""
    splits = {}
    for split in ("train", "val"):
        data = load_digits_split(split, size=size, val_fraction=val_fraction, seed=seed)
        splits[split] = zip(data.source_indices.tolist(), data.targets.tolist(), data.images)
    return write_image_tree(Path(root), splits, DIGIT_CLASSES, 4)
