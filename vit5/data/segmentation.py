"""Image + label-mask pairs in the ADE20K-style layout ``root/{images,annotations}/<split>/**/<name>``, each
mask (a PNG of class ids, 8/16-bit grey or palette) checked: one channel, its image's size, ids below
``num_classes`` or ``ignore_index``, else an :class:`InputError` naming the file. ``root/dataset.json`` (from
``make-seg``) may give class count and names; ``reduce_zero_label`` (ADE20K) ignores id 0, shifts the rest.
"""

from __future__ import annotations

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
    raise InputError(
        f"{root}/images has no train/val (or training/validation) folders (found {found}); name the splits"
    )


def dataset_info(
    root: str | os.PathLike[str],
    num_classes: int | None = None,
    ignore_index: int | None = None,
    reduce_zero_label: bool = False,
) -> SegDatasetInfo:
    """Class count and names from the arguments, else from ``root/dataset.json``."""
    meta_path = Path(root) / "dataset.json"
    meta = _checked_meta(read_json(meta_path), meta_path) if meta_path.is_file() else {}
    num_classes = num_classes or meta.get("num_classes")
    if not num_classes:
        raise InputError(f"give the number of classes (>= 2); {meta_path} does not say it")
    if type(num_classes) is not int or not 2 <= num_classes <= MAX_CLASSES:
        raise InputError(
            f"{num_classes!r} classes: the number of classes must be a whole number from 2 to "
            f"{MAX_CLASSES:,} (masks hold 8- or 16-bit class ids)"
        )
    names = meta.get("class_names") if meta.get("num_classes") == num_classes else None
    ignore_index = ignore_index if ignore_index is not None else meta.get("ignore_index", 255)
    if 0 <= ignore_index < num_classes:
        raise InputError(
            f"ignore_index {ignore_index} is a class id (0..{num_classes - 1}); choose e.g. 255 or -1"
        )
    return SegDatasetInfo(
        num_classes=num_classes,
        class_names=tuple(names or (str(i) for i in range(num_classes))),
        ignore_index=ignore_index,
        reduce_zero_label=reduce_zero_label,
    )


MAX_CLASSES = 65_536  # class ids are the values of an 8- or 16-bit mask PNG


def _checked_meta(meta: Any, path: Path) -> dict[str, Any]:
    """The fields of a ``dataset.json``, each range-checked: one error naming the file and the field."""

    def bad(field: str, value: Any, want: str) -> InputError:
        return InputError(f"{path}: {field} is {value!r}, but must be {want}; fix or delete the file")

    if not isinstance(meta, dict):
        raise InputError(f"{path} holds a {type(meta).__name__}, not an object of dataset fields")
    count = meta.get("num_classes")
    if count is not None and (type(count) is not int or not 2 <= count <= MAX_CLASSES):
        raise bad("num_classes", count, f"a whole number from 2 to {MAX_CLASSES:,}")
    names = meta.get("class_names")
    if names is not None and (
        not isinstance(names, list)
        or not all(isinstance(n, str) for n in names)
        or (count is not None and len(names) != count)
    ):
        raise bad("class_names", names if len(str(names)) < 80 else "...", f"a list of {count or 'N'} names")
    ignore = meta.get("ignore_index")
    if ignore is not None and (type(ignore) is not int or not -1 <= ignore <= MAX_CLASSES):
        raise bad("ignore_index", ignore, f"a whole number from -1 to {MAX_CLASSES:,}")
    return meta


def list_pairs(root: str | os.PathLike[str], split: str) -> list[tuple[Path, Path]]:
    """``(image, mask)`` paths of ``split``, sorted; a missing mask is an error naming the image."""
    image_dir, mask_dir = Path(root) / "images" / split, Path(root) / "annotations" / split
    for folder in (image_dir, mask_dir):
        if not folder.is_dir():
            raise InputError(
                f"{folder} does not exist; expected {root}/images/{split}/ and {root}/annotations/{split}/"
            )
    images = image_files(image_dir)
    if not images:
        raise InputError(f"{image_dir} holds no images")
    pairs = []
    for image in images:
        mask = (mask_dir / image.relative_to(image_dir)).with_suffix(".png")
        if not mask.is_file():
            raise InputError(
                f"image {image} has no label mask {mask} (masks are PNG files with the image's relative path)"
            )
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
            f"label mask {path} has {mask.shape[2]} channels; it must be a single-channel PNG of class ids "
            "(convert colour-coded masks to ids first)"
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
