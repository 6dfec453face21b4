"""Stochastic depth (Huang et al., 2016): drop a residual branch per sample while training."""

from __future__ import annotations

import torch
from torch import nn


def drop_path(x: torch.Tensor, rate: float, training: bool) -> torch.Tensor:
    """Zero the whole branch for a random ``rate`` of the samples; rescale the rest by ``1/(1-rate)``."""
    if rate == 0.0 or not training:
        return x
    keep = 1.0 - rate
    return x * x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep).div_(keep)


class DropPath(nn.Module):
    def __init__(self, rate: float = 0.0) -> None:
        super().__init__()
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.rate, self.training)

    def extra_repr(self) -> str:
        return f"rate={self.rate}"


def drop_path_rates(rate: float, depth: int, schedule: str = "uniform") -> list[float]:
    """Per-block rates: ``"uniform"`` (ViT-5, DeiT-III) or ``"linear"`` (0 to ``rate``)."""
    if schedule == "uniform":
        return [rate] * depth
    if schedule == "linear":
        return [rate * i / max(depth - 1, 1) for i in range(depth)]
    raise ValueError(f"unknown drop-path schedule {schedule!r}: use 'uniform' or 'linear'")
