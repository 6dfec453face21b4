"""GPU checks: the same properties as the CPU suite, on CUDA, in bf16, and with the flash-attn kernel.

Skipped where there is no CUDA device (every CPU run); ``make gpu-check`` runs them with the GPU
benchmark. References are computed in fp32 (explicit softmax, or the model on the CPU), so a wrong
kernel, layout or dtype path fails here rather than agreeing with itself.
"""

import pytest
import torch
import torch.nn.functional as F
from test_layers_attention import reference_attention  # fp32 explicit softmax, K/V repeated for GQA

import vit5
from vit5.bench.measure import measure_memory
from vit5.layers import Attention, AttentionConfig, KVCache, Rope2D, RopeTable, rope_cos_sin

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DEVICE = "cuda"


def backends() -> list[str]:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return ["sdpa", "eager"]
    return ["sdpa", "eager", "flash_attn"]


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("backend", backends())
def test_every_backend_matches_fp32_reference_in_bf16(backend, kv_heads):
    torch.manual_seed(0)
    attn = (
        Attention(AttentionConfig(dim=256, num_heads=4, num_kv_heads=kv_heads, backend=backend))
        .to(DEVICE)
        .eval()
    )
    x = torch.randn(2, 197, 256, device=DEVICE)
    cos, sin = rope_cos_sin(Rope2D(64).angles((14, 14)), "interleaved")
    rope = (
        torch.cat([torch.ones(1, 64), cos]).to(DEVICE),
        torch.cat([torch.zeros(1, 64), sin]).to(DEVICE),
    )
    with torch.no_grad():
        expected = reference_attention(attn, x, rope)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got = attn(x, rope)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=2e-2, atol=2e-2)  # bf16 (8-bit mantissa)


def test_bf16_model_on_cuda_matches_fp32_model_on_cpu():
    torch.manual_seed(0)
    # LayerScale 1: at its 1e-4 init the blocks barely move the logits and a broken block would pass
    model = vit5.create_model("vit5_tiny", depth=4, num_classes=10, layer_scale=1.0).eval()
    images = torch.randn(4, 3, 224, 224)
    with torch.no_grad():
        expected = model(images)
        model = model.to(DEVICE)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got = model(images.to(DEVICE)).float().cpu()
    assert torch.isfinite(got).all()
    tolerance = 0.05 * expected.abs().max().item()
    without_blocks = model.cpu().forward_head(model.norm(model.prepare_tokens(images)[0]))
    assert (
        without_blocks - expected
    ).abs().max() > 5 * tolerance  # the blocks matter at this tolerance
    torch.testing.assert_close(got, expected, rtol=0.05, atol=tolerance)


def test_fp32_model_on_cuda_matches_cpu_and_compiles():
    torch.manual_seed(0)
    model = vit5.create_model(
        "vit5_tiny", depth=2, img_size=(224, 320), num_classes=10, layer_scale=1.0
    ).eval()
    images = torch.randn(2, 3, 224, 320)
    with torch.no_grad():
        expected = model(images)
        model = model.to(DEVICE)
        got = model(images.to(DEVICE))
        compiled = torch.compile(model, fullgraph=True)(images.to(DEVICE))
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(compiled, got, rtol=1e-3, atol=1e-3)


def test_training_steps_in_bf16_reduce_the_loss():
    torch.manual_seed(0)
    model = vit5.create_model("vit5_tiny", depth=2, img_size=32, patch_size=8, num_classes=4).to(
        DEVICE
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images = torch.randn(16, 3, 32, 32, device=DEVICE)
    labels = torch.arange(16, device=DEVICE) % 4
    losses = []
    for _ in range(30):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0]  # 16 fixed images: memorised within 30 steps


@pytest.mark.parametrize("kv_heads", [6, 3, 1])
def test_kv_cache_allocates_exactly_the_formula_on_cuda(kv_heads):
    layers, batch, head_dim, tokens = 12, 2, 64, 256
    reading, cache = measure_memory(
        lambda: KVCache(
            layers, batch, kv_heads, head_dim, tokens, dtype=torch.bfloat16, device=DEVICE
        ),
        DEVICE,
    )
    # both tensors' sizes are multiples of the allocator's 512-byte blocks, so nothing is rounded
    assert reading.retained == cache.nbytes == 2 * layers * kv_heads * head_dim * tokens * batch * 2


