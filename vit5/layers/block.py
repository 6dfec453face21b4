"""Transformer block. Pre-norm (ViT-5) ``x + drop(ls(F(norm(x))))`` keeps an exact identity on the residual
path (Xiong et al., 2020); post-norm ``norm(x + drop(ls(F(x))))`` is kept for the ablation. LayerScale
(Touvron et al., CaiT 2021) starts each branch near zero (1e-4 in ViT-5)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vit5.layers.attention import Attention, AttentionConfig, Rope
from vit5.layers.drop import DropPath
from vit5.layers.mlp import Mlp, MlpKind, SwiGLU
from vit5.layers.norm import NormKind, make_norm


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
    mlp: MlpKind = "gelu"
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
        self.ls1 = LayerScale(dim, cfg.layer_scale) if cfg.layer_scale is not None else nn.Identity()
        self.drop_path1 = DropPath(cfg.drop_path)
        self.norm2 = make_norm(cfg.norm, dim, cfg.norm_eps)
        mlp_cls = SwiGLU if cfg.mlp == "swiglu" else Mlp
        self.mlp = mlp_cls(dim, cfg.mlp_hidden_dim or 4 * dim, bias=cfg.mlp_bias)
        self.ls2 = LayerScale(dim, cfg.layer_scale) if cfg.layer_scale is not None else nn.Identity()
        self.drop_path2 = DropPath(cfg.drop_path)

    def forward(self, x: torch.Tensor, rope: Rope = None, **attn_kwargs: Any) -> torch.Tensor:
        """``rope``, ``attn_kwargs`` (``causal``, ``kv_cache``): those of :meth:`Attention.forward`."""
        if self.pre_norm:
            x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), rope, **attn_kwargs)))
            return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        x = self.norm1(x + self.drop_path1(self.ls1(self.attn(x, rope, **attn_kwargs))))
        return self.norm2(x + self.drop_path2(self.ls2(self.mlp(x))))
