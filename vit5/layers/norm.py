"""Normalisation layers: RMSNorm (Zhang and Sennrich, 2019; ViT-5, QK-Norm included, statistics in fp32)
and LayerNorm (the DeiT-III baseline): ``y = g * x / sqrt(mean(x^2) + eps)``."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

NormKind = Literal["rmsnorm", "layernorm"]


class RMSNorm(nn.Module):
    """RMS norm over the last dimension in fp32, returned in the input dtype (as the official code);
    ``affine=False`` (no gain) is what :func:`vit5.fuse_for_inference` leaves of a folded norm."""

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
    """The norm named by ``kind`` ("rmsnorm" or "layernorm"), with a learned gain."""
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps)
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    raise ValueError(f"unknown norm {kind!r}: use 'rmsnorm' or 'layernorm'")
