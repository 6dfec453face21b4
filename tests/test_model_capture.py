"""record(): attention probabilities equal an independent softmax(q k^T / sqrt(d)); tokens are block
outputs."""

import pytest
import torch
from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, apply_rot_embed_cat

import vit5
from vit5.reference import OfficialViT5


def test_recorded_attention_equals_the_official_implementation(tmp_path):
    ref = OfficialViT5(img_size=64, embed_dim=96, depth=3, num_heads=3, num_classes=5).eval()
    torch.save({"model": ref.state_dict()}, tmp_path / "ref.pth")
    model = vit5.load_model(tmp_path / "ref.pth")
    x = torch.randn(2, 3, 64, 64)
    with vit5.record(model, layers=[0, 2]) as rec:
        logits = model(x)
    ref(x)
    assert set(rec.attentions) == {0, 2} and rec.attentions[2].shape == (2, 3, 21, 21)
    for i in (0, 2):
        torch.testing.assert_close(
            rec.attentions[i], ref.blocks[i].attn.last_attention, rtol=1e-4, atol=1e-5
        )
    torch.testing.assert_close(logits, ref(x), rtol=1e-4, atol=1e-4)


def independent_attention(model, block_input, grid):
    """Softmax attention recomputed from the block's weights with timm's RoPE (patches: theta 1e4,
    registers: 2x2, 100)."""
    blk = model.blocks[-1]
    b, n, c = block_input.shape
    h, d = blk.attn.num_heads, blk.attn.head_dim
    qkv = blk.norm1(block_input) @ blk.attn.qkv.weight.T
    q, k, _ = qkv.reshape(b, n, 3, h, d).permute(2, 0, 3, 1, 4)
    q, k = blk.attn.q_norm(q), blk.attn.k_norm(k)
    patch_rope = RotaryEmbeddingCat(d, temperature=10000, in_pixels=False).get_embed(list(grid))
    reg_rope = RotaryEmbeddingCat(d, temperature=100, in_pixels=False).get_embed([2, 2])
    p = grid[0] * grid[1]

    def rotate(t):
        return torch.cat(
            [
                t[:, :, :1],
                apply_rot_embed_cat(t[:, :, 1 : 1 + p], patch_rope),
                apply_rot_embed_cat(t[:, :, 1 + p :], reg_rope),
            ],
            2,
        )

    q, k = rotate(q), rotate(k)
    return (q @ k.transpose(-1, -2) / d**0.5).softmax(-1)


def test_recorded_attention_on_a_non_square_image():
    model = vit5.create_model("vit5_tiny", depth=2, img_size=32, num_classes=0).eval()
    x = torch.randn(1, 3, 48, 80)
    with vit5.record(model, layers=[-1]) as rec:
        model(x)
    assert rec.layout.grid == (3, 5) and rec.layout.num_tokens == 1 + 15 + 4
    expected = independent_attention(model, rec.tokens[0], (3, 5))
    torch.testing.assert_close(rec.attentions[1], expected, rtol=1e-4, atol=1e-5)
    assert rec.cls_attention(-1).shape == (1, 3, 3, 5) and rec.patch_norms(1).shape == (1, 3, 5)
    torch.testing.assert_close(rec.cls_attention(-1).flatten(2), expected[:, :, 0, 1:16])
    torch.testing.assert_close(rec.patch_norms(-1).flatten(1), rec.tokens[1][:, 1:16].norm(dim=-1))
    with pytest.raises(KeyError, match=r"no attention recorded for block 0: recorded \[1\]"):
        rec.attention(0)


def test_recorded_tokens_are_the_block_outputs_before_the_final_norm():
    model = vit5.create_model("vit5_tiny", depth=3, img_size=32).eval()
    x = torch.randn(2, 3, 32, 48)
    with vit5.record(model, attention=False) as rec:
        model(x)
    inter = model.forward_intermediates(
        x, output_fmt="NLC", return_prefix_tokens=True, intermediates_only=True
    )
    for i, (patches, prefix) in enumerate(inter):
        torch.testing.assert_close(rec.layout.patches(rec.tokens[i]), patches)
        torch.testing.assert_close(rec.tokens[i][:, :1], prefix[:, :1])
        torch.testing.assert_close(rec.layout.registers(rec.tokens[i]), prefix[:, 1:])
    assert rec.attentions == {}


def test_recording_is_undone_on_exit_and_works_through_wrappers():
    model = vit5.create_model("vit5_tiny", depth=2, img_size=32).eval()
    wrapped = torch.nn.parallel.DistributedDataParallel.__new__(
        torch.nn.parallel.DistributedDataParallel
    )
    torch.nn.Module.__init__(wrapped)
    wrapped.module = model
    with vit5.record(wrapped, layers=1) as rec:
        model(torch.randn(1, 3, 32, 32))
    assert list(rec.attentions) == [1]
    assert all(blk.attn.recorder is None for blk in model.blocks)
    assert (
        all(not blk._forward_hooks for blk in model.blocks) and not model.patch_embed._forward_hooks
    )
    with pytest.raises(TypeError, match="expected a vit5 ViT5 model"):
        with vit5.record(torch.nn.Linear(2, 2)):
            pass


def test_unwrap_peels_nested_compile_and_ddp_wrappers_in_any_order():
    from vit5.model import unwrap

    model = vit5.create_model("vit5_tiny", depth=1, img_size=32)
    ddp = torch.nn.parallel.DistributedDataParallel.__new__(
        torch.nn.parallel.DistributedDataParallel
    )
    torch.nn.Module.__init__(ddp)
    ddp.module = torch.compile(
        model, backend="eager"
    )  # DDP around a compiled model, compiled again
    assert unwrap(torch.compile(ddp, backend="eager")) is model
    assert unwrap(model) is model
    linear = torch.nn.Linear(2, 2)
    assert unwrap(linear) is linear
