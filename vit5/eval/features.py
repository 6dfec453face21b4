"""Dense features for a folder of images: per image, the chosen blocks' patch grids, CLS and registers.

Each image runs at one fixed size (resized, aspect not kept) or at its own size rounded to the patch size
(optionally shrunk to ``max_side``); images of equal input size wait in per-size buckets and run together,
so the yield order is not the listing order. vit5 models and timm ViTs alike (:mod:`vit5.introspect`)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from vit5.data import BadImageError, BadImageWarning, decode_image, resize_transform
from vit5.errors import InputError
from vit5.eval.backbone import EVAL_FIX, dense_features
from vit5.eval.images import Size, list_images, own_size
from vit5.eval.load import LoadedModel
from vit5.introspect import describe
from vit5.model import take_indices

StorageDtype = Literal["float32", "float16", "bfloat16"]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_PENDING_BATCHES = 4  # decoded images allowed to wait in buckets, in batches


@dataclass(frozen=True)
class FeatureSettings:
    """What to extract; ``dtype`` is the storage dtype (the model runs in its own)."""

    layers: tuple[int, ...] = (-1,)  # blocks to take (negative counts from the end)
    size: tuple[int, int] | None = None  # fixed input (H, W), patch multiples; None: each image's own size
    max_side: int | None = None  # with size=None: shrink images whose longer side exceeds it (aspect kept)
    norm: bool = False  # the model's final norm on every block output (as DINO features are)
    dtype: StorageDtype = "float32"
    batch_size: int = 8
    num_workers: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(int(i) for i in self.layers))
        if self.size is not None:
            object.__setattr__(self, "size", (int(self.size[0]), int(self.size[1])))
        if self.dtype not in DTYPES:
            raise InputError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.size is not None and self.max_side is not None:
            raise InputError(
                "give either a fixed size or max_side (which limits each image's own size), not both"
            )
        if self.max_side is not None and self.max_side < 1:
            raise InputError(f"max_side must be >= 1, got {self.max_side}")
        if self.batch_size < 1 or self.num_workers < 0:
            raise InputError(
                f"batch_size must be >= 1 and num_workers >= 0, got {self.batch_size}, {self.num_workers}"
            )

    def identity(self) -> dict:
        """The settings that change the output (not batch size or workers)."""
        return {k: v for k, v in asdict(self).items() if k not in ("batch_size", "num_workers")}


@dataclass
class ImageFeatures:
    path: Path
    features: dict[str, torch.Tensor]  # per image: patches [C, h, w], cls [C], registers [R, C]
    image_size: Size  # decoded image (H, W)
    input_size: Size  # what the model saw


@dataclass
class FailedImage:
    path: Path
    reason: str


class _ResizedImages(Dataset):
    """``index -> (index, image or None, (H, W) or None, why it failed)``."""

    def __init__(self, paths: Sequence[Path], settings: FeatureSettings, patch_size: int, mean, std) -> None:
        self.paths, self.settings, self.patch_size = paths, settings, patch_size
        self.mean, self.std = mean, std

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor | None, Size | None, str]:
        try:
            image = decode_image(self.paths[index])
        except BadImageError as err:
            return index, None, None, err.reason
        image_size = (image.shape[0], image.shape[1])
        size = self.settings.size or own_size(image_size, self.patch_size, self.settings.max_side)
        return index, resize_transform(size, mean=self.mean, std=self.std)(image), image_size, ""


def resolve_model(model: nn.Module | LoadedModel) -> tuple[nn.Module, tuple[float, ...], tuple[float, ...]]:
    """The module and its normalisation (from a LoadedModel, or the model's timm data config)."""
    if isinstance(model, LoadedModel):
        return model.model, tuple(model.mean), tuple(model.std)
    from timm.data import resolve_model_data_config

    data = resolve_model_data_config(model)
    return model, tuple(data["mean"]), tuple(data["std"])


def extract(
    model: nn.Module | LoadedModel,
    paths: Sequence[str | os.PathLike[str]],
    settings: FeatureSettings = FeatureSettings(),
) -> Iterator[ImageFeatures | FailedImage]:
    """Features (CPU, storage dtype) for each of ``paths``, or why an image failed; bucketed order."""
    module, mean, std = resolve_model(model)
    info = describe(module)
    blocks = take_indices(info.depth, settings.layers, unique=True)
    if settings.size is not None:
        info.grid(settings.size, EVAL_FIX)
    paths = [Path(p) for p in paths]
    data = _ResizedImages(paths, settings, info.patch_size, mean, std)
    loader = DataLoader(data, batch_size=None, num_workers=settings.num_workers, collate_fn=_as_is)
    device = next(module.parameters()).device
    module.eval()
    buckets: dict[Size, list[tuple]] = {}

    def run(items: list[tuple]) -> Iterator[ImageFeatures]:
        batch = torch.stack([image for _, image, _, _ in items]).to(device)
        features = dense_features(module, batch, info, blocks, norm=settings.norm)
        features = {k: v.to(DTYPES[settings.dtype]).cpu() for k, v in features.items()}
        for i, (index, _, image_size, _) in enumerate(items):
            per_image = {k: v[i].clone() for k, v in features.items()}
            yield ImageFeatures(paths[index], per_image, image_size, tuple(batch.shape[-2:]))

    for item in loader:
        index, image, _, reason = item
        if image is None:
            yield FailedImage(paths[index], reason)
            continue
        size = tuple(image.shape[-2:])
        buckets.setdefault(size, []).append(item)
        if len(buckets[size]) == settings.batch_size:
            yield from run(buckets.pop(size))
        elif sum(map(len, buckets.values())) >= _PENDING_BATCHES * settings.batch_size:
            for waiting in list(buckets):
                yield from run(buckets.pop(waiting))
    for waiting in list(buckets):
        yield from run(buckets.pop(waiting))


def _as_is(item: tuple) -> tuple:
    return item


def iter_features(
    model: nn.Module | LoadedModel,
    images: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    settings: FeatureSettings = FeatureSettings(),
) -> Iterator[tuple[Path, dict[str, torch.Tensor]]]:
    """``(path, {name: tensor})`` for an image folder (recursive), one file, or a list of files.

    Nothing is written. Unreadable images are skipped with a :class:`~vit5.data.BadImageWarning`.
    """
    paths = list_images(images)[1] if isinstance(images, (str, os.PathLike)) else list(images)
    for item in extract(model, paths, settings):
        if isinstance(item, FailedImage):
            warnings.warn(
                f"skipping unreadable image {item.path}: {item.reason}", BadImageWarning, stacklevel=2
            )
            continue
        yield item.path, item.features
