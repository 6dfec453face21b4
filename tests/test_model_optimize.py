"""Inference folding (vit5.fuse_for_inference) and regional compilation (vit5.compile_blocks)."""

import pytest
import torch

import vit5
from vit5 import CheckpointError
from vit5.layers import LayerScale, RMSNorm


def randomised(preset: str = "vit5_tiny", **overrides) -> vit5.ViT5:
    """A tiny model whose gains and biases are far from their init, so a wrong fold shows in the logits."""
    torch.manual_seed(0)
    kwargs = dict(depth=2, img_size=32, patch_size=8, num_classes=7, **overrides)
    model = vit5.create_model(preset, **kwargs).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("gamma"):
                param.uniform_(0.3, 1.0)  # LayerScale: large enough that the blocks move the logits
            elif param.ndim == 1 and name.endswith("weight"):
                param.uniform_(0.5, 1.5)
            elif param.ndim == 1 and name.endswith("bias"):
                param.normal_(0, 0.5)
    return model


CASES = {
    "vit5": ("vit5_tiny", {}),
    "swiglu": ("vit5_tiny", {"mlp": "swiglu"}),
    "gqa": ("vit5_tiny", {"num_heads": 4, "embed_dim": 128, "num_kv_heads": 2}),
    "layernorm": ("vit5_tiny", {"norm": "layernorm"}),
    "post_norm": ("vit5_tiny", {"pre_norm": False}),
    "deit3": ("deit3_tiny", {}),  # LayerNorm with bias before a qkv with bias
    "vanilla_vit": ("vanilla_vit_tiny", {}),  # no LayerScale
}


@pytest.mark.parametrize("case", list(CASES))
def test_fused_logits_equal_the_unfused_model(case):
    name, overrides = CASES[case]
    model = randomised(name, **overrides)
    x = torch.randn(3, 3, 32, 48)
    with torch.no_grad():
        expected = model(x)
        without_blocks = model.forward_head(model.norm(model.prepare_tokens(x)[0]))
        assert (expected - without_blocks).abs().max() > 0.1 * expected.abs().max()  # the blocks matter
        assert vit5.fuse_for_inference(model) is model
        got = model(x)
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()
    for block in model.blocks:  # what was folded
        assert not isinstance(block.ls1, LayerScale) and not isinstance(block.ls2, LayerScale)
        has_gain = getattr(block.norm1, "weight", None) is not None
        assert has_gain == (not block.pre_norm)  # post-norm: a norm's output also feeds the residual stream
        if model.cfg.qk_norm:
            assert block.attn.q_norm.weight is not None and block.attn.k_norm.weight is not None  # they stay


def test_layernorm_bias_gives_a_bias_free_qkv_a_bias():
    model = randomised(norm="layernorm", qkv_bias=False, mlp="swiglu")  # SwiGLU: bias-free fc1 too
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
        vit5.fuse_for_inference(model)
        got = model(x)
    assert model.blocks[0].attn.qkv.bias is not None and model.blocks[0].mlp.fc1.bias is not None
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_fused_model_refuses_to_train_and_to_be_saved(tmp_path):
    model = vit5.fuse_for_inference(randomised())
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    with pytest.raises(RuntimeError, match="fused for inference.*cannot be trained"):
        model.train()
    model.eval()  # still allowed
    with pytest.raises(CheckpointError, match="fused for inference.*save the model before fusing"):
        vit5.save_pretrained(model, tmp_path / "fused")
    assert not (tmp_path / "fused").exists()
    assert vit5.fuse_for_inference(model) is model  # fusing twice changes nothing
    with pytest.raises(TypeError, match="fuse the model before wrapping"):
        vit5.fuse_for_inference(torch.compile(randomised(), backend="eager"))


def test_recorded_block_outputs_and_attention_are_unchanged_by_fusing():
    model = randomised()
    x = torch.randn(2, 3, 32, 40)
    with torch.no_grad():
        with vit5.record(model) as before:
            model(x)
        feats = model.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
        vit5.fuse_for_inference(model)
        with vit5.record(model) as after:
            model(x)
        fused_feats = model.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
    for i in range(2):
        scale = before.tokens[i].abs().max()
        assert (after.tokens[i] - before.tokens[i]).abs().max() <= 1e-5 * scale
        torch.testing.assert_close(after.attention(i), before.attention(i), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fused_feats[i], feats[i], rtol=1e-5, atol=1e-5 * scale.item())
    assert (
        isinstance(model.blocks[0].norm1, RMSNorm) and model.blocks[0].norm1.weight is None
    )  # gain-free now


def test_regional_compile_compiles_one_block_for_all_and_keeps_outputs_and_keys():
    """Every block runs compiled code (aot_eager traces forward and backward like inductor, without a
    C++ compiler); the blocks share one compiled graph; outputs, gradients and keys are unchanged."""
    model = randomised()
    twin = randomised()
    x = torch.randn(2, 3, 32, 48)
    keys = list(model.state_dict())
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    assert vit5.compile_blocks(model, backend="aot_eager", fullgraph=True) is model
    assert list(model.state_dict()) == keys  # no _orig_mod. prefix: checkpoints and EMA are unaffected
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x), rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1  # two blocks, one compilation
    model.train()
    twin.train()
    model(x).square().sum().backward()
    twin(x).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
