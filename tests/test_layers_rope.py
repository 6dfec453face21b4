"""2D RoPE against the official ViT-5 formula, timm's implementation and RoPE's defining properties."""

import math

import pytest
import torch
from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, apply_rot_embed_cat

from vit5.layers import Rope2D, RopeTable, apply_rope, rope_cos_sin, rope_frequencies
from vit5.reference.official_vit5 import VisionRotaryEmbedding


def rotate(x, rope: Rope2D, grid):
    cos, sin = rope_cos_sin(rope.angles(grid), rope.layout)
    return apply_rope(x, cos, sin, rope.layout)


def official_formula(x, grid, theta=10000.0):
    """The official construction written out for any grid: rows on the first half, columns on the second."""
    head_dim = x.shape[-1]
    freqs = 1.0 / theta ** (torch.arange(0, head_dim // 2, 2).float() / (head_dim // 2))
    rows = torch.outer(torch.arange(grid[0]).float(), freqs).repeat_interleave(2, -1)
    cols = torch.outer(torch.arange(grid[1]).float(), freqs).repeat_interleave(2, -1)
    angles = torch.cat([rows[:, None].expand(*grid, -1), cols[None].expand(*grid, -1)], -1).reshape(
        -1, head_dim
    )
    pairs = x.unflatten(-1, (-1, 2))
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), -1).flatten(-2)
    return x * angles.cos() + rotated * angles.sin()


@pytest.mark.parametrize("side", [14, 24])
def test_equals_official_module_on_square_grids(side):
    head_dim = 64
    official = VisionRotaryEmbedding(head_dim // 2, pt_seq_len=side)
    x = torch.randn(2, side * side, 3, head_dim)  # official layout [B, N, heads, d]
    expected = official(x)
    ours = rotate(x.transpose(1, 2), Rope2D(head_dim), (side, side)).transpose(1, 2)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)


def test_equals_official_formula_and_timm_on_non_square_grid():
    grid, head_dim = (12, 20), 64
    x = torch.randn(2, 3, grid[0] * grid[1], head_dim)
    ours = rotate(x, Rope2D(head_dim), grid)
    torch.testing.assert_close(ours, official_formula(x, grid), rtol=1e-5, atol=1e-5)
    timm_rope = RotaryEmbeddingCat(head_dim, temperature=10000, in_pixels=False, grid_indexing="ij")
    torch.testing.assert_close(
        ours, apply_rot_embed_cat(x, timm_rope.get_embed(list(grid))), rtol=1e-5, atol=1e-5
    )


def test_axis_order_xy_matches_timm_xy_indexing():
    grid, head_dim = (6, 9), 32
    x = torch.randn(1, 2, grid[0] * grid[1], head_dim)
    timm_rope = RotaryEmbeddingCat(head_dim, temperature=100, in_pixels=False, grid_indexing="xy")
    ours = rotate(x, Rope2D(head_dim, theta=100, axis_order="xy"), grid)
    torch.testing.assert_close(
        ours, apply_rot_embed_cat(x, timm_rope.get_embed(list(grid))), rtol=1e-5, atol=1e-5
    )


