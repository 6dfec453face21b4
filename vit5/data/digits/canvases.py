"""Canvases that reward a storage token (Darcet et al., arXiv 2309.16588, section 2.1: outlier tokens on
redundant patches): a few scikit-learn digits on a large background; the label needs every digit. Batches
are pure functions of ``(seed, stream, index)``; train canvases use the train digits, held-out ones val's."""

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from sklearn.datasets import load_digits

from vit5.data import load_digits_split
from vit5.data.digits.segmentation import digit_alpha
from vit5.errors import InputError

Task = Literal["sum", "summod", "count", "max", "multilabel"]
Background = Literal["flat", "noise", "flat+noise"]
TASKS: tuple[str, ...] = get_args(Task)
BACKGROUNDS: tuple[str, ...] = get_args(Background)


@dataclass(frozen=True)
class CanvasConfig:
    size: tuple[int, int] = (64, 64)  # canvas (height, width), multiples of the patch size
    patch_size: int = 8
    digits: tuple[int, int] = (2, 3)  # inclusive range of digits per canvas
    digit_side: tuple[int, int] = (12, 20)  # inclusive range of a digit's side in pixels
    background: Background = "flat"
    noise_std: float = 24.0  # grey levels, for the noise backgrounds
    task: Task = "sum"

    def __post_init__(self) -> None:
        for name in ("size", "digits", "digit_side"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        h, w = self.size
        p = self.patch_size
        lo, hi = self.digits
        s_lo, s_hi = self.digit_side
        side_max = min(h, w)
        for name, ok, want in (
            ("size", p >= 1 and not h % p and not w % p, f"a multiple of patch_size {p}"),
            ("digits", 1 <= lo <= hi, "a range 1 <= min <= max"),
            (
                "digit_side",
                4 <= s_lo <= s_hi <= side_max,
                f"a range 4 <= min <= max <= {side_max} pixels",
            ),
            ("background", self.background in BACKGROUNDS, f"one of {', '.join(BACKGROUNDS)}"),
            ("task", self.task in TASKS, f"one of {', '.join(TASKS)}"),
            ("noise_std", self.noise_std >= 0, ">= 0"),
        ):
            if not ok:
                raise InputError(f"canvas {name} must be {want}, got {getattr(self, name)!r}")

    @property
    def num_outputs(self) -> int:
        """Classes of the label (or binary targets for ``multilabel``)."""
        return {"sum": 9 * self.digits[1] + 1, "count": self.digits[1] + 1}.get(self.task, 10)


@dataclass(frozen=True)
class CanvasBatch:
    images: np.ndarray  # [B, H, W, 3] uint8 RGB
    labels: np.ndarray  # [B] int64 class, or [B, 10] float32 for multilabel
    background: np.ndarray  # [B, h, w] bool: patches without any digit pixel
    digits: list[tuple[int, ...]]  # the digit classes on each canvas


def label_of(digits: tuple[int, ...], task: Task) -> int | np.ndarray:
    """The label of a canvas holding ``digits`` under ``task``."""
    if task != "multilabel":
        labels = {
            "sum": sum(digits),
            "summod": sum(digits) % 10,
            "count": len(digits),
            "max": max(digits),
        }
        return labels[task]
    present = np.zeros(10, dtype=np.float32)
    present[list(digits)] = 1.0
    return present


class CanvasSource:
    """Deterministic batches of canvases from the train or val digits (see the module docstring)."""

    def __init__(self, cfg: CanvasConfig, split: Literal["train", "val"], seed: int = 0) -> None:
        self.cfg = cfg
        self.seed = seed
        self.split_id = 0 if split == "train" else 1
        data = load_digits_split(split, size=8, seed=0)
        # exact 0..16 intensities
        self.pool = load_digits().images[data.source_indices].astype(np.float32)
        self.targets = data.targets

    def batch(self, index: int, size: int) -> CanvasBatch:
        """Batch ``index`` of ``size`` canvases: the same arguments always give the same pixels."""
        rng = np.random.default_rng([self.seed, self.split_id, index])
        parts = [self._canvas(rng) for _ in range(size)]
        images, labels, backgrounds, digits = zip(*parts)
        return CanvasBatch(
            np.stack(images),
            np.stack(labels) if self.cfg.task == "multilabel" else np.array(labels),
            np.stack(backgrounds),
            list(digits),
        )

    def _canvas(self, rng: np.random.Generator):
        cfg = self.cfg
        h, w = cfg.size
        canvas = np.full((h, w), rng.uniform(20.0, 110.0), dtype=np.float32)
        if cfg.background == "noise":
            canvas = rng.uniform(0.0, 130.0, size=(h, w)).astype(np.float32)
        elif cfg.background == "flat+noise":
            canvas += rng.normal(0.0, cfg.noise_std, size=(h, w)).astype(np.float32)
        base = np.rint(canvas).clip(0, 255)
        boxes: list[tuple[int, int, int]] = []
        chosen = []
        for _ in range(int(rng.integers(cfg.digits[0], cfg.digits[1] + 1))):
            pick = int(rng.integers(len(self.targets)))
            side = int(rng.integers(cfg.digit_side[0], cfg.digit_side[1] + 1))
            top, left = _free_spot(rng, (h, w), side, boxes)
            boxes.append((top, left, side))
            alpha = digit_alpha(self.pool[pick], side)
            colour = rng.uniform(190.0, 255.0)
            window = canvas[top : top + side, left : left + side]
            window[:] = window * (1.0 - alpha) + colour * alpha
            chosen.append(int(self.targets[pick]))
        gray = np.rint(canvas).clip(0, 255)
        p = cfg.patch_size
        touched = (gray != base).reshape(h // p, p, w // p, p).any(axis=(1, 3))
        digits = tuple(chosen)
        rgb = np.repeat(gray.astype(np.uint8)[..., None], 3, axis=2)
        return rgb, label_of(digits, cfg.task), ~touched, digits


def _free_spot(
    rng: np.random.Generator, size: tuple[int, int], side: int, boxes: list[tuple[int, int, int]]
) -> tuple[int, int]:
    """A random top-left corner overlapping no earlier digit's square, if one of a few draws allows."""
    best = (0, 0)
    best_overlap = np.inf
    for _ in range(30):
        top = int(rng.integers(0, size[0] - side + 1))
        left = int(rng.integers(0, size[1] - side + 1))
        overlap = sum(_shared(top, t, side, s) * _shared(left, x, side, s) for t, x, s in boxes)
        if overlap == 0:
            return top, left
        if overlap < best_overlap:
            best = (top, left)
            best_overlap = overlap
    return best


def _shared(start: int, other: int, side: int, other_side: int) -> int:
    """Pixels shared on one axis by ``[start, start + side)`` and ``[other, other + other_side)``."""
    return max(0, min(start + side, other + other_side) - max(start, other))
