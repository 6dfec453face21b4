"""Normalisation layers: RMSNorm (Zhang and Sennrich, arXiv 1910.07467; ViT-5, QK-Norm included,
statistics in fp32) and LayerNorm (the DeiT-III baseline): ``y = g * x / sqrt(mean(x^2) + eps)``."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

NormKind = Literal["rmsnorm", "layernorm"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dim in fp32, returned in ``x``'s dtype
    (the official ``RMSNorm``, ``models_vit5.py:75-86``, with the gain applied before the cast).

    The mean square comes from one ``vector_norm`` reduction that reads ``x`` once, in fp32 whatever
    ``x``'s dtype. PyTorch's CPU ``F.rms_norm`` is a composite that first writes ``x^2`` out in full
    (``pow``, ``mean``, ``add``, ``rsqrt``, two products); the two give the same values to float
    rounding, under bf16 autocast too (``tests/test_layers_norm.py``).
    """
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
    scale = torch.rsqrt(norm.square() / x.shape[-1] + eps)
    return (x * scale * weight.float()).to(x.dtype)


class RMSNorm(nn.Module):
    """RMS norm over the last dimension in fp32, returned in the input dtype (as the official code)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


def make_norm(kind: NormKind, dim: int, eps: float = 1e-6) -> nn.Module:
    """The norm named by ``kind`` ("rmsnorm" or "layernorm"), with a learned gain."""
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps)
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    raise ValueError(f"unknown norm {kind!r}: use 'rmsnorm' or 'layernorm'")
