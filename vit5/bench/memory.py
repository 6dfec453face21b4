"""The ``memory`` section: attention peak memory against sequence length, fused SDPA against eager.

Eager (:func:`vit5.layers.eager_attention`, the official code's way) holds the ``[B, heads, n, n]`` scores
and probabilities, SDPA tiles the softmax (Dao et al., arXiv 2205.14135): memory in n against n^2. Both are
exact, so their outputs must agree. Eager lengths past ``attn_eager_max_bytes`` are skipped, not estimated.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from vit5.bench.config import BenchContext
from vit5.bench.measure import measure_memory
from vit5.bench.report import Section, Table, Target
from vit5.layers import eager_attention
from vit5.runtime import format_bytes

TARGET_TOKENS = 8192
MAX_SDPA_FRACTION = 0.25
BACKENDS = {
    "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    "eager": lambda q, k, v: eager_attention(q, k, v)[0],
}


def eager_score_bytes(batch: int, heads: int, tokens: int, dtype: torch.dtype) -> int:
    """Bytes of eager's n x n tensors alive at once: the scores and the fp32 probabilities."""
    return batch * heads * tokens * tokens * (torch.empty((), dtype=dtype).element_size() + 4)


def run_memory(ctx: BenchContext) -> Section:
    cfg = ctx.cfg
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
    peaks: dict[int, dict[str, int]] = {}
    diffs: dict[int, float] = {}
    rows = []
    for n in cfg.attn_seq_lens:
        eager = eager_score_bytes(1, cfg.attn_heads, n, dtype) <= cfg.attn_eager_max_bytes
        ctx.log(f"attention memory at n={n}" + ("" if eager else " (sdpa only)"))
        g = torch.Generator().manual_seed(n)
        qkv = [
            torch.randn(1, cfg.attn_heads, n, cfg.attn_head_dim, generator=g).to(cfg.device, dtype)
            for _ in "qkv"
        ]
        peaks[n], outputs = {}, {}
        with torch.inference_mode():
            for name in ("sdpa", "eager") if eager else ("sdpa",):
                reading, outputs[name] = measure_memory(partial(BACKENDS[name], *qkv), cfg.device)
                peaks[n][name] = reading.peak
        p = peaks[n]
        if eager:
            diffs[n] = (outputs["sdpa"].float() - outputs["eager"].float()).abs().max().item()
            rows.append(
                (n, format_bytes(p["sdpa"]), format_bytes(p["eager"]), f"{p['eager'] / p['sdpa']:.1f}x")
            )
            rows[-1] += (f"{diffs[n]:.1e}",)
        else:
            rows.append((n, format_bytes(p["sdpa"]), "skipped", "-", "-"))
    columns = ("tokens", "sdpa peak", "eager peak", "eager / sdpa", "max |sdpa - eager|")
    section = Section(
        "memory",
        "Attention memory against sequence length",
        f"One attention call, batch 1, {cfg.attn_heads} heads of {cfg.attn_head_dim}, {cfg.dtype}, "
        f"inference, {cfg.device}: peak tensor memory of fused SDPA and of eager, and their largest "
        "output difference.",
        tables=[Table("Attention peak memory", columns, tuple(rows))],
        data={"peak_bytes": peaks, "max_abs_diff": diffs},
    )
    if TARGET_TOKENS in diffs:
        fraction = peaks[TARGET_TOKENS]["sdpa"] / peaks[TARGET_TOKENS]["eager"]
        name = f"sdpa peak memory / eager peak at {TARGET_TOKENS} tokens"
        section.targets.append(Target(name, fraction, MAX_SDPA_FRACTION, higher_is_better=False))
    else:
        section.notes.append(f"The {TARGET_TOKENS}-token target was not measured ({cfg.attn_seq_lens}).")
    return section
