"""What every evaluation shares: the images and their input size (an unreadable file gives a
placeholder with ``ok=False``, never a neighbour counted twice; the loops list it as skipped) and the
dense features of a batch (timm's ``forward_intermediates`` contract). The models come from
:mod:`vit5.introspect.load`; tables and JSON from :mod:`vit5.outputs`."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from vit5.data import (
    IMAGE_EXTENSIONS,
    BadImageError,
    build_loader,
    decode_image,
    eval_transform,
    image_files,
)
from vit5.errors import InputError, Rule, rule_problems
from vit5.introspect import ModelInfo
from vit5.introspect.load import LoadedModel
from vit5.layers.patch_embed import round_to_patch
from vit5.model.footprint import BIG_TOKEN_COUNT, forward_bytes
from vit5.runtime import check_fits

Size = tuple[int, int]
# the fix a size error names in eval (it takes --size HxW)
EVAL_FIX = "use e.g. {h}x{w}"


def check_settings(settings: Any, rules: Sequence[Rule]) -> None:
    """Validate a settings dataclass once, at construction: the first problem under ``rules``
    (:func:`vit5.errors.rule_problems`) is one InputError."""
    names = {name for rule in rules for name in rule.names.split()}
    problems = rule_problems({name: getattr(settings, name) for name in names}, rules)
    if problems:
        raise InputError(problems[0])


def list_images(source: str | os.PathLike[str]) -> tuple[Path, list[Path]]:
    """``(root, files)``: the images under folder ``source`` (recursive, sorted, no hidden), or
    one file."""
    source = Path(source)
    if source.is_file():
        return source.parent, [source]
    if not source.is_dir():
        raise InputError(
            f"image source {source} does not exist; pass an image file or a folder of images",
        )
    files = image_files(source)
    if not files:
        extensions = sorted({e.lower() for e in IMAGE_EXTENSIONS})
        raise InputError(f"no images with extensions {extensions} under {source}")
    return source, files


def own_size(image_hw: Size, patch_size: int, max_side: int | None = None) -> Size:
    """An image's own size, shrunk (aspect kept) to a longer side <= ``max_side``,
    patch-rounded."""
    scale = 1.0 if max_side is None else min(1.0, max_side / max(image_hw))
    scaled = (image_hw[0] * scale, image_hw[1] * scale)
    return round_to_patch(scaled, patch_size)


class LabelledImages(Dataset):
    """``(path, target)`` samples -> ``(image, target, index, ok)``; a bad file gives zeros,
    ``ok=False``."""

    def __init__(self, samples: Sequence[tuple[str, int]], transform, size: Size) -> None:
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


def labelled_loader(
    loaded: LoadedModel,
    samples,
    size: Size,
    crop_ratio: float | None,
    batch_size: int,
    workers: int,
) -> DataLoader:
    """Batches of :class:`LabelledImages` in the eval preprocessing of ``loaded`` (its crop by
    default)."""
    pre = loaded.preprocessing
    crop = crop_ratio or pre.crop_pct
    transform = eval_transform(size, crop_ratio=crop, mean=pre.mean, std=pre.std)
    dataset = LabelledImages(samples, transform, size)
    return build_loader(dataset, batch_size, train=False, num_workers=workers)


def bad_file_reason(path: str | os.PathLike[str]) -> str:
    """Why ``path`` cannot be decoded (decoded again, for the report)."""
    try:
        decode_image(path)
    except BadImageError as e:
        return e.reason
    return "could not be read during the run (readable now)"


class LargeInputWarning(UserWarning):
    """An input of so many tokens that a forward takes long (attention cost grows with their square)."""


_WARNED_SIZES: set[Size] = set()


def check_forward_memory(patch_size: int, width: int, batch: int, size: Size, device) -> None:
    """Refuse a forward whose activations cannot fit on ``device``; warn (once per size) for
    inputs of more than :data:`~vit5.model.footprint.BIG_TOKEN_COUNT` tokens."""
    height = size[0]
    width_px = size[1]
    tokens = (height // patch_size) * (width_px // patch_size)
    what = f"a forward of {batch} image(s) at {height}x{width_px} ({tokens:,} tokens each)"
    fix = (
        "use a smaller size (--size, or --max-side for images at their own size) or a smaller batch"
    )
    check_fits(forward_bytes(batch, tokens, width), device, what, fix)
    if tokens > BIG_TOKEN_COUNT and size not in _WARNED_SIZES:
        _WARNED_SIZES.add(size)
        message = (
            f"input {height}x{width_px} has {tokens:,} tokens: attention cost grows with "
            "their square, so this is slow (minutes per image on a CPU); --max-side or "
            "--size limits it"
        )
        warnings.warn(message, LargeInputWarning, stacklevel=3)


# timm's forward_intermediates: per block (patch grid NCHW, [CLS | registers]), no head, stop at
# the last
_INTERMEDIATES = dict(
    return_prefix_tokens=True,
    stop_early=True,
    output_fmt="NCHW",
    intermediates_only=True,
)


def feature_names(info: ModelInfo, blocks: Sequence[int]) -> list[str]:
    counts = {"patches": 1, "cls": info.num_cls, "registers": info.num_registers}
    kinds = [kind for kind, count in counts.items() if count]
    return [f"blocks.{b}.{kind}" for b in blocks for kind in kinds]


@torch.inference_mode()
def dense_features(
    model: nn.Module,
    images: torch.Tensor,
    info: ModelInfo,
    blocks: Sequence[int],
    norm: bool = False,
) -> dict[str, torch.Tensor]:
    """``{name: [B, ...]}`` for the (absolute, sorted) ``blocks``: ``blocks.{i}.patches``
    ``[B, C, h, w]``, ``.cls`` ``[B, C]``, ``.registers`` ``[B, R, C]`` (timm's prefix is
    ``[CLS | registers]`` whatever the token order); ``norm`` applies the final norm."""
    size = tuple(images.shape[-2:])
    info.grid(size, EVAL_FIX)
    batch = images.shape[0]
    check_forward_memory(info.patch_size, info.embed_dim, batch, size, images.device)
    outputs = model.forward_intermediates(images, indices=list(blocks), norm=norm, **_INTERMEDIATES)
    features = {}
    for b, (spatial, prefix) in zip(blocks, outputs):
        features[f"blocks.{b}.patches"] = spatial
        if info.num_cls:
            features[f"blocks.{b}.cls"] = prefix[:, 0]
        if info.num_registers:
            features[f"blocks.{b}.registers"] = prefix[:, info.num_cls :]
    return features


def confusion_matrix(targets: torch.Tensor, preds: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Counts of (target, prediction) pairs, rows: true classes (scikit-learn's, far faster on
    pixels)."""
    pairs = targets.reshape(-1).long() * num_classes + preds.reshape(-1).long()
    counts = torch.bincount(pairs, minlength=num_classes * num_classes)
    return counts.reshape(num_classes, num_classes)
