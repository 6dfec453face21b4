"""capture(): attention equals an independent softmax(q k^T / sqrt(d)), for vit5 and timm, whatever the
token order."""

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers.pos_embed_sincos import apply_rot_embed_cat
from viz_support import sharpen, tiny_timm, tiny_vit5

import vit5
from vit5.errors import InputError
from vit5.model import take_indices
from vit5.reference import OfficialViT5
from vit5.viz import capture, describe


def _not_uniform(attn: torch.Tensor) -> None:
    """Guard against a vacuous comparison: the maps must be far from uniform."""
    assert attn.max() > 5.0 / attn.shape[-1]


def test_vit5_attention_equals_the_official_reference_with_rope_qknorm_registers(tmp_path):
    ref = sharpen(
        OfficialViT5(
            img_size=32,
            patch_size=8,
            embed_dim=64,
            depth=2,
            num_heads=2,
            num_classes=3,
            num_registers=4,
            rope=True,
            qk_norm=True,
        ),
        scale=4.0,
    )
    torch.save({"model": ref.state_dict()}, tmp_path / "ref.pth")
    model = vit5.load_model(tmp_path / "ref.pth").eval()
    x = torch.randn(2, 3, 32, 32)
    streamed = {}
    with (
        torch.no_grad(),
        capture(model, on_layer=lambda i, a, t: streamed.setdefault(i, a.full())) as rec,
    ):
        model(x)
        ref(x)
    assert rec.layout == vit5.TokenLayout((4, 4), 1, 4, registers_first=False)
    for i in range(2):
        _not_uniform(streamed[i])
        torch.testing.assert_close(
            streamed[i], ref.blocks[i].attn.last_attention, rtol=1e-4, atol=1e-5
        )
    assert rec.summaries == {} and rec.tokens == {}  # streamed mode keeps nothing


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def test_vit5_attention_on_a_non_square_image_equals_a_hand_recomputation():
    model = tiny_vit5()
    blk = model.blocks[1]
    inputs = {}
    blk.norm1.register_forward_hook(lambda m, a, out: inputs.setdefault("x", out))
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad(), capture(model, layers=[0, -1]) as rec:
        model(x)
    grid = (4, 6)
    assert rec.layout == vit5.TokenLayout(grid, 1, 4) and set(rec.attentions) == set(
        rec.tokens
    ) == {0, 1}
    h, d = blk.attn.num_heads, blk.attn.head_dim
    n = inputs["x"].shape[1]
    q, k, _ = (inputs["x"] @ blk.attn.qkv.weight.T).reshape(1, n, 3, h, d).permute(2, 0, 3, 1, 4)
    q, k = _rms(q, blk.attn.q_norm.weight, 1e-6), _rms(k, blk.attn.k_norm.weight, 1e-6)
    table = model.rope_table(grid)  # per-token angles; rotation of adjacent pairs written out here
    cos, sin = table.cos, table.sin
    rot = lambda t: torch.stack((-t[..., 1::2], t[..., 0::2]), -1).flatten(-2)  # noqa: E731
    q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
    expected = (q @ k.transpose(-1, -2) / d**0.5).softmax(-1)
    _not_uniform(expected)
    torch.testing.assert_close(rec.attentions[1], expected, rtol=1e-4, atol=1e-5)
    # tokens are block outputs before the final norm
    torch.testing.assert_close(
        rec.tokens[1], blk(rec.tokens[0], model.rope_table(grid)), rtol=1e-5, atol=1e-5
    )


def test_timm_vit_with_registers_attention_equals_a_hand_recomputation():
    model = tiny_timm(reg_tokens=4)
    assert all(blk.attn.fused_attn for blk in model.blocks)  # SDPA: no weights
    inputs = {}
    model.blocks[1].norm1.register_forward_hook(lambda m, a, out: inputs.setdefault("x", out))
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        fused = model(x)
        with capture(model) as rec:
            recorded = model(x)
            assert all(blk.attn.fused_attn for blk in model.blocks)  # the fused kernel is kept
    attn = model.blocks[1].attn
    b, n, _ = inputs["x"].shape
    q, k, _ = (
        F.linear(inputs["x"], attn.qkv.weight, attn.qkv.bias)
        .reshape(b, n, 3, 2, 32)
        .permute(2, 0, 3, 1, 4)
    )
    q = F.layer_norm(q, (32,), attn.q_norm.weight, attn.q_norm.bias, attn.q_norm.eps)
    k = F.layer_norm(k, (32,), attn.k_norm.weight, attn.k_norm.bias, attn.k_norm.eps)
    expected = (q @ k.transpose(-1, -2) / 32**0.5).softmax(-1)
    _not_uniform(expected)
    torch.testing.assert_close(rec.attentions[1], expected, rtol=1e-4, atol=1e-5)
    assert rec.layout == vit5.TokenLayout((4, 6), 1, 4, registers_first=True)
    torch.testing.assert_close(recorded, fused, rtol=1e-5, atol=1e-5)  # recording changes nothing
    assert all(not blk.attn.q_norm._forward_hooks for blk in model.blocks)  # hooks removed


