"""Axial 2D rotary position embedding (RoPE) with explicit conventions (EVA-02, ViT-5): half the channel
pairs of q and k rotate by the row position, half by the column, ``angle = position * frequency``. Four
conventions must match a checkpoint exactly: ``layout`` (``"interleaved"`` pairs ``(2i, 2i+1)``: official
ViT-5, EVA-02, timm; ``"half"`` ``(i, i + head_dim/2)``: GPT-NeoX, DINOv3), ``axis_order`` (``"yx"``: the
first ``head_dim/4`` pairs take the row angle, official), ``theta`` (bands ``theta ** (-4i / head_dim)``,
``i < head_dim/4``) and ``positions`` (``"integer"`` 0..n-1 per axis, official, new resolutions extrapolate;
``"rescaled"`` ``t = i * ref / n`` onto a reference grid, EVA-02-style interpolation).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

import torch

RopeLayout = Literal["interleaved", "half"]
RopeAxisOrder = Literal["yx", "xy"]
RopePositions = Literal["integer", "rescaled"]


def check_convention(kind: str, value: str, allowed: typing.Any) -> None:
    """ValueError unless ``value`` is one of the ``Literal`` ``allowed`` (the first is the official one)."""
    official, *others = typing.get_args(allowed)
    if value not in (official, *others):
        choices = " or ".join([f"{official!r} (official)", *map(repr, others)])
        raise ValueError(f"unknown RoPE {kind} {value!r}: use {choices}")


def rope_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """The ``head_dim // 4`` frequency bands per axis: ``theta ** (-4i / head_dim)`` (fp64)."""
    if head_dim % 4:
        raise ValueError(f"2D RoPE needs head_dim divisible by 4, got {head_dim}")
    axis_dim = head_dim // 2
    return 1.0 / theta ** (torch.arange(0, axis_dim, 2, dtype=torch.float64)[: axis_dim // 2] / axis_dim)


def rope_angles_2d(
    grid: tuple[int, int],
    freqs: torch.Tensor,
    axis_order: RopeAxisOrder = "yx",
    positions: RopePositions = "integer",
    ref_grid: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Angles ``[h * w, 2 * len(freqs)]`` of every channel pair of every token of a row-major ``grid``;
    ``"rescaled"`` positions map each axis onto ``ref_grid``."""
    check_convention("axis order", axis_order, RopeAxisOrder)
    check_convention("positions", positions, RopePositions)
    if positions == "rescaled" and ref_grid is None:
        raise ValueError("positions='rescaled' needs a reference grid (ref_grid)")
    h, w = grid
    ty, tx = (torch.arange(n, dtype=torch.float64) for n in grid)
    if positions == "rescaled":
        ty, tx = ty / h * ref_grid[0], tx / w * ref_grid[1]
    ay = torch.outer(ty.to(freqs), freqs)[:, None, :].expand(h, w, -1)
    ax = torch.outer(tx.to(freqs), freqs)[None, :, :].expand(h, w, -1)
    return torch.cat([ay, ax] if axis_order == "yx" else [ax, ay], dim=-1).reshape(h * w, -1)


def rope_cos_sin(pair_angles: torch.Tensor, layout: RopeLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand per-pair angles ``[n, head_dim/2]`` to per-channel ``cos, sin`` ``[n, head_dim]``."""
    check_convention("layout", layout, RopeLayout)
    if layout == "interleaved":
        angles = pair_angles.repeat_interleave(2, dim=-1)
    else:
        angles = torch.cat([pair_angles, pair_angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate_pairs(x: torch.Tensor, layout: RopeLayout) -> torch.Tensor:
    """Rotate every channel pair ``(a, b)`` by 90 degrees to ``(-b, a)``."""
    if layout == "interleaved":
        pairs = x.unflatten(-1, (-1, 2))
        return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: RopeLayout) -> torch.Tensor:
    """Rotate ``x [..., n, head_dim]`` by per-token tables ``[n, head_dim]`` in fp32 (a one-off
    :class:`RopeTable`); rows with angle 0 leave their token (CLS) unchanged."""
    return RopeTable(cos, sin, layout).rotate(x)


@dataclass(frozen=True)
class RopeTable:
    """The rotation of every token, built once per grid and shared by every block: per-channel fp32
    ``cos, sin [n, head_dim]`` in ``layout``, for ``x * cos + rotate_pairs(x) * sin``."""

    cos: torch.Tensor
    sin: torch.Tensor
    layout: RopeLayout

    def __post_init__(self) -> None:
        check_convention("layout", self.layout, RopeLayout)

    @classmethod
    def from_angles(cls, pair_angles: torch.Tensor, layout: RopeLayout) -> RopeTable:
        """The table for per-pair angles ``[n, head_dim/2]`` (see :func:`rope_angles_2d`)."""
        return cls(*rope_cos_sin(pair_angles, layout), layout)

    def rows(self, tokens: slice | torch.Tensor) -> RopeTable:
        """The table of some tokens only (e.g. the new ones of a decoding step)."""
        return RopeTable(self.cos[tokens], self.sin[tokens], self.layout)

    @property
    def num_tokens(self) -> int:
        return self.cos.shape[0]

    def rotate(self, x: torch.Tensor, token_dim: int = -2) -> torch.Tensor:
        """Rotate ``x`` whose tokens are on ``token_dim`` in fp32: ``-2`` for ``[B, heads, n, d]``, ``-3``
        for the ``[B, n, heads, d]`` qkv projection (rotated there so q and k need no contiguous copy)."""
        if token_dim >= 0:
            raise ValueError(f"token_dim must count from the end (a negative dim), got {token_dim}")
        x = checked_rope_input(x, self.cos, token_dim)
        trailing = (1,) * (-token_dim - 2)  # the dims between tokens and channels (heads)
        cos = self.cos.reshape(self.cos.shape[0], *trailing, -1)
        sin = self.sin.reshape(self.sin.shape[0], *trailing, -1)
        xf = x.float()
        return (xf * cos + rotate_pairs(xf, self.layout) * sin).to(x.dtype)


def checked_rope_input(x: torch.Tensor, table: torch.Tensor, token_dim: int) -> torch.Tensor:
    """``x`` itself, after checking it has as many tokens on ``token_dim`` as ``table`` has rows."""
    if x.shape[token_dim] != table.shape[0]:
        raise ValueError(
            f"a RoPE table of {table.shape[0]} tokens cannot rotate a tensor of shape {tuple(x.shape)} "
            f"on dim {token_dim}"
        )
    return x


torch.fx.wrap("checked_rope_input")  # a call under torch.fx (a proxy has no sizes): traced models check too


@dataclass(frozen=True)
class Rope2D:
    """One axial 2D RoPE convention (see the module docstring): theta is 1e4 for ViT-5 patches, 100 for its
    registers; ``ref_grid`` is the reference grid of ``positions="rescaled"`` (the training grid)."""

    head_dim: int
    theta: float = 10000.0
    layout: RopeLayout = "interleaved"
    axis_order: RopeAxisOrder = "yx"
    positions: RopePositions = "integer"
    ref_grid: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        rope_frequencies(self.head_dim, self.theta)  # validates head_dim now, not at the first forward

    def angles(self, grid: tuple[int, int], device: torch.device | str | None = None) -> torch.Tensor:
        """Pair angles ``[h * w, head_dim/2]`` in fp32; the bands are not a buffer, so ``model.to(bfloat16)``
        cannot round them (bf16 angles are off by up to 0.07 rad)."""
        freqs = rope_frequencies(self.head_dim, self.theta).to(device=device, dtype=torch.float32)
        return rope_angles_2d(grid, freqs, self.axis_order, self.positions, self.ref_grid)
