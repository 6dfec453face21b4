"""Dense features for a folder of images: per image, the chosen blocks' patch grids, CLS and registers.

Each image is fed either at one fixed size (resized, aspect not kept, so the grid covers the
whole image) or at its own size rounded to the patch size (optionally shrunk first so that its
longer side is at most ``max_side``). Images of equal input size are batched together: decoded
images wait in per-size buckets that run when full (and all run when too many wait), so a
folder of mixed sizes still batches wherever sizes repeat. The yield order is therefore not the
listing order. Works for vit5 models and timm ViTs (see :mod:`vit5.introspect.info`).

    for path, feats in iter_features(model, "photos/", FeatureSettings(layers=(-1,), dtype="float16")):
        grid = feats["blocks.11.patches"]            # [C, H/p, W/p]
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from vit5.data import BadImageError, BadImageWarning, decode_image, resize_transform
from vit5.errors import InputError
from vit5.eval.backbone import EVAL_FIX, dense_features
from vit5.eval.images import Size, list_images, own_size
from vit5.eval.load import LoadedModel
from vit5.introspect import ModelInfo, describe
from vit5.model import take_indices

StorageDtype = Literal["float32", "float16", "bfloat16"]
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
_PENDING_BATCHES = 4  # decoded images allowed to wait in buckets, in batches


@dataclass(frozen=True)
class FeatureSettings:
    """What to extract.

    Args:
        layers: blocks to take (negative counts from the end).
        size: fixed input (H, W), patch multiples; ``None`` keeps each image's own size.
        max_side: with ``size=None``, shrink images whose longer side exceeds it (aspect kept).
        norm: apply the model's final norm to every block output (as DINO features are).
        dtype: storage dtype (the model runs in its own dtype).
    """

    layers: tuple[int, ...] = (-1,)
    size: tuple[int, int] | None = None
    max_side: int | None = None
    norm: bool = False
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


@dataclass
class _Decoded:
    index: int
    image: torch.Tensor | None
    image_size: Size | None
    reason: str = ""


class _ResizedImages(Dataset):
    def __init__(
        self,
        paths: Sequence[Path],
        settings: FeatureSettings,
        patch_size: int,
        mean: Sequence[float],
        std: Sequence[float],
    ) -> None:
        self.paths, self.settings, self.patch_size = list(paths), settings, patch_size
        self.mean, self.std = tuple(mean), tuple(std)
        self._transforms: dict[Size, Callable[[np.ndarray], torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> _Decoded:
        try:
            image = decode_image(self.paths[index])
        except BadImageError as err:
            return _Decoded(index, None, None, err.reason)
        image_size = (image.shape[0], image.shape[1])
        size = self.settings.size or own_size(image_size, self.patch_size, self.settings.max_side)
        if size not in self._transforms:
            self._transforms[size] = resize_transform(size, mean=self.mean, std=self.std)
        return _Decoded(index, self._transforms[size](image), image_size)


def resolve_model(
    model: nn.Module | LoadedModel, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
) -> tuple[nn.Module, tuple[float, ...], tuple[float, ...]]:
    """The module and its normalisation (from a LoadedModel, or the model's timm data config)."""
    if isinstance(model, LoadedModel):
        return model.model, tuple(mean or model.mean), tuple(std or model.std)
    if mean is None or std is None:
        from timm.data import resolve_model_data_config

        data = resolve_model_data_config(model)
        mean, std = mean or data["mean"], std or data["std"]
    return model, tuple(mean), tuple(std)


def extract(
    model: nn.Module | LoadedModel,
    paths: Sequence[str | os.PathLike[str]],
    settings: FeatureSettings = FeatureSettings(),
    *,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> Iterator[ImageFeatures | FailedImage]:
    """Features (CPU, storage dtype) for each of ``paths``, or why an image failed; bucketed order."""
    module, mean, std = resolve_model(model, mean, std)
    info = describe(module)
    blocks = take_indices(info.depth, settings.layers, unique=True)
    if settings.size is not None:
        info.grid(settings.size, EVAL_FIX)
    paths = [Path(p) for p in paths]
    data = _ResizedImages(paths, settings, info.patch_size, mean, std)
    loader = DataLoader(data, batch_size=None, num_workers=settings.num_workers, collate_fn=_as_is)
    device = next(module.parameters()).device
    module.eval()
    buckets: dict[Size, list[_Decoded]] = {}
    for item in loader:
        if item.image is None:
            yield FailedImage(paths[item.index], item.reason)
            continue
        size = tuple(item.image.shape[-2:])
        buckets.setdefault(size, []).append(item)
        if len(buckets[size]) == settings.batch_size:
            yield from _run(module, info, blocks, settings, buckets.pop(size), paths, device)
        elif sum(map(len, buckets.values())) >= _PENDING_BATCHES * settings.batch_size:
            for waiting in list(buckets):
                yield from _run(module, info, blocks, settings, buckets.pop(waiting), paths, device)
    for waiting in list(buckets):
        yield from _run(module, info, blocks, settings, buckets.pop(waiting), paths, device)


def _as_is(item: _Decoded) -> _Decoded:
    return item


def _run(
    model: nn.Module,
    info: ModelInfo,
    blocks: list[int],
    settings: FeatureSettings,
    items: list[_Decoded],
    paths: list[Path],
    device: torch.device,
) -> Iterator[ImageFeatures]:
    batch = torch.stack([item.image for item in items]).to(device)
    features = dense_features(model, batch, info, blocks, norm=settings.norm)
    features = {k: v.to(DTYPES[settings.dtype]).cpu() for k, v in features.items()}
    input_size = tuple(batch.shape[-2:])
    for i, item in enumerate(items):
        per_image = {k: v[i].clone() for k, v in features.items()}
        yield ImageFeatures(paths[item.index], per_image, item.image_size, input_size)


def iter_features(
    model: nn.Module | LoadedModel,
    images: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    settings: FeatureSettings = FeatureSettings(),
    *,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> Iterator[tuple[Path, dict[str, torch.Tensor]]]:
    """``(path, {name: tensor})`` for an image folder (recursive), one file, or a list of files.

    Nothing is written. Unreadable images are skipped with a :class:`~vit5.data.BadImageWarning`.
    """
    paths = list_images(images)[1] if isinstance(images, (str, os.PathLike)) else list(images)
    for item in extract(model, paths, settings, mean=mean, std=std):
        if isinstance(item, FailedImage):
            warnings.warn(
                f"skipping unreadable image {item.path}: {item.reason}", BadImageWarning, stacklevel=2
            )
            continue
        yield item.path, item.features
