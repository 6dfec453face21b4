"""Write an in-memory split as an ImageFolder tree ``root/<split>/<class>/<index>.png``, idempotently.

Files already holding the right bytes are left alone (a rerun writes nothing, an interrupted one
completes); a tree from an export with other arguments is refused, since its files would leak val into train.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from vit5.data.digits.split import DIGIT_CLASSES, load_digits_split
from vit5.files import atomic_write_bytes


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
        return (
            f"{self.name} -> {self.root}: {totals} images; {self.written} written, {self.unchanged} unchanged"
        )


def write_image_tree(
    root: Path,
    splits: dict[str, Iterable[tuple[int, int, np.ndarray]]],
    classes: Sequence[str],
    digits: int,
    name: str = "digits",
) -> ExportReport:
    """Write ``splits[split]`` = ``(index, target, image)`` (RGB or grey uint8) as
    ``root/split/classes[target]/<index, digits wide>.png``.

    Raises:
        FileExistsError: ``root`` holds exported PNGs this export would not write.
    """
    plan: dict[Path, np.ndarray] = {}
    counts: dict[str, dict[str, int]] = {}
    for split, samples in splits.items():
        counts[split] = dict.fromkeys(classes, 0)
        for index, target, image in samples:
            plan[root / split / classes[target] / f"{index:0{digits}d}.png"] = image
            counts[split][classes[target]] += 1
    exported = re.compile(rf"^\d{{{digits}}}\.png$")
    folders = [root / split / c for split in splits for c in classes if (root / split / c).is_dir()]
    stale = sorted(p for d in folders for p in d.iterdir() if exported.match(p.name) and p not in plan)
    if stale:
        raise FileExistsError(
            f"{root} holds {len(stale)} image(s) this export would not write (e.g. {stale[0]}): an export "
            f"with other arguments; delete {root} or export to another folder"
        )
    written = 0
    for path, image in plan.items():
        ok, buffer = cv2.imencode(
            ".png", image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
        )
        if not ok:
            raise RuntimeError("OpenCV failed to encode a PNG")
        if path.is_file() and path.read_bytes() == buffer.tobytes():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, buffer.tobytes(), durable=False)
        written += 1
    return ExportReport(root, written, len(plan) - written, counts, name)


def export_digits_imagefolder(
    root: str | os.PathLike[str], size: int = 32, val_fraction: float = 0.2, seed: int = 0
) -> ExportReport:
    """Export the split of :func:`~vit5.data.digits.split.load_digits_split` as
    ``root/{train,val}/<digit>/<source index>.png``."""
    splits = {}
    for split in ("train", "val"):
        data = load_digits_split(split, size=size, val_fraction=val_fraction, seed=seed)
        splits[split] = zip(data.source_indices.tolist(), data.targets.tolist(), data.images)
    return write_image_tree(Path(root), splits, DIGIT_CLASSES, 4)
