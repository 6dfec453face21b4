"""Normalisation layers: RMSNorm (Zhang and Sennrich, 2019; ViT-5, QK-Norm included, statistics in fp32)
and LayerNorm (the DeiT-III baseline): ``y = g * x / sqrt(mean(x^2) + eps)``."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

NormKind = Literal["rmsnorm", "layernorm"]


class RMSNorm(nn.Module):
    """RMS norm over the last dimension in fp32, returned in the input dtype (as the official code)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (self.dim,), self.weight.float(), self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


def make_norm(kind: NormKind, dim: int, eps: float = 1e-6) -> nn.Module:
    """The norm named by ``kind`` ("rmsnorm" or "layernorm"), with a learned gain."""
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps)
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    raise ValueError(f"unknown norm {kind!r}: use 'rmsnorm' or 'layernorm'")
