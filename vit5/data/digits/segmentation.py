"""A segmentation set: scikit-learn digits alpha-blended onto smooth random canvases, mask = class + 1 where
the topmost digit's alpha >= 0.5, else 0 (train canvases from train digits only), written in the layout
:mod:`vit5.data.segmentation` reads; the same arguments always give the same bytes."""

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np
from sklearn.datasets import load_digits

from vit5.data.digits import load_digits_split, write_pngs
from vit5.errors import InputError
from vit5.outputs import write_json

SEG_CLASSES: tuple[str, ...] = ("background", *(str(d) for d in range(10)))
IGNORE_INDEX = 255
SPLITS = ("train", "val")
_ALPHA_THRESHOLD = 0.5
_SPOT_TRIES = 20
_MAX_COVER = 0.15


@dataclass(frozen=True)
class Placement:
    """One pasted digit: its class, index in ``load_digits()``, top-left corner and side in pixels."""

    digit: int
    source_index: int
    top: int
    left: int
    side: int


@dataclass(frozen=True)
class SegSample:
    image: np.ndarray  # (H, W, 3) uint8 RGB
    mask: np.ndarray  # (H, W) uint8, 0 = background, d + 1 = digit d
    placements: tuple[Placement, ...]


@dataclass(frozen=True)
class SegSetConfig:
    """Arguments of :func:`make_digit_segmentation` (validated; recorded in ``dataset.json``)."""

    num_train: int = 400
    num_val: int = 100
    size: int = 64
    digits_per_image: tuple[int, int] = (2, 4)  # inclusive range
    digit_scale: tuple[float, float] = (0.3, 0.55)  # digit side as a fraction of the canvas side
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "digits_per_image", tuple(self.digits_per_image))
        object.__setattr__(self, "digit_scale", tuple(self.digit_scale))
        lo, hi = self.digits_per_image
        s_lo, s_hi = self.digit_scale
        for name, ok, want in (
            ("num_train", self.num_train >= 1, ">= 1"),
            ("num_val", self.num_val >= 1, ">= 1"),
            ("size", self.size >= 16, ">= 16 pixels"),
            ("digits_per_image", 1 <= lo <= hi, "a range 1 <= min <= max"),
            (
                "digit_scale",
                0 < s_lo <= s_hi <= 1 and round(s_lo * self.size) >= 8,
                f"a range 0 < min <= max <= 1 giving digits of at least 8 px at size {self.size}",
            ),
        ):
            if not ok:
                raise InputError(f"{name} must be {want}, got {getattr(self, name)!r}")


def digit_alpha(digit_8x8: np.ndarray, side: int) -> np.ndarray:
    """The 0..16 digit as a float32 alpha matte in [0, 1] of ``side`` x ``side`` (bilinear)."""
    scaled = digit_8x8.astype(np.float32) / 16.0
    alpha = cv2.resize(scaled, (side, side), interpolation=cv2.INTER_LINEAR)
    return np.clip(alpha, 0.0, 1.0)


def compose(
    rng: np.random.Generator,
    digits: np.ndarray,
    targets: np.ndarray,
    sources: np.ndarray,
    cfg: SegSetConfig,
) -> SegSample:
    """One canvas from the pool ``digits`` (N, 8, 8) in 0..16 with classes ``targets``."""
    size = cfg.size
    coarse = rng.random((max(2, size // 16), max(2, size // 16), 3)).astype(np.float32)
    canvas = 0.0 + 60.0 * cv2.resize(coarse, (size, size), interpolation=cv2.INTER_CUBIC).clip(0, 1)
    mask = np.zeros((size, size), dtype=np.uint8)
    placements = []
    for _ in range(int(rng.integers(cfg.digits_per_image[0], cfg.digits_per_image[1] + 1))):
        pick = int(rng.integers(len(targets)))
        smallest = round(cfg.digit_scale[0] * size)
        largest = round(cfg.digit_scale[1] * size)
        side = int(rng.integers(smallest, largest + 1))
        top, left = _free_spot(rng, size, side, placements)
        colour = (rng.uniform(200.0, 255.0) + rng.uniform(-20, 0, size=3)).astype(np.float32)
        alpha = digit_alpha(digits[pick], side)[..., None]
        window = canvas[top : top + side, left : left + side]
        window[:] = window * (1.0 - alpha) + colour * alpha
        inked = alpha[..., 0] >= _ALPHA_THRESHOLD
        mask[top : top + side, left : left + side][inked] = targets[pick] + 1
        placements.append(Placement(int(targets[pick]), int(sources[pick]), top, left, side))
    return SegSample(np.rint(canvas).clip(0, 255).astype(np.uint8), mask, tuple(placements))


def _free_spot(
    rng: np.random.Generator,
    size: int,
    side: int,
    placed: list[Placement],
) -> tuple[int, int]:
    """A random top-left corner; of up to ``_SPOT_TRIES`` draws, the first whose square covers at
    most ``_MAX_COVER`` of an earlier digit's square, else the least covering one."""
    best = (0, 0)
    best_cover = np.inf
    for _ in range(_SPOT_TRIES):
        top, left = (int(v) for v in rng.integers(0, size - side + 1, size=2))
        cover = max((_overlap(top, left, side, p) / p.side**2 for p in placed), default=0.0)
        if cover <= _MAX_COVER:
            return top, left
        if cover < best_cover:
            best = (top, left)
            best_cover = cover
    return best


def _overlap(top: int, left: int, side: int, p: Placement) -> int:
    rows = max(0, min(top + side, p.top + p.side) - max(top, p.top))
    cols = max(0, min(left + side, p.left + p.side) - max(left, p.left))
    return rows * cols


def digit_seg_samples(split: str, cfg: SegSetConfig = SegSetConfig()) -> list[SegSample]:
    """The canvases of ``split`` ("train" or "val"), in memory."""
    if split not in SPLITS:
        raise InputError(f"split must be one of {SPLITS}, got {split!r}")
    data = load_digits_split(split, size=8, seed=cfg.seed)  # only for the split's source indices
    digits = load_digits().images[data.source_indices]  # exact 0..16 values
    rng = np.random.default_rng([cfg.seed, SPLITS.index(split)])
    count = cfg.num_train if split == "train" else cfg.num_val
    return [compose(rng, digits, data.targets, data.source_indices, cfg) for _ in range(count)]


def make_digit_segmentation(
    root: str | os.PathLike[str],
    cfg: SegSetConfig = SegSetConfig(),
) -> dict:
    """Write the set under ``root`` (:func:`~vit5.data.digits.write_pngs`: idempotent, a set with other
    arguments refused) and return the ``dataset.json`` content."""
    root = Path(root)
    plan = {}
    for split in SPLITS:
        for i, sample in enumerate(digit_seg_samples(split, cfg)):
            plan[root / "images" / split / f"{i:05d}.png"] = sample.image
            plan[root / "annotations" / split / f"{i:05d}.png"] = sample.mask
    write_pngs(root, plan, 5)
    info = {
        "name": "digits-seg",
        "num_classes": len(SEG_CLASSES),
        "class_names": list(SEG_CLASSES),
        "ignore_index": IGNORE_INDEX,
        "config": asdict(cfg),
        "splits": {"train": cfg.num_train, "val": cfg.num_val},
    }
    write_json(root / "dataset.json", info)
    return info
