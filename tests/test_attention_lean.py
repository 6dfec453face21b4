"""The lean attention recording: summarise_attention equals an explicit float64
softmax(q k^T * scale) to 1e-6; vit5 and timm (ViT, DINOv3 Eva with RoPE) feed it with their
fused kernels kept; the lean figures equal those of the full capture; rollout without N x N."""

from dataclasses import replace

import numpy as np
import pytest
import timm
import torch
from viz_support import sharpen, smooth_images, tiny_timm, tiny_vit5

import vit5
from vit5.bench.measure import measure_memory
from vit5.errors import InputError
from vit5.model.capture import (
    CHUNK_ARRAYS,
    CHUNK_BYTES,
    AttentionKeep,
    query_chunk,
    received_from,
    summarise_attention,
    summarise_probabilities,
)
from vit5.viz.collect import (
    CollectConfig,
    capture,
    collect,
    figure_keep,
    rollout_row,
    rollout_start,
    rollout_step,
)

TOLERANCE = dict(rtol=0, atol=1e-6)
# entropy sums p |ln p|, which scales the fp32 rounding of the scores (as in a full fp32 capture)
ENTROPY_TOLERANCE = dict(rtol=1e-6, atol=1e-6)


def reference(q, k, scale, causal=False):
    """The explicit softmax in float64, independent of vit5."""
    scores = (q.double() @ k.double().transpose(-2, -1)) * scale
    if causal:
        n = q.shape[2]
        m = k.shape[2]
        hidden = torch.ones(n, m, dtype=torch.bool).triu(m - n + 1)
        scores = scores.masked_fill(hidden, float("-inf"))
    return scores.softmax(dim=-1)


def sharp_qk(b=2, h=3, n=37, d=16, m=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g) * 2.5
    k = torch.randn(b, h, m or n, d, generator=g) * 2.5
    return q, k


def same_summary(a, b):
    for name in ("rows", "received", "mass_to", "peak"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), **TOLERANCE)
    torch.testing.assert_close(a.entropy, b.entropy, **ENTROPY_TOLERANCE)


def close(actual, expected, tolerance=TOLERANCE):
    torch.testing.assert_close(actual.double(), expected, **tolerance)


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_every_kept_quantity_equals_the_float64_softmax(chunk):
    q, k = sharp_qk()
    scale = 16**-0.5
    a = reference(q, k, scale)
    assert a.amax() > 0.9  # sharp rows: not a vacuous comparison
    keep = AttentionKeep(rows=(0, 3, 36), mass_to=(1, 2), chunk=chunk)
    s = summarise_attention(q, k, scale, keep)
    close(s.rows, a[:, :, [0, 3, 36]])
    close(s.row(3), a[:, :, 3])
    close(s.received, a.mean(dim=2))
    close(s.mass_to, a[..., [1, 2]].sum(dim=-1))
    close(s.peak, a.amax(dim=-1))
    entropy = -(a * a.clamp_min(1e-300).log()).sum(dim=-1)
    close(s.entropy, entropy, ENTROPY_TOLERANCE)
    full = summarise_attention(q, k, scale, AttentionKeep.full(chunk=chunk))
    close(full.full(), a)
    assert full.received is None and s.q is None
    with pytest.raises(KeyError, match="keep=AttentionKeep.full"):
        s.full()
    with pytest.raises(KeyError, match="token 5 was not kept"):
        s.row(5)


def test_only_the_kept_rows_are_computed_when_nothing_else_is_asked():
    q, k = sharp_qk()
    keep = AttentionKeep(rows=(4, 2), received=False, head_stats=False)
    s = summarise_attention(q, k, 0.25, keep)
    close(s.rows, reference(q, k, 0.25)[:, :, [4, 2]])
    assert keep.needs_all_queries is False and s.entropy is None


def test_causal_queries_see_keys_up_to_their_position():
    q, k = sharp_qk(n=6, m=11)  # the last 6 of 11 tokens, as with a KV cache
    keep = AttentionKeep(rows=None, mass_to=(0,), chunk=4)
    s = summarise_attention(q, k, 0.3, keep, causal=True)
    a = reference(q, k, 0.3, causal=True)
    close(s.rows, a)
    close(s.received, a.mean(dim=2))
    close(s.entropy, torch.special.entr(a).sum(-1), ENTROPY_TOLERANCE)


