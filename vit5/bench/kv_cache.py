"""Section 6: KV-cache bytes per token, measured against ``2 * layers * n_kv * head_dim * bytes``.

A stack of causal attention layers (the ``kv_layers`` x ``kv_heads`` x ``kv_head_dim`` trunk)
decodes ``kv_tokens`` tokens one at a time with a :class:`vit5.layers.KVCache`, for MHA
(n_kv = heads), GQA (every divisor in between) and MQA (n_kv = 1). The measured size is what the
allocator still holds after the decode (see :mod:`vit5.bench.memory`): the cache, plus anything the
decode leaked. Grouped-query attention must shrink it by exactly heads / n_kv (Ainslie et al., 2023).
"""

from __future__ import annotations

import torch

from vit5.bench.config import BenchConfig
from vit5.bench.context import BenchContext
from vit5.bench.memory import measure_memory
from vit5.bench.plots import bar_chart
from vit5.bench.results import Section, Table, Target
from vit5.layers import Attention, AttentionConfig, KVCache


def formula_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """The textbook size of one token's keys and values over all layers (batch 1)."""
    return 2 * layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def kv_head_counts(heads: int) -> list[int]:
    """MHA, every GQA group count, MQA: the divisors of ``heads`` from largest to 1."""
    return [g for g in range(heads, 0, -1) if heads % g == 0]


def decode_with_cache(
    layers: list[Attention], tokens: int, batch: int, dim: int, dtype: torch.dtype, device: str
) -> KVCache:
    """Run ``tokens`` causal decoding steps through ``layers``; return the filled cache."""
    first = layers[0]
    cache = KVCache(len(layers), batch, first.num_kv_heads, first.head_dim, tokens, dtype, device)
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for _ in range(tokens):
            x = torch.randn(batch, 1, dim, generator=generator).to(device, dtype)
            for attn, layer_cache in zip(layers, cache.layers):
                x = attn(x, causal=True, kv_cache=layer_cache)
    return cache


def measure_bytes_per_token(cfg: BenchConfig, kv_heads: int) -> dict[str, int]:
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
    dim = cfg.kv_heads * cfg.kv_head_dim
    attn_cfg = AttentionConfig(dim=dim, num_heads=cfg.kv_heads, num_kv_heads=kv_heads, qk_norm=False)
    layers = [Attention(attn_cfg).to(cfg.device, dtype).eval() for _ in range(cfg.kv_layers)]
    reading, cache = measure_memory(
        lambda: decode_with_cache(layers, cfg.kv_tokens, cfg.kv_batch, dim, dtype, cfg.device), cfg.device
    )
    if cache.length != cfg.kv_tokens:
        raise RuntimeError(f"the decode filled {cache.length} of {cfg.kv_tokens} cache slots")
    tokens = cfg.kv_tokens * cfg.kv_batch
    return {
        "kv_heads": kv_heads,
        "retained_bytes": reading.retained,
        "measured_per_token": reading.retained // tokens,
        "exact_multiple": reading.retained % tokens == 0,
        "formula_per_token": formula_bytes_per_token(cfg.kv_layers, kv_heads, cfg.kv_head_dim, dtype),
    }


def run(ctx: BenchContext) -> Section:
    cfg = ctx.cfg
    section = Section(
        "kv_cache",
        "KV-cache bytes per token",
        f"{cfg.kv_layers} causal attention layers, {cfg.kv_heads} query heads of {cfg.kv_head_dim}, "
        f"{cfg.dtype}, "
        f"batch {cfg.kv_batch}, {cfg.kv_tokens} tokens decoded one by one; bytes still held after the decode "
        "divided by tokens x batch, against 2 * layers * n_kv * head_dim * bytes.",
    )
    rows, results = [], []
    for kv_heads in kv_head_counts(cfg.kv_heads):
        ctx.log(f"KV cache: {kv_heads} kv heads")
        r = measure_bytes_per_token(cfg, kv_heads)
        results.append(r)
        kind = "MHA" if kv_heads == cfg.kv_heads else "MQA" if kv_heads == 1 else f"GQA-{kv_heads}"
        equal = r["exact_multiple"] and r["measured_per_token"] == r["formula_per_token"]
        shrink = results[0]["measured_per_token"] / r["measured_per_token"]
        rows.append(
            (
                kind,
                kv_heads,
                f"{r['measured_per_token']:,}",
                f"{r['formula_per_token']:,}",
                "yes" if equal else "NO",
                f"{shrink:.1f}x",
            )
        )
        excess = r["retained_bytes"] - r["formula_per_token"] * cfg.kv_tokens * cfg.kv_batch
        section.targets.append(
            Target(
                f"{kind}: |measured - formula| bytes held", abs(excess), 0.0, higher_is_better=False, unit="B"
            )
        )
    section.tables.append(
        Table(
            "KV cache",
            ("attention", "kv heads", "measured B/token", "formula B/token", "equal", "smaller than MHA"),
            tuple(rows),
        )
    )
    path = ctx.figure("kv_cache.png")
    bar_chart(
        path,
        [str(r["kv_heads"]) for r in results],
        {
            "measured": [r["measured_per_token"] for r in results],
            "formula": [r["formula_per_token"] for r in results],
        },
        title="KV-cache bytes per token by kv heads",
        ylabel="bytes / token",
    )
    section.figures.append(ctx.relative(path))
    section.data = {"results": results}
    return section
