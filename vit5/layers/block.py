"""Transformer block: norm placement, LayerScale and stochastic depth around attention and MLP.

Pre-norm (default, ViT-5): ``x + drop(ls(F(norm(x))))``; the residual path keeps an exact
identity, so no normalisation Jacobian accumulates over depth (Xiong et al., 2020). Post-norm
(``norm(x + drop(ls(F(x))))``, the 2017 Transformer) is kept for the ablation.

LayerScale (Touvron et al., CaiT 2021) multiplies each branch by a per-channel gain initialised
small (1e-4 in ViT-5), so the network starts near the identity and learns each branch's volume.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vit5.layers.attention import Attention, AttentionConfig
from vit5.layers.drop import DropPath
from vit5.layers.kv_cache import LayerKVCache
from vit5.layers.mlp import Mlp, MlpKind, SwiGLU
from vit5.layers.norm import NormKind, make_norm
from vit5.layers.rope import RopeTable


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
    mlp_drop: float = 0.0


class Block(nn.Module):
    """One transformer block; submodule names follow timm (``norm1, attn, ls1, norm2, mlp, ls2``)."""

    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        dim = cfg.attn.dim
        hidden = cfg.mlp_hidden_dim or 4 * dim
        self.pre_norm = cfg.pre_norm
        self.norm1 = make_norm(cfg.norm, dim, cfg.norm_eps)
        self.attn = Attention(cfg.attn)
        self.ls1 = LayerScale(dim, cfg.layer_scale) if cfg.layer_scale is not None else nn.Identity()
        self.drop_path1 = DropPath(cfg.drop_path)
        self.norm2 = make_norm(cfg.norm, dim, cfg.norm_eps)
        mlp_cls = SwiGLU if cfg.mlp == "swiglu" else Mlp
        self.mlp = mlp_cls(dim, hidden, bias=cfg.mlp_bias, drop=cfg.mlp_drop)
        self.ls2 = LayerScale(dim, cfg.layer_scale) if cfg.layer_scale is not None else nn.Identity()
        self.drop_path2 = DropPath(cfg.drop_path)

    def forward(
        self,
        x: torch.Tensor,
        rope: RopeTable | tuple[torch.Tensor, torch.Tensor] | None = None,
        causal: bool = False,
        kv_cache: LayerKVCache | None = None,
    ) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), rope, causal, kv_cache)))
            return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        x = self.norm1(x + self.drop_path1(self.ls1(self.attn(x, rope, causal, kv_cache))))
        return self.norm2(x + self.drop_path2(self.ls2(self.mlp(x))))