def test_half_layout_is_the_interleaved_rotation_with_permuted_channels():
    grid, head_dim = (5, 7), 16
    x = torch.randn(1, 1, 35, head_dim)
    # half layout pairs (i, i + d/2); interleaved pairs (2i, 2i+1): map one onto the other
    perm = torch.stack(
        [torch.arange(head_dim // 2), torch.arange(head_dim // 2) + head_dim // 2], -1
    ).flatten()
    inter = rotate(x[..., perm], Rope2D(head_dim, layout="interleaved"), grid)
    half = rotate(x, Rope2D(head_dim, layout="half"), grid)
    torch.testing.assert_close(half[..., perm], inter)


def test_relative_position_property():
    """q_m . k_n depends only on m - n: shifting both tokens by the same offset keeps the score."""
    head_dim, grid = 32, (10, 12)
    rope = Rope2D(head_dim)
    q, k = torch.randn(head_dim), torch.randn(head_dim)
    x = torch.stack([q, k]).expand(grid[0] * grid[1], 2, head_dim)
    cos, sin = rope_cos_sin(rope.angles(grid), "interleaved")
    rq = apply_rope(x[:, 0], cos, sin, "interleaved").view(*grid, head_dim)
    rk = apply_rope(x[:, 1], cos, sin, "interleaved").view(*grid, head_dim)
    score = lambda m, n: (rq[m] @ rk[n]).item()  # noqa: E731
    assert score((1, 2), (4, 7)) == pytest.approx(score((5, 3), (8, 8)), abs=1e-4)
    assert score((0, 0), (3, 1)) == pytest.approx(score((6, 10), (9, 11)), abs=1e-4)
    assert score((1, 2), (4, 7)) != pytest.approx(
        score((1, 2), (4, 8)), abs=1e-3
    )  # a different offset differs


def test_rotation_preserves_norms_and_leaves_zero_angles_alone():
    rope = Rope2D(64)
    x = torch.randn(4, 196, 64)
    cos, sin = rope_cos_sin(rope.angles((14, 14)), "interleaved")
    y = apply_rope(x, cos, sin, "interleaved")
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[:, 0], x[:, 0])  # position (0, 0) has angle 0


def test_frequencies_match_the_reference_values():
    torch.testing.assert_close(
        rope_frequencies(64, 10000)[:3],
        torch.tensor([1.0, 0.5623413, 0.3162278], dtype=torch.float64),
    )
    assert rope_frequencies(64, 10000)[-1].item() == pytest.approx(1.778e-4, rel=1e-3)
    assert rope_frequencies(64, 100)[-1].item() == pytest.approx(0.0133, rel=1e-2)
    assert len(rope_frequencies(72, 10000)) == 18  # ViT-5-XL head_dim 72
    with pytest.raises(ValueError, match="divisible by 4"):
        rope_frequencies(66, 10000)


def test_register_grid_angles_as_official():
    """Registers on a 2x2 grid, theta 100: pair 0 rotates by the row [0,0,1,1], pair d/4 by the column
    [0,1,0,1]."""
    angles = Rope2D(64, theta=100).angles((2, 2))
    assert angles[:, 0].tolist() == [0, 0, 1, 1]
    assert angles[:, 16].tolist() == [0, 1, 0, 1]


def test_rescaled_positions_interpolate_onto_the_reference_grid():
    rope = Rope2D(64, positions="rescaled", ref_grid=(14, 14))
    angles = rope.angles((24, 24))
    row1 = angles.view(24, 24, -1)[1, 0, 0].item()
    assert row1 == pytest.approx(14 / 24)
    official = VisionRotaryEmbedding(32, pt_seq_len=14)  # built for 14, fed 24x24
    x = torch.randn(1, 576, 1, 64)
    torch.testing.assert_close(
        rotate(x.transpose(1, 2), rope, (24, 24)).transpose(1, 2), official(x), rtol=1e-5, atol=1e-5
    )
    integer = Rope2D(64).angles((24, 24)).view(24, 24, -1)[1, 0, 0].item()
    assert integer == 1.0 and not math.isclose(integer, row1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotation_of_a_strided_view_equals_the_explicit_formula_with_gradients(dtype):
    """Interleaved pairs of a strided view of the qkv projection (as attention passes k), fp32 inside."""
    cos, sin = rope_cos_sin(Rope2D(32).angles((5, 6)), "interleaved")
    qkv = torch.randn(2, 30, 3 * 4 * 32).to(dtype).requires_grad_()
    q = qkv.unflatten(-1, (-1, 32)).transpose(1, 2)[:, 4:8]  # a strided view, as attention passes k
    out = apply_rope(q, cos, sin, "interleaved")
    qf = q.float()
    pairs = qf.unflatten(-1, (-1, 2))
    expected = qf * cos + torch.stack((-pairs[..., 1], pairs[..., 0]), -1).flatten(-2) * sin
    assert out.dtype == dtype
    torch.testing.assert_close(
        out.float(),
        expected.to(dtype).float(),
        rtol=1e-6 if dtype == torch.float32 else 1e-2,
        atol=1e-6,
    )
    (grad,) = torch.autograd.grad(out.float().square().sum(), qkv)
    (grad_ref,) = torch.autograd.grad(expected.to(dtype).float().square().sum(), qkv)
    torch.testing.assert_close(
        grad.float(), grad_ref.float(), rtol=1e-5 if dtype == torch.float32 else 2e-2, atol=1e-5
    )


def explicit_rotation64(x, angles, layout):
    """float64: each pair ``(a, b)`` to ``(a cos - b sin, a sin + b cos)``, pairs as ``layout``."""
    x64 = x.double()
    d = x.shape[-1]
    if layout == "interleaved":
        a, b = x64[..., 0::2], x64[..., 1::2]
    else:
        a, b = x64[..., : d // 2], x64[..., d // 2 :]
    c = angles.double().cos()
    s = angles.double().sin()
    first = a * c - b * s
    second = a * s + b * c
    if layout == "interleaved":
        return torch.stack((first, second), -1).flatten(-2)
    return torch.cat((first, second), -1)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_the_complex_product_equals_the_explicit_float64_rotation(layout):
    """RopeTable multiplies each pair by ``cos + i sin``; against the rotation written out in
    float64, on a strided head slice (a view), a misaligned slice (copied) and with gradients."""
    torch.manual_seed(0)
    angles = Rope2D(32).angles((4, 5))
    table = RopeTable.from_angles(angles, layout)
    qkv = torch.randn(2, 20, 3, 32, requires_grad=True)
    q = qkv[:, :, 1]  # [B, N, d] with a token stride of 96
    out = table.rotate(q)
    expected = explicit_rotation64(q, angles, layout)
    assert (out.double() - expected).abs().max() <= 1e-6 * expected.abs().max()
    odd = torch.randn(2, 20, 33)[..., :32]  # the channel stride stays 1, the token stride is odd
    torch.testing.assert_close(table.rotate(odd).double(), explicit_rotation64(odd, angles, layout))
    (grad,) = torch.autograd.grad(out.square().sum(), qkv)
    qkv64 = qkv.detach().double().requires_grad_()
    rotated64 = explicit_rotation64(qkv64[:, :, 1], angles, layout)
    (grad64,) = torch.autograd.grad(rotated64.square().sum(), qkv64)
    assert (grad.double() - grad64).abs().max() <= 1e-5 * grad64.abs().max()
