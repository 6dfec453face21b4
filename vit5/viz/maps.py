"""Per-image maps ``[..., h, w]`` read off :class:`TokenStats`: the numbers every figure draws.

All slicing goes through the stored :class:`~vit5.TokenLayout`, so the maps are right for
either token order and for non-square grids. ``layer`` is a block index as recorded.
"""

from __future__ import annotations

import numpy as np

from vit5.errors import InputError
from vit5.viz.stats import TokenStats


def cls_maps(stats: TokenStats, image: int, layer: int, renormalise: bool = False) -> np.ndarray:
    """CLS-to-patch attention per head ``[H, h, w]``: raw (the share of *all* tokens) or renormalised over
    patches."""
    if stats.cls_attn is None:
        raise InputError(
            f"{stats.model} has no CLS token, so there is no CLS attention to show (use rollout or norms)"
        )
    rows = stats.patch_values(stats.cls_attn[image, stats.layer_position(layer)])
    if renormalise:
        rows = rows / rows.sum(axis=-1, keepdims=True)
    return stats.to_grid(rows)


def received_map(stats: TokenStats, image: int, layer: int) -> np.ndarray:
    """Attention each patch receives, averaged over all queries and heads ``[h, w]`` (raw): the
    attention map of a model without CLS token, where sinks show as bright patches."""
    return stats.to_grid(stats.patch_values(stats.received[image, stats.layer_position(layer)].mean(axis=0)))


def register_maps(stats: TokenStats, image: int, layer: int) -> np.ndarray:
    """Register-to-patch attention ``[R, h, w]`` (raw, head mean), one map per register."""
    if stats.reg_attn is None:
        raise InputError(
            f"{stats.model} has no register tokens (R=0), so there are no register attention maps: "
            "pick a model with registers (e.g. vit5_*, or a timm *_reg4_* model)"
        )
    rows = stats.patch_values(stats.reg_attn[image, stats.layer_position(layer)])  # [H, R, P]
    return stats.to_grid(rows.mean(axis=0))


def norm_map(stats: TokenStats, image: int, layer: int) -> np.ndarray:
    """L2 norm of each patch token's block output (before the final norm) ``[h, w]``."""
    return stats.to_grid(stats.patch_values(stats.norms[image, stats.layer_position(layer)]))


def rollout_map(stats: TokenStats, image: int) -> np.ndarray:
    """Attention-rollout row (CLS, or the patch mean without CLS) over the patches ``[h, w]``, raw."""
    return stats.to_grid(stats.patch_values(stats.rollout[image]))


def outlier_map(outliers: np.ndarray, stats: TokenStats, image: int, layer: int) -> np.ndarray:
    """The outlier patches ``[h, w]`` of a metric report's mask ``[B, L, P]``."""
    return stats.to_grid(outliers[image, stats.layer_position(layer)])
