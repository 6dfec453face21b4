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


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2, -1) + eps)`` without a gain, in ``x``'s dtype (pass fp32 for fp32 statistics).

    On CUDA and under ``torch.compile`` this is ``F.rms_norm`` (one fused kernel each way). On a
    CPU, PyTorch's ``rms_norm`` is a composite of six ops that writes ``x^2`` out in full and whose
    autograd backward takes about ten passes; :class:`_RMSNormalizeCPU` takes the sum of squares in
    one reduction and has a three-pass backward (about 2x faster forward + backward per call,
    equal to within float rounding).
    """
    if x.device.type == "cpu" and not torch.compiler.is_compiling():
        return _RMSNormalizeCPU.apply(x, eps)
    return F.rms_norm(x, (x.shape[-1],), None, eps)


torch.fx.wrap("rms_normalize")  # torch.fx records one call (it branches on the device), the eager computation


class _RMSNormalizeCPU(torch.autograd.Function):
    """``y = x * r`` with ``r = (mean(x^2) + eps)^(-1/2)``; backward ``r * (g - y * mean(g * y))``.

    The backward follows from ``dr/dx = -r^3 x / d``: ``dx = r g - r^3 x (g . x) / d`` and
    ``r^3 x (g . x) = r y (g . y)``. Only ``y`` and ``r`` are kept for it.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, eps: float) -> torch.Tensor:
        mean_square = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(x.shape[-1])
        r = torch.rsqrt(mean_square.add_(eps))
        y = x * r
        ctx.save_for_backward(y, r)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        y, r = ctx.saved_tensors
        dot = torch.einsum("...d,...d->...", grad, y).unsqueeze(-1)
        return torch.addcmul(grad, y, dot, value=-1.0 / y.shape[-1]).mul_(r), None


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
        y = rms_normalize(x.float(), self.eps)
        return (y if self.weight is None else y * self.weight.float()).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}" + ("" if self.weight is not None else ", affine=False")


def norm_head_groups(x: torch.Tensor, norms: tuple[nn.Module, ...], sizes: tuple[int, ...]) -> torch.Tensor:
    """Normalise ``x [..., heads, d]`` in one call, ``norms[i]`` on the next ``sizes[i]`` heads.

    QK-norm applies one norm to the q heads and another to the k heads. Done separately, that is
    two passes over strided slices of the qkv projection (and the strided input costs a copy in
    PyTorch's CPU ``rms_norm`` with a weight); here the statistics are taken over ``d`` for all
    heads at once (fp32) and the gains are stacked per head: one normalisation and one multiply
    (LayerNorm: one fused ``addcmul`` with its stacked bias), output in the input dtype. Each
    norm keeps its own parameter and state-dict key. Identity norms return ``x`` unchanged; other
    modules (a swapped-in custom norm) run one by one.
    """
    kinds = {type(norm) for norm in norms}
    if kinds == {nn.Identity}:
        return x
    d = x.shape[-1]
    if kinds not in ({RMSNorm}, {nn.LayerNorm}) or len({(norm.eps, *_affine(norm)) for norm in norms}) > 1:
        parts = x.split(sizes, dim=-2)
        return torch.cat([norm(part) for norm, part in zip(norms, parts)], dim=-2)
    first = norms[0]
    xf = x.float()
    if isinstance(first, RMSNorm):
        y = rms_normalize(xf, first.eps)
    else:
        y = F.layer_norm(xf, (d,), None, None, first.eps)
    has_weight, has_bias = _affine(first)
    weight = torch.cat([n.weight.float().expand(k, d) for n, k in zip(norms, sizes)]) if has_weight else None
    bias = torch.cat([n.bias.float().expand(k, d) for n, k in zip(norms, sizes)]) if has_bias else None
    if weight is not None and bias is not None:
        y = torch.addcmul(bias, y, weight)
    elif weight is not None:
        y = y * weight
    elif bias is not None:
        y = y + bias
    return y.to(x.dtype)


def _affine(norm: nn.Module) -> tuple[bool, bool]:
    return getattr(norm, "weight", None) is not None, getattr(norm, "bias", None) is not None


def make_norm(kind: NormKind, dim: int, eps: float = 1e-6) -> nn.Module:
    """Build the norm named by ``kind`` ("rmsnorm" or "layernorm", both with a learned gain)."""
    if kind == "rmsnorm":
        return RMSNorm(dim, eps=eps)
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    raise ValueError(f"unknown norm {kind!r}: use 'rmsnorm' or 'layernorm'")
