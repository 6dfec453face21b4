"""Learned absolute position embedding (APE) over the patch grid, resampled to any grid."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def resample_pos_embed(
    pos_embed: torch.Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int]
) -> torch.Tensor:
    """Resample a patch-only APE ``[1, h*w, C]`` to ``new_grid`` in fp32 (bicubic, as the official code),
    antialiased only when shrinking (else the stripes of Darcet et al. 2023, App. A; timm's
    ``resample_abs_pos_embed`` antialiases when enlarging too, unlike the official resize). Under
    ``torch.export`` with a symbolic grid the plain interpolation is taken (exact at the stored grid)."""
    h, w = old_grid
    symbolic = torch.compiler.is_exporting() and any(isinstance(s, torch.SymInt) for s in new_grid)
    if not symbolic and tuple(old_grid) == tuple(new_grid):
        return pos_embed
    if pos_embed.shape[1] != h * w:
        raise ValueError(f"position embedding has {pos_embed.shape[1]} rows, not {h}x{w}={h * w}")
    grid = pos_embed.float().reshape(1, h, w, -1).permute(0, 3, 1, 2)
    shrinking = not symbolic and (new_grid[0] < h or new_grid[1] < w)
    grid = F.interpolate(
        grid, size=tuple(new_grid), mode="bicubic", align_corners=False, antialias=shrinking
    )
    return grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], -1).to(pos_embed.dtype)
