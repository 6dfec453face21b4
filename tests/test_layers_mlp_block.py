"""MLPs against timm and their formulas; the block's norm placement, LayerScale and stochastic depth."""

import pytest
import torch
import torch.nn.functional as F
from timm.layers import GluMlp
from timm.layers import Mlp as TimmMlp

from vit5.layers import (
    AttentionConfig,
    Block,
    BlockConfig,
    Mlp,
    SwiGLU,
    add_branch,
    swiglu_hidden_dim,
)
from vit5.model import ViT5Config


def test_gelu_mlp_equals_timm_mlp():
    ours, timm_mlp = Mlp(32, 128), TimmMlp(32, 128)
    timm_mlp.load_state_dict(ours.state_dict())
    x = torch.randn(3, 5, 32)
    torch.testing.assert_close(ours(x), timm_mlp(x))


def test_swiglu_formula_and_timm_packed_equivalence():
    ours = SwiGLU(32, 96)
    gate_w, up_w = ours.fc1.weight.chunk(2, dim=0)
    x = torch.randn(4, 32)
    expected = (F.silu(x @ gate_w.T) * (x @ up_w.T)) @ ours.fc2.weight.T
    torch.testing.assert_close(ours(x), expected)
    packed = GluMlp(32, 192, act_layer=torch.nn.SiLU, gate_last=False, bias=False)
    packed.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(x), packed(x))
    assert all(p.ndim == 2 for p in ours.parameters())  # bias-free


@pytest.mark.parametrize("dim", [192, 384, 768, 1024])
def test_swiglu_at_8d_over_3_has_the_parameters_of_the_4d_gelu_mlp(dim):
    hidden = swiglu_hidden_dim(dim, 4.0, multiple_of=64)
    assert hidden % 64 == 0 and hidden >= 8 * dim / 3 > hidden - 64
    gelu = sum(p.numel() for p in Mlp(dim, 4 * dim).parameters())
    swiglu = sum(p.numel() for p in SwiGLU(dim, hidden).parameters())
    assert abs(swiglu - gelu) / gelu < 0.03


def block(pre_norm=True, layer_scale=1e-4, drop=0.0, norm="rmsnorm"):
    cfg = BlockConfig(
        attn=AttentionConfig(dim=32, num_heads=2),
        pre_norm=pre_norm,
        layer_scale=layer_scale,
        drop_path=drop,
        norm=norm,
    )
    return Block(cfg).eval()


def test_pre_norm_block_formula():
    blk = block(layer_scale=0.5)
    x = torch.randn(2, 6, 32)
    h = x + 0.5 * blk.attn(blk.norm1(x))
    torch.testing.assert_close(blk(x), h + 0.5 * blk.mlp(blk.norm2(h)))


def test_post_norm_block_formula():
    blk = block(pre_norm=False, layer_scale=None, norm="layernorm")
    x = torch.randn(2, 6, 32)
    h = blk.norm1(x + blk.attn(x))
    torch.testing.assert_close(blk(x), blk.norm2(h + blk.mlp(h)))


def test_layer_scale_init_and_off_switch():
    blk = block()
    assert torch.all(blk.ls1.gamma == 1e-4) and blk.ls1.gamma.shape == (32,)
    assert "ls1.gamma" in blk.state_dict() and "ls2.gamma" in blk.state_dict()
    off = block(layer_scale=None)
    assert not any("ls" in k for k in off.state_dict())
    # at init the block is close to the identity with LayerScale, far from it without
    x = torch.randn(2, 6, 32)
    assert (blk(x) - x).abs().max() < 1e-2 < (off(x) - x).abs().max()


def test_drop_path_schedules_and_per_sample_dropping():
    assert [b.drop_path for b in ViT5Config(depth=4, drop_path_rate=0.2).block_configs()] == [
        0.2
    ] * 4
    linear = ViT5Config(depth=4, drop_path_rate=0.3, drop_path_schedule="linear").drop_path_rates()
    assert linear == pytest.approx([0.0, 0.1, 0.2, 0.3])
    drop = block(drop=0.25).drop_path1
    x = torch.ones(1000, 3, 2)
    per_sample = drop.train()(x).flatten(1)
    assert torch.all(
        (per_sample == 0).all(1) | (per_sample == 1 / 0.75).all(1)
    )  # whole samples dropped
    assert 0.18 < (per_sample[:, 0] == 0).float().mean() < 0.32
    assert torch.equal(drop.eval()(x), x)


def test_residual_update_with_layer_scale_and_drop_path_is_the_formula():
    """``x + drop(ls(y))`` in one addcmul: the same per-sample mask and gain as written out."""
    blk = block(layer_scale=0.5, drop=0.5).train()
    with torch.no_grad():
        blk.ls1.gamma.uniform_(0.1, 1.0)
    x = torch.randn(64, 6, 32)
    y = torch.randn(64, 6, 32)
    torch.manual_seed(3)
    got = add_branch(x, y, blk.ls1, blk.drop_path1)
    torch.manual_seed(3)
    expected = x + blk.drop_path1(blk.ls1(y))
    torch.testing.assert_close(got, expected)
    dropped = (got - x).flatten(1).abs().amax(1) == 0
    assert 0 < dropped.sum() < 64  # some samples dropped, some kept
    off = block(layer_scale=None).eval()
    torch.testing.assert_close(add_branch(x, y, off.ls1, off.drop_path1), x + y)