def test_timm_hooks_are_removed_after_an_error():
    model = tiny_timm()
    with pytest.raises(RuntimeError, match="boom"), capture(model):
        assert model.blocks[0].attn.k_norm._forward_hooks
        raise RuntimeError("boom")
    attn = model.blocks[0].attn
    assert not (attn._forward_hooks or attn._forward_pre_hooks or attn.k_norm._forward_hooks)
    assert all(blk.attn.fused_attn for blk in model.blocks) and not model.blocks[0]._forward_hooks


def test_timm_eva_rope_attention_equals_a_recomputation_with_timm_rope():
    model = sharpen(
        timm.create_model(
            "vit_small_patch16_rope_224",
            pretrained=False,
            depth=2,
            embed_dim=64,
            num_heads=2,
            img_size=32,
            patch_size=8,
            dynamic_img_size=True,
            num_classes=0,
        )
    )
    inputs = {}
    model.blocks[0].norm1.register_forward_hook(lambda m, a, out: inputs.setdefault("x", out))
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad(), capture(model, layers=[0]) as rec:
        model(x)
    attn = model.blocks[0].attn
    n = inputs["x"].shape[1]
    q, k, _ = attn.qkv(inputs["x"]).reshape(1, n, 3, 2, 32).permute(2, 0, 3, 1, 4)
    rope = model.rope.get_embed(shape=(4, 6))
    q = torch.cat([q[:, :, :1], apply_rot_embed_cat(q[:, :, 1:], rope)], 2)
    k = torch.cat([k[:, :, :1], apply_rot_embed_cat(k[:, :, 1:], rope)], 2)
    expected = (q @ k.transpose(-1, -2) / 32**0.5).softmax(-1)
    _not_uniform(expected)
    torch.testing.assert_close(rec.attentions[0], expected, rtol=1e-4, atol=1e-5)
    assert rec.layout == vit5.TokenLayout((4, 6), 1, 0, registers_first=True)


def test_describe_both_families():
    v, t = describe(tiny_vit5()), describe(tiny_timm(reg_tokens=4))
    assert (v.family, v.num_registers, v.registers_first, v.patch_size, v.depth) == (
        "vit5",
        4,
        False,
        8,
        2,
    )
    assert (t.family, t.num_registers, t.registers_first, t.patch_size, t.num_heads) == (
        "timm",
        4,
        True,
        8,
        2,
    )
    with pytest.raises(InputError, match="cannot use a Linear: supported are vit5 models and timm"):
        describe(torch.nn.Linear(2, 2))


def test_bad_layers_and_sizes_name_the_valid_range_and_fix():
    with pytest.raises(
        InputError,
        match=r"layer 7 is out of range: this model has 2 blocks, valid layers are 0\.\.1",
    ):
        take_indices(2, [7])
    assert take_indices(4, [-1, 0, -1], unique=True) == [0, 3]
    assert take_indices(4, [-1, 0, -1]) == [
        3,
        0,
        3,
    ]  # forward_intermediates: in the order asked (timm)
    assert take_indices(4, 2) == [2, 3]  # an int n: the last n, as vit5.record
    with pytest.raises(InputError, match="last 5 blocks of a model with 4"):
        take_indices(4, 5)
    fixed = timm.create_model(
        "vit_small_patch16_224",
        pretrained=False,
        depth=1,
        embed_dim=64,
        num_heads=2,
        img_size=32,
        patch_size=8,
    )
    with pytest.raises(InputError, match="built for 32x32 inputs only"):
        describe(fixed).layout((32, 48))
    with pytest.raises(
        InputError, match="not a positive multiple of the patch size 8: use --size 32x48"
    ):
        describe(tiny_vit5()).layout((30, 47))


def test_a_timm_attention_without_q_norm_and_k_norm_is_refused_before_recording():
    from vit5.viz.collect import recordable

    model = tiny_timm()
    assert recordable(model).family == "timm"
    model.blocks[1].attn = torch.nn.Identity()
    with pytest.raises(
        InputError, match="block 1 of this VisionTransformer has an attention module"
    ):
        recordable(model)
    with pytest.raises(InputError, match="q_norm / k_norm"):
        with capture(model):
            pass