def test_recorded_attention_on_cuda_is_a_distribution_and_matches_cpu():
    torch.manual_seed(0)
    model = vit5.create_model("vit5_tiny", depth=2, num_classes=10).eval()
    images = torch.randn(2, 3, 224, 224)
    with vit5.record(model, layers=[-1]) as cpu_rec, torch.no_grad():
        model(images)
    model = model.to(DEVICE)
    with vit5.record(model, layers=[-1]) as gpu_rec, torch.no_grad():
        model(images.to(DEVICE))
    probs = gpu_rec.attention(-1)
    torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs.sum(-1)), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(probs.cpu(), cpu_rec.attention(-1), rtol=1e-3, atol=1e-4)


def test_rng_state_with_cuda_generators_survives_a_file_round_trip(tmp_path):
    from vit5.schema import parse
    from vit5.train.checkpointing import RandomStates

    torch.manual_seed(0)
    torch.save(
        vars(RandomStates.capture()), tmp_path / "rng_state_0.pt"
    )  # what a checkpoint stores
    state = parse(RandomStates, torch.load(tmp_path / "rng_state_0.pt", weights_only=True))
    assert len(state.cuda) == torch.cuda.device_count()
    first = (torch.randn(8, device=DEVICE), torch.randn(8))
    state.restore()
    torch.testing.assert_close(torch.randn(8, device=DEVICE), first[0], rtol=0, atol=0)
    torch.testing.assert_close(torch.randn(8), first[1], rtol=0, atol=0)


def test_memory_estimates_are_lower_bounds_of_the_measured_peaks():
    from vit5.model.footprint import activation_bytes, training_bytes

    torch.manual_seed(0)
    model = vit5.create_model("vit5_small", num_classes=10).to(DEVICE)
    images, labels = (
        torch.randn(16, 3, 224, 224, device=DEVICE),
        torch.arange(16, device=DEVICE) % 10,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.no_grad():
        model(images)
    inference = torch.cuda.max_memory_allocated() - base
    assert activation_bytes(model.cfg, batch=16) <= inference
    for _ in range(2):  # the second step has the optimizer moments the estimate counts
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peak = (
        torch.cuda.max_memory_allocated() - base + 4 * sum(p.numel() for p in model.parameters())
    )  # + weights
    assert training_bytes(model.cfg, batch=16, ema=False) <= peak


# ---------------------------------------------------------- QK-norm / RoPE, folding, regional compile
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_qk_norm_and_rope_in_bf16_match_the_explicit_fp32_computation(norm):
    from test_layers_attention import explicit_attention64

    torch.manual_seed(0)
    attn = Attention(AttentionConfig(dim=256, num_heads=4, num_kv_heads=2, norm=norm)).eval()
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)
        attn.k_norm.weight.uniform_(0.2, 2.0)
    x = torch.randn(2, 197, 256)
    cos, sin = rope_cos_sin(
        torch.cat([torch.zeros(1, 32), Rope2D(64).angles((14, 14))]), "interleaved"
    )
    expected = explicit_attention64(attn, x, cos, sin).float()
    table = RopeTable(cos.to(DEVICE), sin.to(DEVICE), "interleaved")
    attn = attn.to(DEVICE)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        got = attn(x.to(DEVICE), table)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float().cpu(), expected, rtol=2e-2, atol=2e-2)
    with (
        torch.no_grad()
    ):  # fp32 on CUDA (F.rms_norm, the real RoPE formula): as exact as on the CPU
        got32 = attn(x.to(DEVICE), table).double().cpu()
    assert (got32 - expected.double()).abs().max() <= 1e-4 * expected.abs().max()


def test_regional_compile_with_inductor_on_cuda_equals_eager_and_trains():
    torch.manual_seed(0)
    model = vit5.create_model("vit5_tiny", depth=3, num_classes=10, layer_scale=1.0).to(DEVICE)
    twin = vit5.create_model("vit5_tiny", depth=3, num_classes=10, layer_scale=1.0).to(DEVICE)
    twin.load_state_dict(model.state_dict())
    vit5.compile_blocks(model)  # inductor
    images = torch.randn(4, 3, 224, 224, device=DEVICE)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(images), twin.eval()(images), rtol=1e-3, atol=1e-3)
    model.train()
    twin.train()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss, twin_loss = (
            model(images).float().square().mean(),
            twin(images).float().square().mean(),
        )
    loss.backward()
    twin_loss.backward()
    torch.testing.assert_close(loss, twin_loss, rtol=2e-2, atol=1e-3)
    grads = [(p.grad, q.grad) for p, q in zip(model.parameters(), twin.parameters())]
    assert all(g is not None and torch.isfinite(g).all() for g, _ in grads)
    torch.testing.assert_close(
        model.blocks[0].attn.qkv.weight.grad,
        twin.blocks[0].attn.qkv.weight.grad,
        rtol=5e-2,
        atol=5e-2 * twin.blocks[0].attn.qkv.weight.grad.abs().max().item(),
    )
