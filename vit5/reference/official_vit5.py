"""The official ViT-5 computed the official way, in plain torch: ``models_vit5.py`` / ``rope.py`` of
``wangf3014/ViT-5`` (Apache-2.0) restated with the same parameter names, per-block RoPE from ``sqrt(N)`` and
explicit softmax; positions are made on the input's device (not ``.cuda()``). The tests' and benchmarks'
independent reference: it shares no code with the vit5 model."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class OfficialRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


def official_rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)`` (adjacent pairs, despite the name)."""
    x = x.reshape(*x.shape[:-1], -1, 2)
    x1, x2 = x.unbind(dim=-1)
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


class VisionRotaryEmbedding(nn.Module):
    """``rope.VisionRotaryEmbedding`` with ``freqs_for='lang'``: square grids only, as the original."""

    def __init__(self, dim: int, pt_seq_len: int = 14, theta: float = 10000) -> None:
        super().__init__()
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
        self.pt_seq_len = pt_seq_len
        self.register_buffer("freqs", freqs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, n*n, heads, head_dim]``."""
        n = int(math.sqrt(x.shape[1]))
        t = torch.arange(n, device=x.device) / n * self.pt_seq_len
        freqs = torch.einsum("i,f->if", t, self.freqs).repeat_interleave(2, dim=-1)
        freqs = torch.cat(
            (freqs[:, None, :].expand(n, n, -1), freqs[None, :, :].expand(n, n, -1)), dim=-1
        )  # rows rotate the first half of the head, columns the second
        cos = freqs.cos().view(-1, 1, freqs.shape[-1])
        sin = freqs.sin().view(-1, 1, freqs.shape[-1])
        return x * cos + official_rotate_half(x) * sin


class OfficialAttention(nn.Module):
    def __init__(
        self,
        dim,
        num_heads,
        qkv_bias,
        rope_size,
        rope_reg_size,
        num_registers,
        reg_theta,
        qk_norm,
    ):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.num_registers = num_registers
        self.rope = VisionRotaryEmbedding(head_dim // 2, rope_size) if rope_size > 0 else None
        self.rope_reg = (
            VisionRotaryEmbedding(head_dim // 2, rope_reg_size, theta=reg_theta)
            if rope_reg_size > 0
            else None
        )
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = OfficialRMSNorm(head_dim)
            self.k_norm = OfficialRMSNorm(head_dim)
        # the softmax probabilities of the last call
        self.last_attention: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        reg_idx = N - self.num_registers
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).unbind(dim=2)
        if self.qk_norm:
            q = self.q_norm(q).to(v.dtype)
            k = self.k_norm(k).to(v.dtype)
        if self.rope is not None:
            q = torch.cat((q[:, :1], self.rope(q[:, 1:reg_idx]), q[:, reg_idx:]), dim=1)
            k = torch.cat((k[:, :1], self.rope(k[:, 1:reg_idx]), k[:, reg_idx:]), dim=1)
        if self.rope_reg is not None:
            q = torch.cat((q[:, :reg_idx], self.rope_reg(q[:, reg_idx:])), dim=1)
            k = torch.cat((k[:, :reg_idx], self.rope_reg(k[:, reg_idx:])), dim=1)
        q = q.transpose(1, 2)
        k = k.transpose(1, 2)
        v = v.transpose(1, 2)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        self.last_attention = attn.detach()
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


class OfficialMlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class OfficialBlock(nn.Module):
    def __init__(self, dim, num_heads, norm_layer, init_values, **attn_kwargs):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = OfficialAttention(dim, num_heads, **attn_kwargs)
        self.norm2 = norm_layer(dim)
        self.mlp = OfficialMlp(dim, 4 * dim)
        self.gamma_1 = nn.Parameter(init_values * torch.ones(dim))
        self.gamma_2 = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.gamma_1 * self.attn(self.norm1(x))
        return x + self.gamma_2 * self.mlp(self.norm2(x))


class OfficialPatchEmbed(nn.Module):
    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.img_size = img_size
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        square = (self.img_size, self.img_size)
        assert x.shape[-2:] == square, "the official PatchEmbed accepts only img_size"
        return self.proj(x).flatten(2).transpose(1, 2)


class OfficialViT5(nn.Module):
    """``vit_models`` with ``flash=False`` as the ``vit5_*`` / ``deit_*_patch16_LS`` registrations build
    it."""

    def __init__(
        self,
        img_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 384,
        depth: int = 12,
        num_heads: int = 6,
        qkv_bias: bool = False,
        rmsnorm: bool = True,
        rope: bool = True,
        num_registers: int = 4,
        reg_theta: float = 100,
        qk_norm: bool = True,
        init_scale: float = 1e-4,
    ) -> None:
        super().__init__()
        norm_layer = OfficialRMSNorm if rmsnorm else (lambda d: nn.LayerNorm(d, eps=1e-6))
        self.patch_embed = OfficialPatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.reg_token = None
        if num_registers:
            self.reg_token = nn.Parameter(torch.zeros(1, num_registers, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches, embed_dim))
        reg_side = int(num_registers**0.5)
        self.blocks = nn.ModuleList(
            OfficialBlock(
                embed_dim,
                num_heads,
                norm_layer,
                init_scale,
                qkv_bias=qkv_bias,
                rope_size=img_size // patch_size if rope else 0,
                rope_reg_size=reg_side,
                num_registers=num_registers,
                reg_theta=reg_theta,
                qk_norm=qk_norm,
            )
            for _ in range(depth)
        )
        self.norm = norm_layer(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes else nn.Identity()
        for p in (self.cls_token, self.pos_embed, self.reg_token):
            if p is not None:
                nn.init.trunc_normal_(p, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        x = self.patch_embed(x) + self.pos_embed
        x = torch.cat((self.cls_token.expand(B, -1, -1), x), dim=1)
        if self.reg_token is not None:
            x = torch.cat((x, self.reg_token.expand(B, -1, -1)), dim=1)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)[:, 0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))