def test_probabilities_already_computed_give_the_same_summary():
    q, k = sharp_qk()
    keep = AttentionKeep(rows=(0, 1), mass_to=(1,), chunk=7)
    lean = summarise_attention(q, k, 0.25, keep)
    given = summarise_probabilities(reference(q, k, 0.25).float(), keep)
    same_summary(lean, given)


def test_received_from_is_a_row_vector_times_the_attention():
    q, k = sharp_qk()
    weights = torch.rand(2, 37)
    expected = torch.einsum("bq,bhqk->bhk", weights.double(), reference(q, k, 0.25))
    close(received_from(q, k, 0.25, weights, chunk=6), expected)


def test_bad_keeps_and_inputs_name_the_problem():
    with pytest.raises(InputError, match="chunk=0 must be a positive number"):
        AttentionKeep(chunk=0)
    with pytest.raises(InputError, match="rows=.* must be token indices"):
        AttentionKeep(rows=(-1,))
    q, k = sharp_qk()
    with pytest.raises(InputError, match="rows names token 40, but there are 37"):
        summarise_attention(q, k, 0.25, AttentionKeep(rows=(40,)))
    with pytest.raises(InputError, match="expand grouped key heads"):
        summarise_attention(q, k[:, :1], 0.25, AttentionKeep())


def test_lean_recording_never_holds_n_squared():
    n = 2048
    heads = 2
    q, k = sharp_qk(b=1, h=heads, n=n, d=32)
    keep = AttentionKeep(rows=(0,), chunk=128)
    with torch.inference_mode():
        reading, _ = measure_memory(lambda: summarise_attention(q, k, 0.1, keep))
    matrix = heads * n * n * 4
    assert reading.peak < matrix / 4  # three [H, 128, N] chunks and the outputs


def _vit5_full_and_lean(model, x, keep):
    with torch.no_grad(), vit5.record(model, layers=[-1]) as full:
        plain_free = model(x)
    with torch.no_grad(), vit5.record(model, layers=[-1], keep=keep) as lean:
        model(x)
    return full.summary(-1), lean.summary(-1), plain_free


def test_vit5_with_grouped_heads_records_lean_with_its_fused_kernel_kept():
    model = tiny_vit5(num_heads=4, num_kv_heads=2)
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        plain = model(x)
    layout = model.token_layout((4, 6))
    keep = figure_keep(layout)
    full, lean, recorded = _vit5_full_and_lean(model, x, keep)
    torch.testing.assert_close(recorded, plain, rtol=0, atol=0)  # the output path is untouched
    expected = summarise_probabilities(full.full(), keep)
    assert full.full().amax() > 5 / layout.num_tokens
    same_summary(lean, expected)
    head_dim = model.blocks[-1].attn.head_dim
    assert lean.q.shape == lean.k.shape == (2, 4, layout.num_tokens, head_dim)  # heads expanded


def dinov3_tiny():
    cfg = dict(depth=2, embed_dim=64, num_heads=2, img_size=32, patch_size=8, num_classes=0)
    return sharpen(timm.create_model("vit_small_patch16_dinov3", pretrained=False, **cfg))


def timm_explicit_attention(model, x):
    """timm's own explicit softmax (fused_attn off, attn_drop's output hooked): the reference."""
    found = {}
    handles = []

    def keeper(i):
        def keep(module, args, out) -> None:  # returns None: the output is not replaced
            found[i] = out.double()

        return keep

    for i, blk in enumerate(model.blocks):
        blk.attn.fused_attn = False
        handles.append(blk.attn.attn_drop.register_forward_hook(keeper(i)))
    with torch.no_grad():
        model(x)
    for blk, handle in zip(model.blocks, handles):
        blk.attn.fused_attn = True
        handle.remove()
    return found


