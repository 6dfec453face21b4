"""Axial 2D rotary position embedding (RoPE) with explicit conventions (EVA-02, arXiv 2303.11331; ViT-5):
half the channel pairs of q and k rotate by the row position, half by the column, ``angle = position *
frequency``. Four conventions must match a checkpoint exactly: ``layout`` (``"interleaved"`` pairs
``(2i, 2i+1)``: official ViT-5, EVA-02, timm; ``"half"`` ``(i, i + head_dim/2)``: GPT-NeoX, DINOv3),
``axis_order`` (``"yx"``: the first ``head_dim/4`` pairs take the row angle, official), ``theta`` (bands
``theta ** (-4i / head_dim)``, ``i < head_dim/4``) and ``positions`` (``"integer"`` 0..n-1 per axis,
official, new resolutions extrapolate; ``"rescaled"`` ``t = i * ref / n`` onto a reference grid, EVA-02's
interpolation).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Literal

import torch

RopeLayout = Literal["interleaved", "half"]
RopeAxisOrder = Literal["yx", "xy"]
RopePositions = Literal["integer", "rescaled"]


def check_convention(kind: str, value: str, allowed: typing.Any) -> None:
    """ValueError unless ``value`` is one of the ``Literal`` ``allowed`` (the first is the official
    one)."""
    official, *others = typing.get_args(allowed)
    if value not in (official, *others):
        choices = " or ".join([f"{official!r} (official)", *map(repr, others)])
        raise ValueError(f"unknown RoPE {kind} {value!r}: use {choices}")


def rope_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """The ``head_dim // 4`` frequency bands per axis: ``theta ** (-4i / head_dim)`` (fp64)."""
    if head_dim % 4:
        raise ValueError(f"2D RoPE needs head_dim divisible by 4, got {head_dim}")
    axis_dim = head_dim // 2
    bands = torch.arange(0, axis_dim, 2, dtype=torch.float64)[: axis_dim // 2]
    return 1.0 / theta ** (bands / axis_dim)


def rope_angles_2d(
    grid: tuple[int, int],
    freqs: torch.Tensor,
    axis_order: RopeAxisOrder = "yx",
    positions: RopePositions = "integer",
    ref_grid: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Angles ``[h * w, 2 * len(freqs)]`` of every channel pair of every token of a row-major
    ``grid``; ``"rescaled"`` positions map each axis onto ``ref_grid``."""
    check_convention("axis order", axis_order, RopeAxisOrder)
    check_convention("positions", positions, RopePositions)
    if positions == "rescaled" and ref_grid is None:
        raise ValueError("positions='rescaled' needs a reference grid (ref_grid)")
    h, w = grid
    ty = torch.arange(h, dtype=torch.float64)
    tx = torch.arange(w, dtype=torch.float64)
    if positions == "rescaled":
        ty = ty / h * ref_grid[0]
        tx = tx / w * ref_grid[1]
    ay = torch.outer(ty.to(freqs), freqs)[:, None, :].expand(h, w, -1)
    ax = torch.outer(tx.to(freqs), freqs)[None, :, :].expand(h, w, -1)
    axes = [ay, ax] if axis_order == "yx" else [ax, ay]
    return torch.cat(axes, dim=-1).reshape(h * w, -1)


def pairs_last(x: torch.Tensor, layout: RopeLayout) -> torch.Tensor:
    """``x [..., head_dim]`` as ``[..., head_dim/2, 2]``: each channel pair on the last dim (a view)."""
    if layout == "interleaved":
        return x.unflatten(-1, (-1, 2))
    return x.unflatten(-1, (2, -1)).transpose(-1, -2)


def rope_cos_sin(
    pair_angles: torch.Tensor, layout: RopeLayout
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand per-pair angles ``[n, head_dim/2]`` to per-channel ``cos, sin`` ``[n, head_dim]``."""
    check_convention("layout", layout, RopeLayout)
    if layout == "interleaved":
        angles = pair_angles.repeat_interleave(2, dim=-1)
    else:
        angles = torch.cat([pair_angles, pair_angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate_pairs(x: torch.Tensor, layout: RopeLayout) -> torch.Tensor:
    """Rotate every channel pair ``(a, b)`` by 90 degrees to ``(-b, a)``: the ``rotate(x)`` of the
    real formula ``x cos + rotate(x) sin`` that :class:`RopeTable` computes as a complex product."""
    pairs = pairs_last(x, layout)
    turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1)
    return turned.transpose(-1, -2).flatten(-2) if layout == "half" else turned.flatten(-2)


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: RopeLayout
) -> torch.Tensor:
    """Rotate ``x [..., n, head_dim]`` by per-token tables ``[n, head_dim]`` in fp32 (a one-off
    :class:`RopeTable`); rows with angle 0 leave their token (CLS) unchanged."""
    return RopeTable(cos, sin, layout).rotate(x)


@dataclass(frozen=True)
class RopeTable:
    """The rotation of every token, built once per grid and shared by every block: per-channel fp32
    ``cos, sin [n, head_dim]`` in ``layout`` (the real formula ``x cos + rotate_pairs(x) sin``), and
    the same rotation as unit complex numbers ``rotation [n, head_dim/2]``, made here once.

    :meth:`rotate` multiplies each pair ``a + ib`` by ``cos + i sin``: the real formula's products and
    sums in one pass, reading q and k where the qkv projection left them. The real formula takes
    five (a negation, a stack, two products, a sum) and was 1.3x slower for the whole ``vit5_small``
    forward on a CPU (docs/speed.md). ``torch.compile`` runs the product as an aten kernel (inductor
    has no complex code generation; measured as fast as the fused real formula on a CPU); ONNX,
    ``torch.export`` and ``torch.fx`` take it as it is.
    """

    cos: torch.Tensor
    sin: torch.Tensor
    layout: RopeLayout
    rotation: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_convention("layout", self.layout, RopeLayout)
        real = pairs_last(self.cos.float(), self.layout)[..., 0]
        imag = pairs_last(self.sin.float(), self.layout)[..., 0]
        object.__setattr__(self, "rotation", torch.complex(real, imag))  # frozen: set once, here

    @classmethod
    def from_angles(cls, pair_angles: torch.Tensor, layout: RopeLayout) -> RopeTable:
        """The table for per-pair angles ``[n, head_dim/2]`` (see :func:`rope_angles_2d`)."""
        cos, sin = rope_cos_sin(pair_angles, layout)
        return cls(cos, sin, layout)

    def rows(self, tokens: slice | torch.Tensor) -> RopeTable:
        """The table of some tokens only (e.g. the new ones of a decoding step)."""
        return RopeTable(self.cos[tokens], self.sin[tokens], self.layout)

    @property
    def num_tokens(self) -> int:
        return self.cos.shape[0]

    def rotate(self, x: torch.Tensor, token_dim: int = -2) -> torch.Tensor:
        """Rotate ``x`` whose tokens are on ``token_dim`` in fp32: ``-2`` for ``[B, heads, n, d]``,
        ``-3`` for the ``[B, n, heads, d]`` qkv projection (rotated there: no copy of q and k)."""
        if token_dim >= 0:
            raise ValueError(f"token_dim must count from the end (a negative dim), got {token_dim}")
        x = checked_rope_input(x, self.cos, token_dim)
        trailing = (1,) * (-token_dim - 2)  # the dims between tokens and channels (heads)
        rotation = self.rotation.reshape(self.num_tokens, *trailing, -1)
        rotated = torch.view_as_real(complex_pairs(x.float(), self.layout) * rotation)
        if self.layout == "half":
            rotated = rotated.transpose(-1, -2)
        return rotated.flatten(-2).to(x.dtype)


def checked_rope_input(x: torch.Tensor, table: torch.Tensor, token_dim: int) -> torch.Tensor:
    """``x`` itself, after checking it has as many tokens on ``token_dim`` as ``table`` has rows."""
    if x.shape[token_dim] != table.shape[0]:
        raise ValueError(
            f"a RoPE table of {table.shape[0]} tokens cannot rotate a tensor of shape "
            f"{tuple(x.shape)} on dim {token_dim}"
        )
    return x


def complex_pairs(x: torch.Tensor, layout: RopeLayout) -> torch.Tensor:
    """The channel pairs of fp32 ``x`` as complex numbers ``[..., head_dim/2]``: a view where the
    pairs lie adjacent with even strides (any slice of heads of the qkv projection), else of a copy.
    (``view_as_complex`` also needs an even storage offset: a head slice starts at a multiple of
    ``head_dim``.)"""
    pairs = pairs_last(x, layout)
    if pairs.stride(-1) != 1 or any(stride % 2 for stride in pairs.stride()[:-1]):
        pairs = pairs.contiguous()
    return torch.view_as_complex(pairs)


# torch.fx records these as calls (a proxy has no sizes or strides): traced models check and align too
torch.fx.wrap("checked_rope_input")
torch.fx.wrap("complex_pairs")


@dataclass(frozen=True)
class Rope2D:
    """One axial 2D RoPE convention (see the module docstring): theta is 1e4 for ViT-5 patches, 100
    for its registers; ``ref_grid`` is the reference grid of ``positions="rescaled"`` (the training
    grid)."""

    head_dim: int
    theta: float = 10000.0
    layout: RopeLayout = "interleaved"
    axis_order: RopeAxisOrder = "yx"
    positions: RopePositions = "integer"
    ref_grid: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        rope_frequencies(
            self.head_dim, self.theta
        )  # validates head_dim now, not at the first forward

    def angles(
        self, grid: tuple[int, int], device: torch.device | str | None = None
    ) -> torch.Tensor:
        """Pair angles ``[h * w, head_dim/2]`` in fp32; the bands are not a buffer, so
        ``model.to(bfloat16)`` cannot round them (bf16 angles are off by up to 0.07 rad)."""
        freqs = rope_frequencies(self.head_dim, self.theta)
        freqs = freqs.to(device=device, dtype=torch.float32)
        return rope_angles_2d(grid, freqs, self.axis_order, self.positions, self.ref_grid)
