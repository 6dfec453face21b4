"""Multi-head self-attention: fused bias-free qkv, QK-Norm (Henry et al., 2020) before RoPE on q and k only,
grouped-query heads (Ainslie et al., 2023; K/V never repeated in memory), the ``"sdpa"``, ``"flash_attn"`` and
``"eager"`` kernels, an optional causal mode with a KV cache. q, k and v stay views of the projection (no
copy). Set ``recorder`` to a callable to get ``(q, k, scale, causal)`` after QK-Norm and RoPE, key heads
expanded to the query heads (``vit5.model.capture.summarise_attention``); the output keeps its kernel.
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
Rope = RopeTable | tuple[torch.Tensor, torch.Tensor] | None  # a table, or per-token (cos, sin)


@dataclass(frozen=True)
class AttentionConfig:
    """Shape and switches of one attention layer."""

    dim: int
    num_heads: int
    num_kv_heads: int | None = None  # None: as many as num_heads (MHA)
    qkv_bias: bool = False
    qk_norm: bool = True
    norm: NormKind = "rmsnorm"
    norm_eps: float = 1e-6
    backend: AttentionBackend = "sdpa"
    rope_layout: RopeLayout = "interleaved"

    def __post_init__(self) -> None:
        kv = self.kv_heads
        if self.dim % self.num_heads:
            raise ValueError(f"dim {self.dim} is not divisible by num_heads {self.num_heads}")
        if kv < 1 or self.num_heads % kv:
            raise ValueError(f"num_heads {self.num_heads} is not divisible by num_kv_heads {kv}")
        if self.backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"unknown attention backend {self.backend!r}: use one of {ATTENTION_BACKENDS}"
            )

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads


def causal_mask(
    num_queries: int, num_keys: int, device: torch.device | None = None
) -> torch.Tensor:
    """Boolean mask, True = attend: the queries are the last ``num_queries`` of ``num_keys`` tokens."""
    return torch.ones(num_queries, num_keys, dtype=torch.bool, device=device).tril(
        num_keys - num_queries
    )


def eager_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit ``softmax(q k^T / sqrt(d)) v`` (fp32 softmax) of ``q [B, H, N, d]``, ``k, v [B, H_kv, M, d]``,
    query head ``h`` reading kv head ``h // (H / H_kv)`` as SDPA's ``enable_gqa``; (output, probs)."""
    b, h, n, d = q.shape
    h_kv = k.shape[1]
    m = k.shape[2]
    qg = q.reshape(b, h_kv, h // h_kv, n, d)
    scores = (qg * d**-0.5) @ k.unsqueeze(2).transpose(-2, -1)  # [B, H_kv, G, N, M]
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    probs = scores.float().softmax(dim=-1).to(q.dtype)
    return (probs @ v.unsqueeze(2)).reshape(b, h, n, d), probs.reshape(b, h, n, m)


class Attention(nn.Module):
    """Self-attention as configured by :class:`AttentionConfig` (state-dict keys as timm / ViT-5)."""

    def __init__(self, cfg: AttentionConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.kv_heads
        self.head_dim = cfg.head_dim
        self.backend = cfg.backend
        self.rope_layout = cfg.rope_layout
        qkv_out = (cfg.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv = nn.Linear(cfg.dim, qkv_out, bias=cfg.qkv_bias)
        self.q_norm = (
            make_norm(cfg.norm, self.head_dim, cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        )
        self.k_norm = (
            make_norm(cfg.norm, self.head_dim, cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        )
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.recorder: Callable[[torch.Tensor, torch.Tensor, float, bool], None] | None = None

    def forward(
        self,
        x: torch.Tensor,
        rope: Rope = None,
        causal: bool = False,
        kv_cache: LayerKVCache | None = None,
    ) -> torch.Tensor:
        """``x [B, N, C]``; ``rope``: a :class:`RopeTable` of N tokens, per-token ``(cos, sin)``,
        or None."""
        b, n, c = x.shape
        h = self.num_heads
        h_kv = self.num_kv_heads
        qkv = self.qkv(x).unflatten(-1, (-1, self.head_dim))  # [B, N, H + 2 H_kv, d]
        q, k, v = qkv.split((h, h_kv, h_kv), dim=2)
        q = self.q_norm(q)
        k = self.k_norm(k)
        if rope is not None:
            table = self.checked_table(rope)
            q = table.rotate(q, token_dim=-3)
            k = table.rotate(k, token_dim=-3)
        if kv_cache is not None:
            if not causal:
                raise ValueError(
                    "a KV cache only makes sense for causal attention: pass causal=True"
                )
            k, v = kv_cache.append(k.transpose(1, 2), v.transpose(1, 2))
        else:
            k = k.transpose(1, 2)
            v = v.transpose(1, 2)
        out = self._attend(q.transpose(1, 2), k, v, causal)  # [B, heads, N, d]
        return self.proj(out.transpose(1, 2).reshape(b, n, c))

    def checked_table(self, rope: RopeTable | tuple[torch.Tensor, torch.Tensor]) -> RopeTable:
        """``rope`` as a :class:`RopeTable` in this layer's layout (a ``(cos, sin)`` pair becomes
        one); ValueError for a table in another layout."""
        if not isinstance(rope, RopeTable):
            return RopeTable(rope[0], rope[1], self.rope_layout)
        if rope.layout != self.rope_layout:
            raise ValueError(
                f"a RoPE table in the {rope.layout!r} layout for attention in {self.rope_layout!r}"
            )
        return rope

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
    ) -> torch.Tensor:
        n = q.shape[-2]
        m = k.shape[-2]
        needs_mask = causal and n > 1
        if self.recorder is not None:
            group = self.num_heads // self.num_kv_heads
            self.recorder(q, k.repeat_interleave(group, dim=1), self.head_dim**-0.5, needs_mask)
        if self.backend == "eager":
            mask = causal_mask(n, m, q.device) if needs_mask else None
            return eager_attention(q, k, v, mask)[0]
        if self.backend == "flash_attn":
            return self._flash(q, k, v, causal)
        gqa = self.num_kv_heads != self.num_heads
        if needs_mask and n != m:
            return F.scaled_dot_product_attention(
                q, k, v, causal_mask(n, m, q.device), enable_gqa=gqa
            )
        return F.scaled_dot_product_attention(q, k, v, is_causal=needs_mask, enable_gqa=gqa)

    def _flash(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
    ) -> torch.Tensor:
        try:
            from flash_attn import flash_attn_func
        except ImportError as err:
            raise RuntimeError(
                "attention backend 'flash_attn' needs the flash-attn package, which is not installed: "
                "`pip install 'vit5[flash]'` on a CUDA machine, or use backend 'sdpa' (PyTorch's own "
                "FlashAttention kernel)"
            ) from err
        if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
            raise RuntimeError(
                f"attention backend 'flash_attn' runs on CUDA in fp16/bf16, got {q.dtype} on {q.device}: "
                "use autocast(dtype=torch.bfloat16) on a GPU, or backend 'sdpa'"
            )
        return flash_attn_func(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal
        ).transpose(1, 2)
