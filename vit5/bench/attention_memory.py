"""Section 4: attention peak memory and time against sequence length, fused SDPA against eager.

The eager path (:func:`vit5.layers.eager_attention`, the official code's way) materialises the
``[B, heads, n, n]`` scores and probabilities; SDPA (FlashAttention-style kernels, on CPU too)
tiles the softmax and never does, so its memory grows with n and eager's with n^2 (Dao et al.,
2022). Both are exact: outputs must agree to float rounding, or a mask or scale is wrong.
Peak memory is measured as described in :mod:`vit5.bench.memory`; eager lengths whose n x n
tensors would exceed ``attn_eager_max_bytes`` are skipped (and said so), not estimated.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from vit5.bench.config import BenchConfig
from vit5.bench.context import BenchContext
from vit5.bench.memory import measure_memory
from vit5.bench.plots import line_chart
from vit5.bench.results import Section, Table, Target, format_bytes
from vit5.bench.timing import device_sync, measure
from vit5.layers import eager_attention

TARGET_TOKENS = 8192
MAX_SDPA_FRACTION = 0.25

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
BACKENDS: dict[str, AttentionFn] = {
    "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    "eager": lambda q, k, v: eager_attention(q, k, v)[0],
}


def eager_score_bytes(batch: int, heads: int, tokens: int, dtype: torch.dtype) -> int:
    """Bytes of eager's n x n tensors alive at once: the scores and the fp32 probabilities."""
    element = torch.empty((), dtype=dtype).element_size()
    return batch * heads * tokens * tokens * (element + 4)


def _flash_attn_backend() -> AttentionFn | None:
    try:
        from flash_attn import flash_attn_func
    except ImportError:
        return None

    def flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

    return flash


def backends_for(device: str, dtype: str) -> dict[str, AttentionFn]:
    """SDPA and eager everywhere; the flash-attn package too on CUDA in bf16 when installed."""
    backends = dict(BACKENDS)
    flash = _flash_attn_backend() if torch.device(device).type == "cuda" and dtype == "bf16" else None
    if flash is not None:
        backends["flash_attn"] = flash
    return backends


def _measure_length(
    cfg: BenchConfig, n: int, dtype: torch.dtype, backends: dict[str, AttentionFn]
) -> dict[str, dict[str, float]]:
    """Peak memory, median time and difference from eager of each backend at ``n`` tokens. The inputs
    live in this frame only, so they are freed before the next length is measured."""
    generator = torch.Generator().manual_seed(n)
    shape = (cfg.attn_batch, cfg.attn_heads, n, cfg.attn_head_dim)
    q, k, v = (torch.randn(shape, generator=generator).to(cfg.device, dtype) for _ in range(3))
    outputs, result = {}, {}
    with torch.inference_mode():
        for name, fn in backends.items():
            reading, outputs[name] = measure_memory(lambda fn=fn: fn(q, k, v), cfg.device)
            result[name] = {"peak_bytes": reading.peak}
        samples = measure(
            {b: (lambda fn=fn: fn(q, k, v)) for b, fn in backends.items()},
            cfg.attn_timing,
            device_sync(cfg.device),
        )
    for name in backends:
        result[name]["seconds"] = samples[name].median
        if "eager" in outputs:
            diff = (outputs[name].float() - outputs["eager"].float()).abs().max().item()
            result[name]["max_abs_diff_vs_eager"] = diff
    return result


def run(ctx: BenchContext) -> Section:
    cfg = ctx.cfg
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
    backends = backends_for(cfg.device, cfg.dtype)
    section = Section(
        "attention_memory",
        "Attention memory and time against sequence length",
        f"One attention call, batch {cfg.attn_batch}, {cfg.attn_heads} heads of {cfg.attn_head_dim}, "
        f"{cfg.dtype}, inference: peak tensor memory, median time, and the largest output difference "
        "from eager.",
    )
    results: dict[int, dict[str, dict[str, float]]] = {}
    for n in cfg.attn_seq_lens:
        too_big = eager_score_bytes(cfg.attn_batch, cfg.attn_heads, n, dtype) > cfg.attn_eager_max_bytes
        names = [b for b in backends if not (b == "eager" and too_big)]
        ctx.log(f"attention n={n}: {', '.join(names)}")
        results[n] = _measure_length(cfg, n, dtype, {b: backends[b] for b in names})
    rows = []
    for n, by_backend in results.items():
        sdpa, eager = by_backend["sdpa"], by_backend.get("eager")
        rows.append(
            (
                n,
                format_bytes(sdpa["peak_bytes"]),
                format_bytes(eager["peak_bytes"]) if eager else "skipped",
                f"{eager['peak_bytes'] / sdpa['peak_bytes']:.1f}x" if eager else "-",
                f"{1e3 * sdpa['seconds']:.2f}",
                f"{1e3 * eager['seconds']:.2f}" if eager else "-",
                f"{eager['seconds'] / sdpa['seconds']:.2f}x" if eager else "-",
                f"{sdpa['max_abs_diff_vs_eager']:.1e}" if eager else "-",
            )
        )
    columns = (
        "tokens",
        "sdpa peak",
        "eager peak",
        "eager/sdpa memory",
        "sdpa ms",
        "eager ms",
        "sdpa speed-up",
        "max |sdpa - eager|",
    )
    section.tables.append(Table(f"Attention ({cfg.device}, {cfg.dtype})", columns, tuple(rows)))
    if TARGET_TOKENS in results and "eager" in results[TARGET_TOKENS]:
        at_target = results[TARGET_TOKENS]
        fraction = at_target["sdpa"]["peak_bytes"] / at_target["eager"]["peak_bytes"]
        section.targets.append(
            Target(
                f"sdpa peak memory / eager peak at {TARGET_TOKENS} tokens",
                fraction,
                MAX_SDPA_FRACTION,
                higher_is_better=False,
            )
        )
    else:
        section.notes.append(
            f"The {TARGET_TOKENS}-token target was not measured in this run (lengths: "
            f"{cfg.attn_seq_lens}, eager limit {format_bytes(cfg.attn_eager_max_bytes)})."
        )
    lengths = list(results)
    names = list(backends)
    for key, label, scale in (("peak_bytes", "peak memory (MiB)", 2**-20), ("seconds", "time (ms)", 1e3)):
        path = ctx.figure(f"attention_{key}.png")
        series = {
            b: [results[n][b][key] * scale if b in results[n] else None for n in lengths] for b in names
        }
        line_chart(
            path,
            lengths,
            series,
            title=f"Attention {label} vs tokens",
            xlabel="tokens",
            ylabel=label,
            logx=True,
            logy=True,
        )
        section.figures.append(ctx.relative(path))
    section.data = {"results": {str(n): r for n, r in results.items()}}
    return section
