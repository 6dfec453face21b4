"""Normalisation layers: RMSNorm (ViT-5) and LayerNorm (DeiT-III baseline / ablation).

RMSNorm (Zhang and Sennrich, 2019) keeps LayerNorm's rescale and drops its recentring and
bias: ``y = g * x / sqrt(mean(x^2) + eps)``. ViT-5 uses it for every norm, including QK-Norm,
with eps 1e-6 and the statistics in fp32 (bf16 mean-of-squares loses precision and NaNs).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

NormKind = Literal["rmsnorm", "layernorm"]


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension, gain only (no bias).

    The mean of squares is taken in fp32 with ``eps`` inside the square root; the result is
    returned in the input dtype, as in the official ViT-5 code. ``affine=False`` drops the gain
    (``weight`` is None), as ``nn.LayerNorm(elementwise_affine=False)``: what is left of a norm
    whose gain was folded into the next layer (:func:`vit5.fuse_for_inference`).
    """

    def __init__(self, dim: int, eps: float = 1e-6, affine: bool = True) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = None if self.weight is None else self.weight.float()
        return F.rms_norm(x.float(), (self.dim,), weight, self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}" + ("" if self.weight is not None else ", affine=False")


def make_norm(kind: NormKind, dim: int, eps: float = 1e-6) -> nn.Module:
    """Build the norm named by ``kind`` ("rmsnorm" or "layernorm", both with a learned gain)."""
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps)
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    raise ValueError(f"unknown norm {kind!r}: use 'rmsnorm' or 'layernorm'")
