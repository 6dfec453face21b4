"""Patch embedding: a ``p x p`` stride-``p`` convolution (as timm's PatchEmbed) that accepts any image whose
sides are patch multiples. The input checks are a ``torch.fx`` leaf, so traced models still check inputs."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vit5.errors import InputError


def round_to_patch(hw: Sequence[float], patch_size: int) -> tuple[int, int]:
    """Each side rounded to the nearest multiple of ``patch_size`` (at least one patch)."""
    return tuple(max(patch_size, int(round(side / patch_size)) * patch_size) for side in hw)  # type: ignore[return-value]


def grid_of(
    image_hw: Sequence[int],
    patch_size: int,
    fix: str = "resize or crop the input to {h}x{w} (height x width)",
    error: type[Exception] = InputError,
) -> tuple[int, int]:
    """Token grid ``(H / p, W / p)`` of an image: the toolkit's one patch-multiple check, else ``error``
    naming the nearest valid size through ``fix`` (a format string of ``h`` and ``w``)."""
    h, w = image_hw
    p = patch_size
    if p < 1 or h % p or w % p or h < p or w < p:
        fix_h, fix_w = round_to_patch((h, w), max(p, 1))
        raise error(
            f"image size {h}x{w} is not a positive multiple of the patch size {p}: "
            + fix.format(h=fix_h, w=fix_w)
        )
    return h // p, w // p


def checked_images(x: torch.Tensor, in_chans: int, patch_size: int) -> torch.Tensor:
    """``x`` itself, after checking it is a float ``[B, in_chans, H, W]`` batch of patch-multiple sides."""
    if x.ndim != 4 or x.shape[1] != in_chans:
        raise InputError(
            f"expected images of shape [batch, {in_chans}, height, width], got {tuple(x.shape)}"
            + (": add a batch dimension with x.unsqueeze(0)" if x.ndim == 3 else "")
        )
    if not x.is_floating_point():
        raise InputError(
            f"expected float images (normalised, e.g. x.float() / 255 then mean/std), got {x.dtype}"
        )
    grid_of((x.shape[-2], x.shape[-1]), patch_size)
    return x


torch.fx.wrap("checked_images")


class PatchEmbed(nn.Module):
    def __init__(
        self, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768, bias: bool = True
    ) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.in_chans = in_chans
        self.proj = nn.Conv2d(
            in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, bias=bias
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(checked_images(x, self.in_chans, self.patch_size))
