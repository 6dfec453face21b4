"""Finding images, choosing input sizes and loading labelled images without crashing on bad files: an
unreadable file gives a placeholder with ``ok=False`` (never a neighbour counted twice, as the training
dataset does to keep batches even); the evaluation loops drop those rows and list the files as skipped."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset

from vit5.data import IMAGE_EXTENSIONS, BadImageError, decode_image, image_files
from vit5.errors import InputError
from vit5.layers.patch_embed import round_to_patch

Size = tuple[int, int]


def list_images(
    source: str | os.PathLike[str], extensions: Sequence[str] = IMAGE_EXTENSIONS
) -> tuple[Path, list[Path]]:
    """``(root, files)``: every image under folder ``source`` (recursive, sorted, hidden entries
    skipped), or ``source`` itself when it is a file (then ``root`` is its folder)."""
    source = Path(source)
    if source.is_file():
        return source.parent, [source]
    if not source.is_dir():
        raise InputError(f"image source {source} does not exist; pass an image file or a folder of images")
    files = image_files(source, extensions)
    if not files:
        raise InputError(
            f"no images with extensions {sorted({e.lower() for e in extensions})} under {source}"
        )
    return source, files


def own_size(image_hw: Size, patch_size: int, max_side: int | None = None) -> Size:
    """The input size that keeps an image's own size: shrunk (aspect kept) so that its longer side is
    at most ``max_side`` when given, then rounded to the patch size."""
    scale = 1.0 if max_side is None else min(1.0, max_side / max(image_hw))
    return round_to_patch((image_hw[0] * scale, image_hw[1] * scale), patch_size)


class LabelledImages(Dataset):
    """``(path, target)`` samples -> ``(image, target, index, ok)``; a bad file gives zeros, ``ok=False``."""

    def __init__(self, samples: Sequence[tuple[str, int]], transform: Callable, size: Size) -> None:
        self.samples = list(samples)
        self.transform = transform
        self.size = size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int, bool]:
        path, target = self.samples[index]
        try:
            return self.transform(decode_image(path)), target, index, True
        except BadImageError:
            return torch.zeros(3, *self.size), target, index, False


def bad_file_reason(path: str | os.PathLike[str]) -> str:
    """Why ``path`` cannot be decoded (decoded again, for the report)."""
    try:
        decode_image(path)
    except BadImageError as e:
        return e.reason
    return "could not be read during the run (readable now)"