@pytest.mark.parametrize("build", [dinov3_tiny, tiny_timm], ids=["dinov3-eva-rope", "vit-reg"])
def test_timm_lean_capture_equals_timms_explicit_softmax(build):
    model = build()
    x = torch.randn(2, 3, 32, 48)
    expected = timm_explicit_attention(model, x)
    layout = vit5.viz.describe(model).layout((32, 48))
    assert layout.num_registers == 4
    keep = figure_keep(layout)
    with torch.no_grad(), capture(model, keep=keep) as lean:
        model(x)
    with torch.no_grad(), capture(model) as full:
        model(x)
    assert all(blk.attn.fused_attn for blk in model.blocks)
    for i, a in expected.items():
        assert a.amax() > 5 / layout.num_tokens
        s = lean.summaries[i]
        close(full.attentions[i], a)
        close(s.rows, a[:, :, list(keep.rows)])
        close(s.received, a.mean(dim=2))
        close(s.mass_to, a[..., list(keep.mass_to)].sum(-1))
        close(s.entropy, torch.special.entr(a).sum(-1), ENTROPY_TOLERANCE)


def test_rollout_row_equals_the_full_matrix_product():
    layout = vit5.TokenLayout((3, 4), 1, 2)
    blocks = [sharp_qk(n=layout.num_tokens, seed=s) + (0.25,) for s in range(3)]
    product = None
    for q, k, scale in blocks:
        product = rollout_step(product, reference(q, k, scale).float())
    for cls in (True, False):
        lay = layout if cls else vit5.TokenLayout((3, 4), 0, 3)
        start = rollout_start(lay, 2, torch.device("cpu"))
        expected = (start[:, None].double() @ product.double())[:, 0]
        close(rollout_row(start, blocks, chunk=5), expected)


@pytest.mark.parametrize("build", [tiny_vit5, dinov3_tiny])
def test_lean_figures_equal_the_full_capture(build):
    model = build()
    images = smooth_images(3)
    lean = collect(model, images, "m", CollectConfig(batch_size=2, progress=False))
    full_cfg = CollectConfig(batch_size=2, progress=False, full_attention=True)
    full = collect(model, images, "m", full_cfg)
    for name in ("received", "cls_attn", "reg_attn", "patch_to_reg", "head_entropy", "rollout"):
        np.testing.assert_allclose(getattr(lean, name), getattr(full, name), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(lean.norms, full.norms)
    assert lean.head_peak.shape == (3, 2, 2 if build is dinov3_tiny else 3)


def test_a_recording_without_rollout_keeps_no_queries_and_keys():
    model = tiny_vit5()
    images = smooth_images(2)
    layout = vit5.viz.describe(model).layout(images[0].rgb.shape[:2])
    kept = {}
    with torch.no_grad(), capture(model, keep=figure_keep(layout, rollout=False)) as rec:
        model(torch.randn(1, 3, *images[0].rgb.shape[:2]))
        kept.update(rec.summaries)
    assert kept and all(s.q is None and s.k is None for s in kept.values())
    cfg = CollectConfig(batch_size=2, progress=False, rollout=False)
    stats = collect(model, images, "m", cfg)
    assert stats.rollout is None and stats.received is not None
    with_rollout = collect(model, images, "m", replace(cfg, rollout=True))
    np.testing.assert_array_equal(stats.received, with_rollout.received)


def test_the_query_chunk_fits_its_memory_budget():
    assert query_chunk(6, 4_100) == 227  # 1024 px, vit5_small
    assert query_chunk(6, 16_385) == 56  # 2048 px
    assert query_chunk(6, 10**9) == 1
    assert CHUNK_ARRAYS * 6 * query_chunk(6, 16_385) * 16_385 * 4 <= CHUNK_BYTES


@pytest.mark.parametrize("rollout", [True, False])
def test_the_memory_check_estimate_bounds_the_measured_recording(rollout):
    from vit5.introspect.load import load_spec
    from vit5.viz.runner import recording_estimate

    loaded = load_spec("vit5_tiny", {"depth": 3}, random_init=True)
    images = smooth_images(1)
    size = images[0].rgb.shape[:2]
    cfg = CollectConfig(batch_size=1, progress=False, rollout=rollout)
    reading, _ = measure_memory(lambda: collect(loaded.model, images, "m", cfg, loaded.info))
    estimate = recording_estimate(loaded.info, size, 1, rollout)
    # a lower bound (it refuses what cannot fit), and not a loose one
    assert estimate <= reading.peak < 20 * estimate
