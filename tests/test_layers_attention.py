"""Attention against an explicit reference: QK-Norm before RoPE, V unrotated, GQA, backends, KV cache."""

import pytest
import torch
import torch.nn.functional as F

from vit5.layers import (
    Attention,
    AttentionConfig,
    Block,
    BlockConfig,
    KVCache,
    Rope2D,
    apply_rope,
    rope_cos_sin,
)


def reference_attention(attn: Attention, x, rope=None, causal=False):
    """softmax(q k^T / sqrt(d)) v written out, with K/V heads repeated explicitly for GQA."""
    b, n, c = x.shape
    h, h_kv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    qkv = x @ attn.qkv.weight.T + (attn.qkv.bias if attn.qkv.bias is not None else 0)
    q = qkv[..., : h * d].reshape(b, n, h, d).transpose(1, 2)
    k = qkv[..., h * d : (h + h_kv) * d].reshape(b, n, h_kv, d).transpose(1, 2)
    v = qkv[..., (h + h_kv) * d :].reshape(b, n, h_kv, d).transpose(1, 2)
    q, k = attn.q_norm(q), attn.k_norm(k)
    if rope is not None:
        q, k = apply_rope(q, *rope, "interleaved"), apply_rope(k, *rope, "interleaved")
    k, v = k.repeat_interleave(h // h_kv, dim=1), v.repeat_interleave(h // h_kv, dim=1)
    scores = q @ k.transpose(-1, -2) / d**0.5
    if causal:
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    out = scores.softmax(-1) @ v
    return out.transpose(1, 2).reshape(b, n, c) @ attn.proj.weight.T + attn.proj.bias


def make(backend="sdpa", heads=4, kv_heads=None, dim=64, **kw):
    attn = Attention(AttentionConfig(dim=dim, num_heads=heads, num_kv_heads=kv_heads, backend=backend, **kw)).eval()
    with torch.no_grad():
        for norm in (attn.q_norm, attn.k_norm):
            if hasattr(norm, "weight"):
                norm.weight.uniform_(0.5, 1.5)
    return attn


def rope_for(n_tokens_grid=(3, 5), head_dim=16):
    cos, sin = rope_cos_sin(Rope2D(head_dim).angles(n_tokens_grid), "interleaved")
    return cos, sin


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_matches_explicit_reference_mha_gqa_mqa(backend, kv_heads):
    attn = make(backend, kv_heads=kv_heads)
    x = torch.randn(2, 15, 64)
    rope = rope_for()
    torch.testing.assert_close(attn(x, rope), reference_attention(attn, x, rope), rtol=1e-4, atol=1e-5)
    assert attn.qkv.weight.shape == ((4 + 2 * kv_heads) * 16, 64)  # GQA shrinks the K/V projections


def test_backends_agree_and_causal_agrees():
    torch.manual_seed(1)
    eager, sdpa = make("eager", kv_heads=2), make("sdpa", kv_heads=2)
    sdpa.load_state_dict(eager.state_dict())
    x, rope = torch.randn(2, 15, 64), rope_for()
    torch.testing.assert_close(sdpa(x, rope), eager(x, rope), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(sdpa(x, rope, causal=True), eager(x, rope, causal=True), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(sdpa(x, rope, causal=True), reference_attention(sdpa, x, rope, causal=True), rtol=1e-4, atol=1e-5)


def test_qk_norm_comes_before_rope_and_v_is_not_rotated():
    attn = make("eager")
    x, rope = torch.randn(1, 15, 64), rope_for()
    out = attn(x, rope)
    # RoPE after the norm (reference) is right; rotating before the norm or rotating v changes the output
    assert torch.allclose(out, reference_attention(attn, x, rope), atol=1e-5)
    captured = {}
    attn.recorder = lambda p: captured.setdefault("p", p)
    attn(x, rope)
    b, n = 1, 15
    v = (x @ attn.qkv.weight.T)[..., 128:].reshape(b, n, 4, 16).transpose(1, 2)
    mixed = (captured["p"] @ v).transpose(1, 2).reshape(b, n, 64) @ attn.proj.weight.T + attn.proj.bias
    torch.testing.assert_close(mixed, out, rtol=1e-4, atol=1e-5)


def test_without_qk_norm_there_are_no_norm_weights():
    attn = make(qk_norm=False)
    assert not any("norm" in name for name, _ in attn.named_parameters())


def test_flash_attn_backend_fails_clearly_without_package_or_cuda():
    attn = make("flash_attn")
    with pytest.raises(RuntimeError, match="flash_attn|flash-attn"):
        attn(torch.randn(1, 4, 64))


def test_config_validation():
    with pytest.raises(ValueError, match="not divisible by num_kv_heads 3"):
        AttentionConfig(dim=64, num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="unknown attention backend 'xformers'"):
        AttentionConfig(dim=64, num_heads=4, backend="xformers")


def decoder_stack(depth=3, kv_heads=2, backend="sdpa"):
    cfg = BlockConfig(attn=AttentionConfig(dim=64, num_heads=4, num_kv_heads=kv_heads, backend=backend), layer_scale=None)
    return torch.nn.ModuleList(Block(cfg) for _ in range(depth)).eval()


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_kv_cache_decoding_equals_one_causal_pass(backend):
    blocks, n = decoder_stack(backend=backend), 12
    x = torch.randn(2, n, 64)
    cos, sin = rope_for((3, 4))
    full = x
    for blk in blocks:
        full = blk(full, (cos, sin), causal=True)
    cache = KVCache(len(blocks), batch_size=2, num_kv_heads=2, head_dim=16, max_tokens=n)
    prefill = 5  # a multi-token chunk first, then one token at a time
    steps = [slice(0, prefill)] + [slice(t, t + 1) for t in range(prefill, n)]
    outs = []
    for s in steps:
        h = x[:, s]
        for i, blk in enumerate(blocks):
            h = blk(h, (cos[s], sin[s]), causal=True, kv_cache=cache.layers[i])
        outs.append(h)
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=1e-4, atol=1e-5)
    assert cache.length == n


@pytest.mark.parametrize("kv_heads", [8, 4, 2, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_cache_size_is_the_formula(kv_heads, dtype):
    layers, batch, head_dim, tokens = 3, 2, 16, 40
    cache = KVCache(layers, batch, kv_heads, head_dim, tokens, dtype=dtype)
    element = 4 if dtype == torch.float32 else 2
    assert cache.nbytes == 2 * layers * kv_heads * head_dim * tokens * batch * element


def test_kv_cache_overflow_and_non_causal_use_fail_clearly():
    blocks = decoder_stack(depth=1)
    cache = KVCache(1, 1, 2, 16, max_tokens=2)
    with pytest.raises(RuntimeError, match="KV cache is full"):
        blocks[0](torch.randn(1, 3, 64), causal=True, kv_cache=cache.layers[0])
    with pytest.raises(ValueError, match="causal=True"):
        blocks[0](torch.randn(1, 1, 64), kv_cache=KVCache(1, 1, 2, 16, 4).layers[0])


def test_sdpa_gqa_does_not_repeat_kv():
    """The GQA path hands SDPA the un-repeated K/V (enable_gqa), never repeat_interleave'd copies."""
    attn = make("sdpa", heads=8, kv_heads=2)
    seen = {}
    real = F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        seen.update(q=q.shape, k=k.shape, gqa=kwargs.get("enable_gqa"))
        return real(q, k, v, *args, **kwargs)

    F.scaled_dot_product_attention = spy
    try:
        attn(torch.randn(1, 6, 64))
    finally:
        F.scaled_dot_product_attention = real
    assert seen == {"q": (1, 8, 6, 8), "k": (1, 2, 6, 8), "gqa": True}
