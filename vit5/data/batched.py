"""Augmentation as batch tensor operations on a preloaded data set held as one uint8 tensor ``[N, H, W, C]``
(:meth:`ImageFolderDataset.preloaded <vit5.data.folder.ImageFolderDataset.preloaded>`): the batch form of
the ``rrc`` transform, and the ``pad_crop``, ``eval`` and ``none`` transforms of :mod:`vit5.data.transforms`
on images already of the model's size, in place of a DataLoader that augments and collates each sample.

The per-sample parameters (crop box, flip, erasing box) of an epoch are drawn at once from a torch
Generator seeded from ``(seed, epoch)`` and indexed by the sample's global position in the epoch (the
position :class:`~vit5.data.loader.RepeatAugSampler` gives it): a run resumed mid-epoch, on any number of
processes, crops and flips each sample as the uninterrupted run did. The erasing noise of a batch comes
from ``(seed, epoch, position of its first sample)``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Dataset

from vit5.data.transforms import (
    ERASING_RATIO,
    ERASING_SCALE,
    IMAGENET_MEAN,
    IMAGENET_STD,
    Size,
    _check,
    _size_hw,
)

if TYPE_CHECKING:
    from vit5.data.loader import RepeatAugSampler

Params = dict[str, torch.Tensor]
RRC_ATTEMPTS = 10  # albumentations' and torchvision's RandomResizedCrop


@dataclass(frozen=True, kw_only=True)
class BatchAugment:
    """A batch's path, in the per-sample order: crop (``padding``: reflect-101 pad and random crop as
    ``pad_crop_transform``; ``scale``: RandomResizedCrop with OpenCV's bicubic resize; neither: the
    image as it is, which must then be of ``size``), horizontal flip with probability ``hflip``, erasing
    with probability ``erasing`` (albumentations ``Erasing`` 2.0.8's law of area and aspect, uniform
    random uint8 noise), normalise with ``mean`` and ``std``."""

    size: tuple[int, int]
    padding: int = 0
    scale: tuple[float, float] | None = None
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: float = 0.0
    erasing: float = 0.0
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    def __post_init__(self) -> None:
        _check(padding=self.padding, hflip=self.hflip, erasing=self.erasing, ratio=self.ratio)
        _check(mean=self.mean, std=self.std)
        if self.scale is not None:
            _check(scale=self.scale)

    @property
    def random(self) -> bool:
        """Whether any step draws parameters."""
        return bool(self.padding or self.scale or self.hflip or self.erasing)

    def fits(self, image_hw: tuple[int, int]) -> bool:
        """Whether images of ``image_hw`` take this path: of ``size``, or for a resized crop no larger
        (its boxes then only grow, where OpenCV's bicubic resize is what albumentations uses)."""
        if self.scale is None:
            return tuple(image_hw) == self.size
        return image_hw[0] <= self.size[0] and image_hw[1] <= self.size[1]

    def draw(self, count: int, image_hw: tuple[int, int], generator: torch.Generator) -> Params:
        """Parameters of ``count`` samples of ``image_hw``: the crop box (``top``, ``left``, ``height``,
        ``width``; in padded coordinates for a pad crop), ``flip``, the erasing box (``erase_*``;
        height 0: none)."""
        height, width = self.size
        if self.scale is not None:
            params = _resized_crop_boxes(count, image_hw, self.scale, self.ratio, generator)
        else:
            # albumentations RandomCrop: int((size - crop + 1) * U[0, 1)), i.e. uniform over 0..2p
            span = 2 * self.padding + 1
            params = {
                "top": _uniform_int(count, span, generator),
                "left": _uniform_int(count, span, generator),
            }
        params["flip"] = _uniform(count, generator) < self.hflip
        erase = _erasing_boxes(count, height, width, generator)
        erase["erase_height"] *= _uniform(count, generator) < self.erasing
        return {**params, **erase}

    def __call__(
        self,
        images: torch.Tensor,
        rows: torch.Tensor,
        params: Params | None,
        noise: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Images ``rows`` of ``images`` (contiguous uint8 ``[N, H, W, C]``) augmented with the
        parameters ``params`` of :meth:`draw` (one row per image; ``None``: no augmentation), erasing
        noise from ``noise``: normalised float32 ``[B, C, h, w]``."""
        if params is None:
            crops = images.index_select(0, rows)
        elif self.scale is not None:
            crops = _resized_crops(images.index_select(0, rows), params, self.size)
        else:
            crops = _pad_crops(images, rows, params, self.padding)
        if params is not None and self.erasing:
            crops = _erase(crops, params, noise)
        std = torch.tensor(self.std)[:, None, None]
        shift = torch.tensor(self.mean)[:, None, None] / std
        channels_first = crops.permute(0, 3, 1, 2)
        floats = channels_first.to(torch.float32, memory_format=torch.contiguous_format)
        # (x / 255 - mean) / std, in place
        return floats.mul_(1 / (255 * std)).sub_(shift)


def batch_augment(kind: str, size: Size, **options: Any) -> BatchAugment | None:
    """The batch form of ``build_transform(kind, size, **options)`` for images of ``size``, or ``None`` where
    there is none (``three_augment``, ``randaug``; an eval crop that resizes)."""
    hw = _size_hw(size)
    if kind == "rrc":
        return BatchAugment(size=hw, **options)
    if kind == "pad_crop":
        return BatchAugment(size=hw, **options)
    if kind == "none":
        return BatchAugment(size=hw, **options)
    if kind != "eval":
        return None
    crop_ratio = options.pop("crop_ratio", 1.0)
    _check(crop_ratio=crop_ratio)
    options.pop("antialias", None)  # no resizing here: nothing to antialias
    if (int(hw[0] / crop_ratio), int(hw[1] / crop_ratio)) != hw:
        return None
    return BatchAugment(size=hw, **options)


class BatchLoader:
    """Batches of ``(images [B, C, h, w] float32, labels [B])`` of a preloaded data set, augmented as
    batches. It stands in for the DataLoader it replaces: ``len()`` (batches), ``.sampler``,
    ``.dataset``, ``.batch_size``, ``.num_workers`` (0), iteration. Train (``sampler`` given): the
    sampler's order, full batches only. Eval: this rank's positions ``rank, rank + num_replicas, ...``,
    the last ones padded with label ``-1`` so every rank has as many batches."""

    num_workers = 0

    def __init__(
        self,
        dataset: Dataset,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        augment: BatchAugment,
        *,
        sampler: RepeatAugSampler | None = None,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4 or len(images) != len(labels):
            raise ValueError(
                f"BatchLoader needs uint8 images [N, H, W, C] and N labels; got {images.dtype} "
                f"{tuple(images.shape)} and {len(labels)} labels"
            )
        if not augment.fits(images.shape[1:3]):
            raise ValueError(
                f"images of {tuple(images.shape[1:3])} px cannot be cropped to {augment.size} without "
                "resizing: use the per-sample loader (vit5.data.build_loader)"
            )
        self.dataset = dataset
        self.images = images.contiguous()
        self.labels = labels
        self.batch_size = batch_size
        self.augment = augment
        self.sampler = sampler
        self.num_replicas = num_replicas
        self.rank = rank
        self._table: tuple[int, Params] | None = None  # (epoch, its parameters)

    def __len__(self) -> int:
        if self.sampler is not None:
            return len(self.sampler) // self.batch_size
        per_rank = math.ceil(len(self.labels) / self.num_replicas)
        return math.ceil(per_rank / self.batch_size)

    def __iter__(self) -> Any:
        if self.sampler is None:
            yield from self._eval_batches()
            return
        epoch = self.sampler.epoch
        positions = torch.tensor(self.sampler.positions())
        indices = torch.tensor(self.sampler.indices(), dtype=torch.long)
        table = self._params(epoch) if self.augment.random else None
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            rows = indices[start : start + self.batch_size]
            where = positions[start : start + self.batch_size]
            params = None if table is None else {k: v[where] for k, v in table.items()}
            noise = _generator(self.sampler.seed, epoch, 2, int(where[0]))
            yield self.augment(self.images, rows, params, noise), self.labels[rows]

    def _eval_batches(self) -> Any:
        count = len(self.labels)
        stop = math.ceil(count / self.num_replicas) * self.num_replicas
        positions = torch.arange(self.rank, stop, self.num_replicas)
        for start in range(0, len(positions), self.batch_size):
            where = positions[start : start + self.batch_size]
            padding = where >= count
            rows = where.clamp(max=count - 1)
            labels = self.labels[rows].masked_fill(padding, -1)
            yield self.augment(self.images, rows, None), labels

    def _params(self, epoch: int) -> Params:
        """The parameters of every position of ``epoch`` (drawn once per epoch)."""
        if self._table is None or self._table[0] != epoch:
            assert self.sampler is not None
            generator = _generator(self.sampler.seed, epoch, 1)
            image_hw = tuple(self.images.shape[1:3])
            params = self.augment.draw(self.sampler.epoch_size, image_hw, generator)  # type: ignore[arg-type]
            self._table = (epoch, params)
        return self._table[1]


def preloaded_loader(
    dataset: Dataset,
    batch_size: int,
    augment: BatchAugment | None,
    *,
    sampler: RepeatAugSampler | None = None,
    num_replicas: int = 1,
    rank: int = 0,
) -> BatchLoader | None:
    """A :class:`BatchLoader` over ``dataset``'s preloaded images (``dataset.preloaded()``), or ``None``
    where the batch path does not apply: no ``augment``, images not kept, of different sizes, or of
    another size than a crop without resizing gives."""
    preloaded = getattr(dataset, "preloaded", None)
    found = preloaded() if augment is not None and preloaded is not None else None
    if found is None or not augment.fits(found[0].shape[1:3]):  # type: ignore[union-attr]
        return None
    return BatchLoader(
        dataset,
        found[0],
        found[1],
        batch_size,
        augment,  # type: ignore[arg-type]
        sampler=sampler,
        num_replicas=num_replicas,
        rank=rank,
    )


def _generator(*keys: int) -> torch.Generator:
    seed = np.random.SeedSequence(list(keys)).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(seed) >> 1)


def _uniform(count: int, generator: torch.Generator) -> torch.Tensor:
    return torch.rand(count, generator=generator, dtype=torch.float64)


def _uniform_int(count: int, span: torch.Tensor | int, generator: torch.Generator) -> torch.Tensor:
    """Integers uniform over ``0 .. span - 1`` (``span`` per sample or for all)."""
    return (_uniform(count, generator) * span).long()


def _reflect(index: torch.Tensor, size: int) -> torch.Tensor:
    """``index`` mirrored into ``0 .. size - 1`` without repeating the edge (OpenCV BORDER_REFLECT_101)."""
    if size == 1:
        return torch.zeros_like(index)
    period = 2 * (size - 1)
    folded = index.remainder(period)
    return torch.where(folded < size, folded, period - folded)


def _pad_crops(
    images: torch.Tensor, rows: torch.Tensor, params: Params, padding: int
) -> torch.Tensor:
    """Images ``rows`` of ``images`` reflect-padded by ``padding``, cropped at ``(top, left)`` to their
    size and flipped: one ``index_select`` of pixels (4x faster than advanced indexing)."""
    count = len(images)
    height = images.shape[1]
    width = images.shape[2]
    pixel_rows = _reflect(params["top"][:, None] + torch.arange(height) - padding, height)
    cols = _reflect(params["left"][:, None] + torch.arange(width) - padding, width)
    cols = torch.where(params["flip"][:, None], cols.flip(1), cols)
    offsets = (
        rows[:, None] * height + pixel_rows
    ) * width  # [B, h]: first pixel of each output row
    pixels = (offsets[:, :, None] + cols[:, None, :]).flatten()
    flat = images.view(count * height * width, -1)
    return flat.index_select(0, pixels).view(len(rows), height, width, -1)


def _resized_crop_boxes(
    count: int,
    image_hw: tuple[int, int],
    scale: tuple[float, float],
    ratio: tuple[float, float],
    generator: torch.Generator,
) -> Params:
    """RandomResizedCrop's boxes (albumentations 2.0.8 ``RandomResizedCrop``, as torchvision's): up to 10
    draws of area ~ U(scale) and log-aspect ~ U(log ratio), the first that fits placed uniformly; else
    the centre crop of the whole image clipped to ``ratio``."""
    height, width = image_hw
    area = height * width
    tries = (count, RRC_ATTEMPTS)
    target = torch.empty(tries, dtype=torch.float64).uniform_(*scale, generator=generator) * area
    log_ratio = torch.empty(tries, dtype=torch.float64)
    aspect = log_ratio.uniform_(math.log(ratio[0]), math.log(ratio[1]), generator=generator).exp()
    widths = (target * aspect).sqrt().round().long()
    heights = (target / aspect).sqrt().round().long()
    fits = (widths > 0) & (widths <= width) & (heights > 0) & (heights <= height)
    first = fits.double().argmax(dim=1, keepdim=True)
    found = fits.any(dim=1)
    fallback = _centre_box(image_hw, ratio)
    crop_h = torch.where(found, heights.gather(1, first)[:, 0], fallback[0])
    crop_w = torch.where(found, widths.gather(1, first)[:, 0], fallback[1])
    top = _uniform_int(count, height - crop_h + 1, generator)
    left = _uniform_int(count, width - crop_w + 1, generator)
    top = torch.where(found, top, (height - crop_h) // 2)
    left = torch.where(found, left, (width - crop_w) // 2)
    return {"top": top, "left": left, "height": crop_h, "width": crop_w}


def _centre_box(image_hw: tuple[int, int], ratio: tuple[float, float]) -> tuple[int, int]:
    """The fallback crop's (height, width): the whole image, clipped to the aspect range."""
    height, width = image_hw
    if width / height < ratio[0]:
        return round(width / ratio[0]), width
    if width / height > ratio[1]:
        return height, round(height * ratio[1])
    return height, width


def _resized_crops(images: torch.Tensor, params: Params, size: tuple[int, int]) -> torch.Tensor:
    """Each box resized to ``size`` as OpenCV's ``INTER_CUBIC`` resizes the cropped box (what
    albumentations' RandomResizedCrop does), flipped where asked: float ``[B, h, w, C]``, whole values
    0-255 like the uint8 the per-sample path makes, through one matrix per axis. Boxes only grow here
    (:meth:`BatchAugment.fits`): albumentations' INTER_AREA for shrinking is not reproduced."""
    height = images.shape[1]
    width = images.shape[2]
    rows = _cubic_matrix(params["top"], params["height"], size[0], height)  # [B, h, H]
    cols = _cubic_matrix(params["left"], params["width"], size[1], width)  # [B, w, W]
    cols = torch.where(params["flip"][:, None, None], cols.flip(1), cols)
    source = images.permute(0, 3, 1, 2).float()  # [B, C, H, W]
    resized = rows[:, None] @ source @ cols[:, None].transpose(-1, -2)  # [B, C, h, w]
    return resized.round_().clamp_(0, 255).permute(0, 2, 3, 1)


def _cubic_matrix(
    start: torch.Tensor, length: torch.Tensor, out_size: int, in_size: int
) -> torch.Tensor:
    """The resize along one axis as a matrix ``[B, out_size, in_size]`` (rows: each output pixel's tap
    weights, summed where clamped taps meet)."""
    index, weights = _cubic_taps(start, length, out_size)
    matrix = torch.zeros(len(start), out_size, in_size)
    return matrix.scatter_add_(2, index, weights)


def _cubic_taps(
    start: torch.Tensor, length: torch.Tensor, out_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """OpenCV ``INTER_CUBIC`` along one axis for boxes ``start .. start + length - 1`` resized to
    ``out_size``: source indices ``[B, out_size, 4]`` and their weights (float32). Output pixel ``i``
    reads around ``(i + 0.5) * length / out_size - 0.5``; the four taps are clamped to the box, as OpenCV
    repeats the edge of the array it resizes (OpenCV ``imgproc/src/resize.cpp``, ``interpolateCubic``,
    A = -0.75)."""
    step = length.double()[:, None] / out_size
    source = (torch.arange(out_size, dtype=torch.float64) + 0.5) * step - 0.5
    floor = source.floor()
    fraction = (source - floor)[..., None]
    distance = (fraction - torch.arange(-1, 3, dtype=torch.float64)).abs()  # to taps -1, 0, 1, 2
    offsets = floor.long()[..., None] + torch.arange(-1, 3)
    last = (length - 1)[:, None, None]
    index = start[:, None, None] + offsets.clamp(min=0).minimum(last)
    return index, _cubic(distance).float()


def _cubic(distance: torch.Tensor) -> torch.Tensor:
    """Keys' cubic convolution kernel with A = -0.75 (OpenCV's, PyTorch's bicubic) at ``distance`` >= 0."""
    a = -0.75
    near = ((a + 2) * distance - (a + 3)) * distance**2 + 1
    far = ((a * distance - 5 * a) * distance + 8 * a) * distance - 4 * a
    return torch.where(distance <= 1, near, torch.where(distance < 2, far, 0.0))


def _erasing_boxes(count: int, height: int, width: int, generator: torch.Generator) -> Params:
    """albumentations 2.0.8 ``Erasing.get_params_dependent_on_data`` for ``count`` images: area uniform up
    to the largest box that fits every aspect, aspect uniform over what fits that area, position
    uniform; height 0 where no box fits."""
    total = height * width
    low = ERASING_RATIO[0]
    high = ERASING_RATIO[1]
    largest = min(total * ERASING_SCALE[1], low * height**2, width**2 / high)
    smallest = total * ERASING_SCALE[0]
    area = smallest + (largest - smallest) * _uniform(count, generator)
    most = torch.clamp(width**2 / area, max=high)
    least = torch.clamp(area / height**2, min=low)
    aspect = least + (most - least) * _uniform(count, generator)
    box_h = (area / aspect).sqrt().round().long()
    box_w = (area * aspect).sqrt().round().long()
    fits = (least <= most) & (largest >= smallest)
    return {
        "erase_top": _uniform_int(count, height - box_h + 1, generator),
        "erase_left": _uniform_int(count, width - box_w + 1, generator),
        "erase_height": box_h * fits,
        "erase_width": box_w,
    }


def _erase(crops: torch.Tensor, params: Params, noise: torch.Generator | None) -> torch.Tensor:
    """Fill each sample's erasing box with uniform random values 0-255 per pixel and channel."""
    rows = torch.arange(crops.shape[1])[None, :] - params["erase_top"][:, None]
    cols = torch.arange(crops.shape[2])[None, :] - params["erase_left"][:, None]
    inside_rows = (rows >= 0) & (rows < params["erase_height"][:, None])
    inside_cols = (cols >= 0) & (cols < params["erase_width"][:, None])
    mask = inside_rows[:, :, None, None] & inside_cols[:, None, :, None]
    values = torch.randint(0, 256, crops.shape, generator=noise, dtype=torch.uint8)
    return torch.where(mask, values.to(crops.dtype), crops)
