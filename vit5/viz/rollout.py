"""Attention rollout (Abnar and Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020).

Each layer's attention is fused over heads, mixed with the identity for the residual path and
renormalised per row, ``A_hat = rows(0.5 * fuse(A) + 0.5 * I)``; the rollout is the product
``R = A_hat_L ... A_hat_1``. Row ``i`` of ``R`` says how much each input token flows into token
``i`` at the output. The CLS row over the patch columns is the usual map; registers are ordinary
columns of ``R`` and are sliced off by the :class:`~vit5.TokenLayout`, never by position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from vit5.model import TokenLayout

HeadFusion = Literal["mean", "max", "min"]


def rollout_step(
    acc: torch.Tensor | None,
    attention: torch.Tensor,
    head_fusion: HeadFusion = "mean",
    residual: float = 0.5,
) -> torch.Tensor:
    """Fold one layer ``[B, heads, N, N]`` into the running product ``acc [B, N, N]`` (None at the start)."""
    if head_fusion == "mean":
        fused = attention.float().mean(dim=1)
    elif head_fusion == "max":
        fused = attention.float().amax(dim=1)
    elif head_fusion == "min":
        fused = attention.float().amin(dim=1)
    else:
        raise ValueError(f"head_fusion must be 'mean', 'max' or 'min', got {head_fusion!r}")
    eye = torch.eye(fused.shape[-1], device=fused.device, dtype=fused.dtype)
    mixed = residual * eye + (1.0 - residual) * fused
    mixed = mixed / mixed.sum(dim=-1, keepdim=True)
    return mixed if acc is None else mixed @ acc


def attention_rollout(
    attentions: Sequence[torch.Tensor], head_fusion: HeadFusion = "mean", residual: float = 0.5
) -> torch.Tensor:
    """Rollout ``[B, N, N]`` of the per-layer attentions given from the first block to the last."""
    acc = None
    for attention in attentions:
        acc = rollout_step(acc, attention, head_fusion, residual)
    return acc


def rollout_source_row(rollout: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """The row read off for maps ``[B, N]``: CLS, or the mean over patch rows for models without CLS."""
    if layout.cls_index is not None:
        return rollout[:, layout.cls_index]
    return layout.patches(rollout, dim=1).mean(dim=1)
