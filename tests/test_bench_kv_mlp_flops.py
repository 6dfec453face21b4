"""Correctness parts of the benchmark: KV-cache bytes, SwiGLU/GELU parameter parity, FLOP counts."""

import math

import pytest
import torch

import vit5
from vit5.bench.components import build_mlps, kv_head_counts, measure_bytes_per_token, weight_count
from vit5.bench.config import BenchConfig
from vit5.bench.measure import analytic_forward_flops, counted_forward_flops


@pytest.mark.parametrize("dtype,element", [("fp32", 4), ("bf16", 2)])
def test_kv_cache_bytes_equal_the_formula_for_mha_gqa_mqa(dtype, element):
    cfg = BenchConfig.profile(
        "smoke", dtype=dtype, kv_layers=3, kv_heads=6, kv_head_dim=8, kv_tokens=5, kv_batch=2
    )
    assert kv_head_counts(6) == [6, 3, 2, 1]  # MHA, GQA-3, GQA-2, MQA
    for kv_heads in kv_head_counts(6):
        r = measure_bytes_per_token(cfg, kv_heads)
        textbook = 2 * 3 * kv_heads * 8 * element  # 2 (K and V) * layers * n_kv * head_dim * bytes
        assert r["retained_bytes"] == textbook * 5 * 2  # tokens * batch, nothing else held
        assert r["measured_per_token"] == textbook


def test_swiglu_8d_3_has_the_weights_of_gelu_4d():
    d = 384  # 8d/3 = 1024 is already a multiple of 64: exact parity
    mlps = build_mlps(d)
    assert weight_count(mlps["gelu 4d"]) == 2 * d * 4 * d
    assert weight_count(mlps["swiglu 8d/3"]) == 3 * d * (8 * d // 3) == weight_count(mlps["gelu 4d"])
    assert weight_count(mlps["swiglu 4d"]) == 3 * d * 4 * d  # the unfair comparison: 1.5x
    # GELU keeps its biases, SwiGLU has none
    assert sum(p.numel() for p in mlps["gelu 4d"].parameters()) == 2 * d * 4 * d + 4 * d + d
    assert sum(p.numel() for p in mlps["swiglu 8d/3"].parameters()) == 3 * d * 1024


def test_swiglu_rounding_is_upward_to_the_multiple():
    d = 64  # 8d/3 = 170.7 -> 192
    hidden = 64 * math.ceil(8 * d / 3 / 64)
    assert weight_count(build_mlps(d)["swiglu 8d/3"]) == 3 * d * hidden == 36864


@pytest.mark.parametrize(
    "overrides",
    [
        dict(depth=2),
        dict(depth=2, num_kv_heads=1, mlp="swiglu"),
        dict(depth=1, img_size=(32, 64), num_registers=0, class_token=False, global_pool="avg"),
    ],
)
def test_counted_flops_match_the_analytic_formula(overrides):
    model = vit5.create_model("vit5_tiny", **overrides).eval()
    h, w = model.cfg.img_size
    assert counted_forward_flops(model, torch.randn(2, 3, h, w)) == analytic_forward_flops(model.cfg, batch=2)


def test_analytic_flops_of_vit5_small_match_the_published_count():
    # ViT-5-Small at 224: about 4.70 GMACs per image (DeiT-S/16, 197 tokens, is 4.6: arXiv 2012.12877
    # Tab. 1; the 4 registers make 201 tokens)
    macs = analytic_forward_flops(vit5.preset_config("vit5_small")) / 2
    assert macs / 1e9 == pytest.approx(4.70, abs=0.01)
