"""Multi-head self-attention with QK-Norm, 2D RoPE, grouped-query heads and selectable kernels.

- Fused ``qkv`` projection (ViT-5: no bias), output projection with bias.
- QK-Norm (Henry et al., 2020): a norm over ``head_dim`` on q and k, **before** RoPE (ViT-5, timm).
- RoPE rotates q and k only; v is never rotated. The per-token :class:`~vit5.layers.rope.RopeTable`
  comes from the model (built once per grid, shared by every block); rows with angle 0 leave a
  token (CLS) unrotated.
- q, k and v are views of the qkv projection: no ``.contiguous()`` copy on the way to the kernel
  or back.
- Grouped-query attention (Ainslie et al., 2023): ``num_kv_heads`` key/value heads shared by
  groups of query heads (MHA when equal to ``num_heads``, MQA at 1). Kernels use their own GQA
  support; K/V are never repeated in memory.
- Backends: ``"sdpa"`` (PyTorch picks FlashAttention / memory-efficient / math), ``"flash_attn"``
  (the flash-attn package, CUDA, fp16/bf16) and ``"eager"`` (explicit softmax).
- Optional causal mode with a :class:`~vit5.layers.kv_cache.LayerKVCache` for decoding.

Attention probabilities are never returned by fused kernels. For analysis, set ``recorder`` to a
callable: the module then runs the explicit path in fp32 and hands it ``[B, heads, N, N]``
(see ``vit5.model.capture``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from vit5.layers.kv_cache import LayerKVCache
from vit5.layers.norm import NormKind, make_norm
from vit5.layers.rope import RopeLayout, RopeTable

AttentionBackend = Literal["sdpa", "flash_attn", "eager"]
ATTENTION_BACKENDS: tuple[str, ...] = ("sdpa", "flash_attn", "eager")


@dataclass(frozen=True)
class AttentionConfig:
    """Shape and switches of one attention layer."""

    dim: int
    num_heads: int
    num_kv_heads: int | None = None  # None: as many as num_heads (MHA)
    qkv_bias: bool = False
    proj_bias: bool = True
    qk_norm: bool = True
    norm: NormKind = "rmsnorm"
    norm_eps: float = 1e-6
    backend: AttentionBackend = "sdpa"
    rope_layout: RopeLayout = "interleaved"
    attn_drop: float = 0.0
    proj_drop: float = 0.0

    def __post_init__(self) -> None:
        kv = self.kv_heads
        if self.dim % self.num_heads:
            raise ValueError(f"dim {self.dim} is not divisible by num_heads {self.num_heads}")
        if kv < 1 or self.num_heads % kv:
            raise ValueError(f"num_heads {self.num_heads} is not divisible by num_kv_heads {kv}")
        if self.backend not in ATTENTION_BACKENDS:
            raise ValueError(f"unknown attention backend {self.backend!r}: use one of {ATTENTION_BACKENDS}")

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads


def causal_mask(num_queries: int, num_keys: int, device: torch.device | None = None) -> torch.Tensor:
    """Boolean mask, True = attend: the queries are the last ``num_queries`` of ``num_keys`` tokens."""
    offset = num_keys - num_queries
    rows = torch.arange(num_queries, device=device)[:, None] + offset
    return torch.arange(num_keys, device=device)[None, :] <= rows


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit ``softmax(q k^T / sqrt(d)) v`` with grouped heads; returns (output, probabilities).

    ``q [B, H, N, d]``, ``k, v [B, H_kv, M, d]``; query head ``h`` reads kv head ``h // (H / H_kv)``
    (the convention of SDPA's ``enable_gqa``). The softmax is taken in fp32.
    """
    b, h, n, d = q.shape
    h_kv, m = k.shape[1], k.shape[2]
    qg = q.reshape(b, h_kv, h // h_kv, n, d)
    scores = (qg * d**-0.5) @ k.unsqueeze(2).transpose(-2, -1)  # [B, H_kv, G, N, M]
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    probs = scores.float().softmax(dim=-1).to(q.dtype)
    dropped = F.dropout(probs, dropout_p) if dropout_p > 0 else probs
    out = dropped @ v.unsqueeze(2)
    return out.reshape(b, h, n, d), probs.reshape(b, h, n, m)


def _flash_attn_func() -> Callable:
    try:
        from flash_attn import flash_attn_func
    except ImportError as err:
        raise RuntimeError(
            "attention backend 'flash_attn' needs the flash-attn package, which is not installed: "
            "`pip install 'vit5[flash]'` on a CUDA machine, or use backend 'sdpa' (PyTorch's own "
            "FlashAttention kernel)"
        ) from err
    return flash_attn_func


class Attention(nn.Module):
    """Self-attention as configured by :class:`AttentionConfig` (state-dict keys as timm / ViT-5)."""

    def __init__(self, cfg: AttentionConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.kv_heads
        self.head_dim = cfg.head_dim
        self.backend = cfg.backend
        self.rope_layout = cfg.rope_layout
        self.attn_drop = cfg.attn_drop
        qkv_out = (cfg.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv = nn.Linear(cfg.dim, qkv_out, bias=cfg.qkv_bias)
        self.q_norm = make_norm(cfg.norm, self.head_dim, cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        self.k_norm = make_norm(cfg.norm, self.head_dim, cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        self.proj = nn.Linear(cfg.dim, cfg.dim, bias=cfg.proj_bias)
        self.proj_drop = nn.Dropout(cfg.proj_drop)
        self.recorder: Callable[[torch.Tensor], None] | None = None

    def forward(
        self,
        x: torch.Tensor,
        rope: RopeTable | tuple[torch.Tensor, torch.Tensor] | None = None,
        causal: bool = False,
        kv_cache: LayerKVCache | None = None,
    ) -> torch.Tensor:
        """``x [B, N, C]``; ``rope`` = a :class:`RopeTable` of N tokens, per-token ``(cos, sin)
        [N, head_dim]``, or None.

        q, k and v are views of the projection's ``[B, N, heads, head_dim]`` layout (QK-norm and RoPE
        read them there); SDPA's output (token-major on PyTorch's CPU and CUDA kernels) becomes
        ``[B, N, C]`` without a copy.
        """
        b, n, c = x.shape
        h, h_kv = self.num_heads, self.num_kv_heads
        qkv = self.qkv(x).unflatten(-1, (-1, self.head_dim))  # [B, N, H + 2 H_kv, d]
        q, k, v = qkv.split((h, h_kv, h_kv), dim=2)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            if not isinstance(rope, RopeTable):
                rope = RopeTable(*rope, self.rope_layout)
            elif rope.layout != self.rope_layout:
                raise ValueError(
                    f"a RoPE table in the {rope.layout!r} layout for attention in {self.rope_layout!r}"
                )
            q, k = rope.rotate(q, token_dim=-3), rope.rotate(k, token_dim=-3)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, N, d]
        if kv_cache is not None:
            if not causal:
                raise ValueError("a KV cache only makes sense for causal attention: pass causal=True")
            k, v = kv_cache.append(k, v)
        out = self._attend(q, k, v, causal)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        n, m = q.shape[-2], k.shape[-2]
        dropout_p = self.attn_drop if self.training else 0.0
        needs_mask = causal and n > 1
        if self.recorder is not None or self.backend == "eager":
            mask = causal_mask(n, m, q.device) if needs_mask else None
            if self.recorder is None:
                return eager_attention(q, k, v, mask, dropout_p)[0]
            out, probs = eager_attention(q.float(), k.float(), v.float(), mask, dropout_p)
            self.recorder(probs)
            return out.to(v.dtype)
        if self.backend == "flash_attn":
            return self._flash(q, k, v, causal, dropout_p)
        gqa = self.num_kv_heads != self.num_heads
        if needs_mask and n != m:
            mask = causal_mask(n, m, q.device)
            return F.scaled_dot_product_attention(q, k, v, mask, dropout_p, enable_gqa=gqa)
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=needs_mask, enable_gqa=gqa
        )

    def _flash(self, q, k, v, causal: bool, dropout_p: float) -> torch.Tensor:
        flash_attn_func = _flash_attn_func()
        if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
            raise RuntimeError(
                f"attention backend 'flash_attn' runs on CUDA in fp16/bf16, got {q.dtype} on {q.device}: "
                "use autocast(dtype=torch.bfloat16) on a GPU, or backend 'sdpa'"
            )
        out = flash_attn_func(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=dropout_p, causal=causal
        )
        return out.transpose(1, 2)
