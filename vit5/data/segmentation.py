"""Image + mask pairs in the ADE20K layout ``root/{images,annotations}/<split>/**/<name>``, each mask (PNG of
class ids) checked, else an :class:`InputError` naming the file; ``root/dataset.json`` may give class count
and names; ``reduce_zero_label`` (ADE20K) ignores id 0 and shifts the rest."""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vit5.data import image_files
from vit5.data.decode import BadImageError, check_pixels
from vit5.errors import InputError
from vit5.files import read_json

SPLIT_PAIRS = (("train", "val"), ("training", "validation"))


@dataclass(frozen=True)
class SegDatasetInfo:
    num_classes: int
    class_names: tuple[str, ...]
    ignore_index: int = 255
    reduce_zero_label: bool = False


def default_splits(root: str | os.PathLike[str]) -> tuple[str, str]:
    """``(train, val)`` split names found under ``root/images``."""
    for pair in SPLIT_PAIRS:
        if all((Path(root) / "images" / s).is_dir() for s in pair):
            return pair
    found = sorted(p.name for p in (Path(root) / "images").glob("*") if p.is_dir())
    wanted = "train/val (or training/validation) folders"
    raise InputError(f"{root}/images has no {wanted} (found {found}); name the splits")


MAX_CLASSES = 65_536  # class ids are the values of an 8- or 16-bit mask PNG


def _whole(value: Any, low: int) -> bool:
    return type(value) is int and low <= value <= MAX_CLASSES


def dataset_info(
    root: str | os.PathLike[str],
    num_classes: int | None = None,
    ignore_index: int | None = None,
    reduce_zero_label: bool = False,
) -> SegDatasetInfo:
    """Class count and names from the arguments, else from ``root/dataset.json`` (each field checked)."""
    meta_path = Path(root) / "dataset.json"
    meta = read_json(meta_path) if meta_path.is_file() else {}
    if not isinstance(meta, dict):
        kind = type(meta).__name__
        raise InputError(f"{meta_path} holds a {kind}, not an object of dataset fields")
    count = meta.get("num_classes")
    names = meta.get("class_names")
    rules = (
        ("num_classes", _whole(count, 2), f"a whole number from 2 to {MAX_CLASSES:,}"),
        (
            "class_names",
            isinstance(names, list)
            and all(isinstance(n, str) for n in names)
            and count in (None, len(names)),
            f"a list of {count or 'N'} names",
        ),
        (
            "ignore_index",
            _whole(meta.get("ignore_index"), -1),
            f"a whole number from -1 to {MAX_CLASSES:,}",
        ),
    )
    for field, ok, want in rules:
        if meta.get(field) is not None and not ok:
            shown = meta[field] if len(str(meta[field])) < 80 else "..."
            raise InputError(
                f"{meta_path}: {field} is {shown!r}, but must be {want}; fix or delete the file",
            )
    num_classes = num_classes or count
    if not num_classes:
        raise InputError(f"give the number of classes (>= 2); {meta_path} does not say it")
    if not _whole(num_classes, 2):
        raise InputError(
            f"{num_classes!r} classes: the number of classes must be a whole number from 2 to "
            f"{MAX_CLASSES:,} (masks hold 8- or 16-bit class ids)"
        )
    ignore_index = ignore_index if ignore_index is not None else meta.get("ignore_index", 255)
    if 0 <= ignore_index < num_classes:
        problem = f"ignore_index {ignore_index} is a class id (0..{num_classes - 1})"
        raise InputError(f"{problem}; choose e.g. 255 or -1")
    if count != num_classes or not names:
        # the file's names describe another class count: number the classes instead
        names = [str(i) for i in range(num_classes)]
    return SegDatasetInfo(
        num_classes=num_classes,
        class_names=tuple(names),
        ignore_index=ignore_index,
        reduce_zero_label=reduce_zero_label,
    )


def list_pairs(root: str | os.PathLike[str], split: str) -> list[tuple[Path, Path]]:
    """``(image, mask)`` paths of ``split``, sorted; a missing mask is an error naming the image."""
    image_dir = Path(root) / "images" / split
    mask_dir = Path(root) / "annotations" / split
    expected = f"{root}/images/{split}/ and {root}/annotations/{split}/"
    for folder in (image_dir, mask_dir):
        if not folder.is_dir():
            raise InputError(f"{folder} does not exist; expected {expected}")
    images = image_files(image_dir)
    if not images:
        raise InputError(f"{image_dir} holds no images")
    pairs = []
    for image in images:
        mask = (mask_dir / image.relative_to(image_dir)).with_suffix(".png")
        if not mask.is_file():
            hint = "masks are PNG files with the image's relative path"
            raise InputError(f"image {image} has no label mask {mask} ({hint})")
        pairs.append((image, mask))
    return pairs


def read_mask(path: Path, image_hw: tuple[int, int], info: SegDatasetInfo) -> np.ndarray:
    """The checked mask as int64 class ids, ignored pixels ``info.ignore_index`` (read with PIL: stored values
    of grey PNGs and palette indices of palette PNGs, never colours)."""
    try:
        with Image.open(path) as handle:
            check_pixels(path, *handle.size)
            mask = np.asarray(handle)
    except BadImageError as err:
        raise InputError(f"label mask {path} {err.reason}") from err
    except (OSError, ValueError) as err:
        raise InputError(f"label mask {path} cannot be read as an image ({err})") from err
    if mask.ndim != 2:
        raise InputError(
            f"label mask {path} has {mask.shape[2]} channels; "
            "it must be a single-channel PNG of class ids (convert colour-coded masks to ids first)"
        )
    if tuple(mask.shape) != tuple(image_hw):
        raise InputError(
            f"label mask {path} is {mask.shape[0]}x{mask.shape[1]} but its image is "
            f"{image_hw[0]}x{image_hw[1]}; masks must have the size of their image"
        )
    mask = mask.astype(np.int64)
    ignored = mask == info.ignore_index
    if info.reduce_zero_label:
        ignored |= mask == 0
        mask = mask - 1
    bad = np.unique(mask[~ignored & ((mask < 0) | (mask >= info.num_classes))])
    if bad.size:
        shown = (bad + 1 if info.reduce_zero_label else bad)[:10].tolist()
        raise InputError(
            f"label mask {path} has class id(s) {shown} outside 0..{info.num_classes - 1} "
            f"(ignore index {info.ignore_index}); raise num_classes or fix the mask"
        )
    mask[ignored] = info.ignore_index
    return mask
