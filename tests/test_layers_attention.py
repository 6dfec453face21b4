"""Attention against an explicit reference: QK-Norm before RoPE, V unrotated, GQA, backends, KV cache."""

import pytest
import torch
import torch.nn.functional as F

import vit5
from vit5.layers import (
    Attention,
    AttentionConfig,
    Block,
    BlockConfig,
    KVCache,
    Rope2D,
    RopeTable,
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
    attn = Attention(
        AttentionConfig(dim=dim, num_heads=heads, num_kv_heads=kv_heads, backend=backend, **kw)
    ).eval()
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
    torch.testing.assert_close(
        attn(x, rope), reference_attention(attn, x, rope), rtol=1e-4, atol=1e-5
    )
    assert attn.qkv.weight.shape == ((4 + 2 * kv_heads) * 16, 64)  # GQA shrinks the K/V projections


def test_backends_agree_and_causal_agrees():
    torch.manual_seed(1)
    eager, sdpa = make("eager", kv_heads=2), make("sdpa", kv_heads=2)
    sdpa.load_state_dict(eager.state_dict())
    x, rope = torch.randn(2, 15, 64), rope_for()
    torch.testing.assert_close(sdpa(x, rope), eager(x, rope), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(
        sdpa(x, rope, causal=True), eager(x, rope, causal=True), rtol=1e-4, atol=1e-5
    )
    torch.testing.assert_close(
        sdpa(x, rope, causal=True),
        reference_attention(sdpa, x, rope, causal=True),
        rtol=1e-4,
        atol=1e-5,
    )


def test_qk_norm_comes_before_rope_and_v_is_not_rotated():
    attn = make("eager")
    x, rope = torch.randn(1, 15, 64), rope_for()
    out = attn(x, rope)
    # RoPE after the norm (reference) is right; rotating before the norm or rotating v changes the output
    assert torch.allclose(out, reference_attention(attn, x, rope), atol=1e-5)
    captured = {}

    def recorder(q, k, scale, causal):  # the recorder gets q and k after the norm and RoPE
        captured["p"] = (q @ k.transpose(-2, -1) * scale).softmax(-1)

    attn.recorder = recorder
    attn(x, rope)
    b, n = 1, 15
    v = (x @ attn.qkv.weight.T)[..., 128:].reshape(b, n, 4, 16).transpose(1, 2)
    mixed = (captured["p"] @ v).transpose(1, 2).reshape(
        b, n, 64
    ) @ attn.proj.weight.T + attn.proj.bias
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
    cfg = BlockConfig(
        attn=AttentionConfig(dim=64, num_heads=4, num_kv_heads=kv_heads, backend=backend),
        layer_scale=None,
    )
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


# ------------------------------------------------------------------ one pass each: QK-norm, RoPE, no copies
def explicit_attention64(attn: Attention, x, cos, sin):
    """float64, every step written out: per-head RMSNorm / LayerNorm formula with its own gain, RoPE as
    ``x cos + (-x1, x0) sin`` on adjacent pairs, grouped heads repeated, softmax, projection."""
    b, n, _ = x.shape
    h, h_kv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    w = {k: v.double() for k, v in attn.named_parameters()}
    qkv = (x.double() @ w["qkv.weight"].T).reshape(b, n, h + 2 * h_kv, d)
    q, k, v = qkv[:, :, :h], qkv[:, :, h : h + h_kv], qkv[:, :, h + h_kv :]

    def norm(t, name):
        if isinstance(attn.q_norm, torch.nn.LayerNorm):
            t = t - t.mean(-1, keepdim=True)
            t = t / torch.sqrt(t.square().mean(-1, keepdim=True) + 1e-6)
            return t * w[f"{name}.weight"] + w[f"{name}.bias"]
        return t / torch.sqrt(t.square().mean(-1, keepdim=True) + 1e-6) * w[f"{name}.weight"]

    def rotate(t):
        swapped = torch.stack((-t[..., 1::2], t[..., 0::2]), -1).flatten(-2)
        return t * cos.double()[:, None] + swapped * sin.double()[:, None]

    q, k = rotate(norm(q, "q_norm")), rotate(norm(k, "k_norm"))
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    k, v = k.repeat_interleave(h // h_kv, dim=1), v.repeat_interleave(h // h_kv, dim=1)
    out = (q @ k.transpose(-1, -2) / d**0.5).softmax(-1) @ v
    return out.transpose(1, 2).reshape(b, n, -1) @ w["proj.weight"].T + w["proj.bias"]


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_fused_qk_norm_and_rope_equal_an_explicit_float64_computation(kv_heads, norm):
    torch.manual_seed(0)
    attn = make("sdpa", kv_heads=kv_heads, norm=norm)
    with torch.no_grad():
        attn.k_norm.weight.uniform_(0.2, 2.0)  # q and k gains differ: each must reach its own heads
        if norm == "layernorm":
            attn.q_norm.bias.normal_()
            attn.k_norm.bias.normal_()
    x = torch.randn(2, 15, 64)
    cos, sin = rope_for()
    expected = explicit_attention64(attn, x, cos, sin)
    for rope in ((cos, sin), RopeTable(cos, sin, "interleaved")):
        got = attn(x, rope).double()
        assert (got - expected).abs().max() <= 1e-6 * expected.abs().max()
    assert set(attn.state_dict()) >= {
        "q_norm.weight",
        "k_norm.weight",
    }  # checkpoints keep their keys


def test_attention_gradients_equal_the_explicit_computation():
    torch.manual_seed(0)
    attn = make("sdpa", kv_heads=2)
    x = torch.randn(2, 15, 64, requires_grad=True)
    cos, sin = rope_for()
    inputs = [x, attn.q_norm.weight, attn.k_norm.weight]
    grads = torch.autograd.grad(attn(x, (cos, sin)).square().sum(), inputs)
    x64 = x.detach().double().requires_grad_()
    attn64 = attn.double()
    inputs64 = [x64, attn64.q_norm.weight, attn64.k_norm.weight]
    expected = torch.autograd.grad(
        explicit_attention64(attn64, x64, cos, sin).square().sum(), inputs64
    )
    for got, want in zip(grads, expected):
        assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()


def test_one_rope_table_per_grid_shared_by_every_block(monkeypatch):
    """The model builds its rotation once per grid; the blocks neither rebuild nor convert it."""
    model = vit5.create_model("vit5_tiny", depth=3, img_size=32, patch_size=8, num_classes=0).eval()
    seen, built = [], []
    for blk in model.blocks:
        blk.register_forward_pre_hook(lambda m, args: seen.append(args[1]))
    real = RopeTable.from_angles
    monkeypatch.setattr(RopeTable, "from_angles", lambda *a: built.append(1) or real(*a))
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        model(x)
        model(x)
    assert len(built) == 1  # one table for the 4x6 grid, reused by the second forward
    assert len(seen) == 6 and all(t is seen[0] for t in seen) and isinstance(seen[0], RopeTable)


@pytest.mark.parametrize("qk_norm", [True, False])
def test_attention_forward_makes_no_copies_of_q_k_v_or_its_output(qk_norm):
    """q, k, v stay views of the projection; nothing is made contiguous on the way in or out."""
    attn = make("sdpa", kv_heads=2, qk_norm=qk_norm)
    table = RopeTable(*rope_for(), "interleaved")
    x = torch.randn(2, 15, 64)
    with torch.no_grad(), torch.profiler.profile() as prof:
        attn(x, table)
    copies = [e.name for e in prof.events() if e.name in ("aten::clone", "aten::contiguous")]
    assert not copies


def test_rope_table_rotates_token_major_layouts_and_selects_rows():
    table = RopeTable.from_angles(Rope2D(16).angles((3, 5)), "interleaved")
    x = torch.randn(2, 15, 4, 16)  # [B, N, heads, d]
    by_heads = table.rotate(x.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(table.rotate(x, token_dim=-3), by_heads)
    torch.testing.assert_close(
        table.rows(slice(5, 7)).rotate(x[:, 5:7], token_dim=-3), by_heads[:, 5:7]
    )
    with pytest.raises(ValueError, match="cannot rotate a tensor of shape"):
        table.rotate(x)  # tokens are not on dim -2 here
    half = RopeTable.from_angles(Rope2D(16).angles((3, 5)), "half")
    with pytest.raises(ValueError, match="layout"):
        make(rope_layout="interleaved")(torch.randn(1, 15, 64), half)
