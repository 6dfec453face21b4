"""Forward and training-step throughput (images/s) of several models, measured side by side.

A forward is one inference batch (eval mode, ``torch.no_grad``: not ``inference_mode``, whose
tensors a model may cache and later fail to reuse in training). A training step is
forward, cross-entropy loss, backward and an AdamW step (train mode, the same for every model).
With ``dtype="bf16"`` both run under ``torch.autocast`` (the usual mixed precision: fp32 weights,
bf16 matmuls). Models are interleaved round by round (see :mod:`vit5.bench.timing`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vit5.bench.timing import Samples, TimingConfig, device_sync, measure
from vit5.model import unwrap

MODES: tuple[str, ...] = ("forward", "train")


def autocast_context(device: torch.device | str, dtype: str) -> Callable[[], AbstractContextManager]:
    """A factory of the autocast context for ``dtype`` ("fp32": none, "bf16": bfloat16 autocast)."""
    if dtype == "fp32":
        return nullcontext
    if dtype == "bf16":
        device_type = torch.device(device).type
        return lambda: torch.autocast(device_type, dtype=torch.bfloat16)
    raise ValueError(f"unknown dtype {dtype!r}: use 'fp32' or 'bf16'")


def forward_step(
    model: nn.Module, images: torch.Tensor, amp: Callable[[], AbstractContextManager]
) -> Callable[[], None]:
    model.eval()

    def step() -> None:
        with torch.no_grad(), amp():
            model(images)

    return step


def train_step(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, amp: Callable[[], AbstractContextManager]
) -> Callable[[], None]:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.05, foreach=True)

    def step() -> None:
        with amp():
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


@dataclass(frozen=True)
class ThroughputRun:
    """Seconds per batch of each model for each mode, from one interleaved measurement per mode."""

    img_size: int
    batch: int
    samples: dict[str, dict[str, Samples]]  # mode -> model -> samples

    def images_per_s(self, mode: str, model: str) -> float:
        return self.samples[mode][model].rate(self.batch).median

    def to_dict(self) -> dict[str, object]:
        return {
            "img_size": self.img_size,
            "batch": self.batch,
            "samples": {m: {k: s.to_dict() for k, s in v.items()} for m, v in self.samples.items()},
        }


def random_batch(
    batch: int, img_size: int, device: torch.device | str = "cpu", num_classes: int = 1000
) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded random images ``[batch, 3, img_size, img_size]`` and labels, the same in every section."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, img_size, img_size, generator=generator).to(device)
    labels = torch.randint(0, num_classes, (batch,), generator=generator).to(device)
    return images, labels


def trains(model: nn.Module) -> bool:
    """Whether a model has a training step (one fused for inference does not)."""
    return not getattr(unwrap(model), "fused_for_inference", False)


def measure_throughput(
    models: Mapping[str, nn.Module],
    img_size: int,
    batch: int,
    timing: TimingConfig,
    device: torch.device | str = "cpu",
    dtype: str = "fp32",
    modes: tuple[str, ...] = MODES,
    num_classes: int = 1000,
) -> ThroughputRun:
    """Images/s of every model for each of ``modes`` ("forward", "train") on random images.

    Models fused for inference are timed in the forward rounds only.
    """
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown throughput modes {sorted(unknown)}: use {MODES}")
    images, labels = random_batch(batch, img_size, device, num_classes)
    amp = autocast_context(device, dtype)
    sync = device_sync(device)
    samples: dict[str, dict[str, Samples]] = {}
    for mode in modes:
        if mode == "forward":
            steps = {name: forward_step(m.to(device), images, amp) for name, m in models.items()}
        else:
            trained = {name: m for name, m in models.items() if trains(m)}
            steps = {name: train_step(m.to(device), images, labels, amp) for name, m in trained.items()}
        samples[mode] = measure(steps, timing, sync)
        del steps
    for model in models.values():
        model.zero_grad(set_to_none=True)
        model.eval()
    return ThroughputRun(img_size, batch, samples)
