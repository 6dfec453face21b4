"""Write the digits split as an ImageFolder tree: ``root/{train,val}/<digit>/<source index>.png``.

Re-running with the same arguments rewrites nothing (files are compared byte for byte), so the
export is idempotent and cheap to call before every run. A tree produced with a different seed
or ``val_fraction`` is refused rather than merged, because stale files would leak val images
into train.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from vit5.data.digits.split import DIGIT_CLASSES, load_digits_split
from vit5.files import atomic_write_bytes

SPLITS = ("train", "val")
_EXPORTED_NAME = re.compile(r"^\d{4}\.png$")


@dataclass(frozen=True)
class ExportReport:
    """What :func:`export_digits_imagefolder` did; ``counts[split][class]`` = number of images."""

    root: Path
    written: int
    unchanged: int
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def __str__(self) -> str:
        totals = ", ".join(f"{split} {sum(c.values())}" for split, c in self.counts.items())
        return f"digits -> {self.root}: {totals} images; {self.written} written, {self.unchanged} unchanged"


def export_digits_imagefolder(
    root: str | os.PathLike[str],
    size: int = 32,
    val_fraction: float = 0.2,
    seed: int = 0,
) -> ExportReport:
    """Export the split of :func:`~vit5.data.digits.split.load_digits_split` as PNG files.

    Raises:
        FileExistsError: ``root`` holds digit PNGs that this split would not write (an export
            with other arguments); delete ``root`` or pick another one.
    """
    root = Path(root)
    plan: dict[Path, bytes] = {}
    counts: dict[str, dict[str, int]] = {}
    for split in SPLITS:
        data = load_digits_split(split, size=size, val_fraction=val_fraction, seed=seed)
        counts[split] = {name: 0 for name in DIGIT_CLASSES}
        for image, target, source in zip(data.images, data.targets, data.source_indices):
            name = DIGIT_CLASSES[target]
            plan[root / split / name / f"{source:04d}.png"] = _encode_png(image)
            counts[split][name] += 1
    stale = sorted(p for p in _existing_exports(root) if p not in plan)
    if stale:
        raise FileExistsError(
            f"{root} holds {len(stale)} digit image(s) from an export with other arguments "
            f"(e.g. {stale[0]}); delete {root} or export to another folder."
        )
    written = 0
    for path, payload in plan.items():
        if path.is_file() and path.read_bytes() == payload:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, payload, durable=False)
        written += 1
    return ExportReport(root=root, written=written, unchanged=len(plan) - written, counts=counts)


def _encode_png(rgb: np.ndarray) -> bytes:
    ok, buffer = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    if not ok:
        raise RuntimeError("OpenCV failed to encode a PNG")
    return buffer.tobytes()


def _existing_exports(root: Path) -> list[Path]:
    return [
        path
        for split in SPLITS
        for name in DIGIT_CLASSES
        if (root / split / name).is_dir()
        for path in (root / split / name).iterdir()
        if _EXPORTED_NAME.match(path.name)
    ]
