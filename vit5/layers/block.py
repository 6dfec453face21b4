"""Transformer block. Pre-norm (ViT-5) ``x + drop(ls(F(norm(x))))`` keeps an exact identity on the residual
path (Xiong et al., 2020); post-norm ``norm(x + drop(ls(F(x))))`` is kept for the ablation. LayerScale
(Touvron et al., CaiT 2021) starts each branch near zero (1e-4 in ViT-5). Module and key names follow timm's
(``fc1``/``fc2``, exact GELU) so its weights load unchanged."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from vit5.layers.attention import Attention, AttentionConfig, Rope
from vit5.layers.norm import NormKind, make_norm


def swiglu_hidden_dim(dim: int, mlp_ratio: float = 4.0, multiple_of: int = 64) -> int:
    """Hidden width of a SwiGLU matching a GELU MLP of ``mlp_ratio * dim``: ``2/3`` of it, rounded up."""
    return multiple_of * math.ceil(2 * mlp_ratio * dim / 3 / multiple_of)


class Mlp(nn.Module):
    """``fc2(gelu(fc1(x)))`` with the exact (erf) GELU, as timm's ``Mlp``."""

    def __init__(self, dim: int, hidden_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SwiGLU(Mlp):
    """``fc2(silu(gate) * up)`` (Shazeer, 2020); ``fc1`` packs ``[gate | up]`` as timm's ``SwiGLUPacked``.
    At hidden ``8d/3`` it has the parameters of a ``4d`` GELU MLP, the only fair comparison."""

    def __init__(self, dim: int, hidden_dim: int, bias: bool = False) -> None:
        super().__init__(dim, hidden_dim, bias)
        self.fc1 = nn.Linear(dim, 2 * hidden_dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc1(x).chunk(2, dim=-1)
        return self.fc2(F.silu(gate) * up)


class DropPath(nn.Module):
    """Stochastic depth (Huang et al., arXiv 1603.09382): zero the branch for a random ``rate`` of the
    samples while training and rescale the rest by ``1/(1-rate)``."""

    def __init__(self, rate: float = 0.0) -> None:
        super().__init__()
        self.rate = rate

    def factors(self, x: torch.Tensor) -> torch.Tensor | None:
        """Per-sample factors ``[B, 1, ...]`` of this call (0: dropped, ``1/(1-rate)``: kept), or
        None when nothing is dropped (rate 0, or evaluation)."""
        if self.rate == 0.0 or not self.training:
            return None
        keep = 1.0 - self.rate
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        return x.new_empty(shape).bernoulli_(keep).div_(keep)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        factors = self.factors(x)
        return x if factors is None else x * factors


class LayerScale(nn.Module):
    """Per-channel gain ``gamma`` (timm's key name ``ls1.gamma``; ViT-5 stores it as ``gamma_1``)."""

    def __init__(self, dim: int, init: float = 1e-4) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


@dataclass(frozen=True)
class BlockConfig:
    attn: AttentionConfig
    mlp: Literal["gelu", "swiglu"] = "gelu"
    mlp_hidden_dim: int = 0  # 0: 4 * dim
    mlp_bias: bool = True
    norm: NormKind = "rmsnorm"
    norm_eps: float = 1e-6
    layer_scale: float | None = 1e-4  # None: no LayerScale
    pre_norm: bool = True
    drop_path: float = 0.0


class Block(nn.Module):
    """One transformer block; submodule names follow timm (``norm1, attn, ls1, norm2, mlp, ls2``)."""

    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        dim = cfg.attn.dim
        self.pre_norm = cfg.pre_norm
        self.norm1 = make_norm(cfg.norm, dim, cfg.norm_eps)
        self.attn = Attention(cfg.attn)
        self.ls1 = (
            LayerScale(dim, cfg.layer_scale) if cfg.layer_scale is not None else nn.Identity()
        )
        self.drop_path1 = DropPath(cfg.drop_path)
        self.norm2 = make_norm(cfg.norm, dim, cfg.norm_eps)
        mlp_cls = SwiGLU if cfg.mlp == "swiglu" else Mlp
        self.mlp = mlp_cls(dim, cfg.mlp_hidden_dim or 4 * dim, bias=cfg.mlp_bias)
        self.ls2 = (
            LayerScale(dim, cfg.layer_scale) if cfg.layer_scale is not None else nn.Identity()
        )
        self.drop_path2 = DropPath(cfg.drop_path)

    def forward(self, x: torch.Tensor, rope: Rope = None, **attn_kwargs: Any) -> torch.Tensor:
        """``rope``, ``attn_kwargs`` (``causal``, ``kv_cache``): those of :meth:`Attention.forward`."""
        if self.pre_norm:
            y = self.attn(self.norm1(x), rope, **attn_kwargs)
            x = add_branch(x, y, self.ls1, self.drop_path1)
            return add_branch(x, self.mlp(self.norm2(x)), self.ls2, self.drop_path2)
        y = self.attn(x, rope, **attn_kwargs)
        x = self.norm1(add_branch(x, y, self.ls1, self.drop_path1))
        return self.norm2(add_branch(x, self.mlp(x), self.ls2, self.drop_path2))


def add_branch(x: torch.Tensor, y: torch.Tensor, ls: nn.Module, drop: DropPath) -> torch.Tensor:
    """The residual update ``x + drop(ls(y))`` as one ``addcmul(x, y, scale)``: the LayerScale gain
    ``[C]`` and the drop-path factors ``[B, 1, 1]`` are multiplied first (small tensors), so ``y`` is
    read once instead of ``ls(y)`` and ``drop(...)`` being written out in full (docs/speed.md)."""
    scale = ls.gamma if isinstance(ls, LayerScale) else None  # else nn.Identity: no LayerScale
    factors = drop.factors(y)
    if factors is not None:
        scale = factors if scale is None else factors * scale
    return x + y if scale is None else torch.addcmul(x, y, scale)
