"""The per-component sections: attention memory (4), KV cache (6), norms (7), MLPs (8).

Section 4: attention peak memory and time against sequence length, fused SDPA against eager.

The eager path (:func:`vit5.layers.eager_attention`, the official code's way) materialises the
``[B, heads, n, n]`` scores and probabilities; SDPA (FlashAttention-style kernels, on CPU too)
tiles the softmax and never does, so its memory grows with n and eager's with n^2 (Dao et al.,
2022). Both are exact: outputs must agree to float rounding, or a mask or scale is wrong.
Peak memory is measured as described in :mod:`vit5.bench.measure`; eager lengths whose n x n
tensors would exceed ``attn_eager_max_bytes`` are skipped (and said so), not estimated.

Also here:

* Section 6 (``kv_cache``): KV-cache bytes per token, measured against
  ``2 * layers * n_kv * head_dim * bytes``.
* Section 7 (``norms``): RMSNorm against LayerNorm, per call, inside a block, and as a share of the block.
* Section 8 (``mlp``): SwiGLU at hidden 8d/3 against the GELU MLP at 4d: parameters and time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import vit5
from vit5.bench.config import BenchConfig, BenchContext
from vit5.bench.measure import Samples, device_sync, measure, measure_memory, speedup
from vit5.bench.models import count_parameters
from vit5.bench.report import Section, Table, Target, bar_chart, format_bytes, line_chart
from vit5.layers import (
    Attention,
    AttentionConfig,
    Block,
    BlockConfig,
    KVCache,
    Mlp,
    SwiGLU,
    eager_attention,
    make_norm,
    swiglu_hidden_dim,
)

# -------------------------------------------------------------------------------- attention_memory
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


def run_attention_memory(ctx: BenchContext) -> Section:
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


# ---------------------------------------------------------------------------------------- kv_cache
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


def run_kv_cache(ctx: BenchContext) -> Section:
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


# ------------------------------------------------------------------------------------------- norms
NORMS: tuple[str, ...] = ("rmsnorm", "layernorm")


def build_block(dim: int, heads: int, norm: str) -> Block:
    """A ViT-5 block (pre-norm, QK-Norm, LayerScale, GELU MLP) with the given norm everywhere."""
    torch.manual_seed(0)
    return Block(BlockConfig(attn=AttentionConfig(dim=dim, num_heads=heads, norm=norm), norm=norm))


def strip_norms(block: Block) -> Block:
    """The same block with its four norms (norm1, norm2, q_norm, k_norm) replaced by identities."""
    block.norm1, block.norm2 = nn.Identity(), nn.Identity()
    block.attn.q_norm, block.attn.k_norm = nn.Identity(), nn.Identity()
    return block


def _step(module: nn.Module, x: torch.Tensor, backward: bool) -> Callable[[], None]:
    if not backward:

        def forward() -> None:
            with torch.no_grad():
                module(x)

        return forward
    x = x.detach().requires_grad_()
    grad = torch.randn_like(x)

    def forward_backward() -> None:
        module(x).backward(grad)
        module.zero_grad(set_to_none=True)

    return forward_backward


def run_norms(ctx: BenchContext) -> Section:
    cfg = ctx.cfg
    b, n, dim = cfg.layer_shape
    heads = cfg.layer_heads
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randn(b, n, dim, generator=generator).to(cfg.device)
    per_head = torch.randn(b, heads, n, dim // heads, generator=generator).to(cfg.device)
    modules: dict[str, tuple[nn.Module, torch.Tensor]] = {}
    for norm in NORMS:
        modules[f"{norm} call"] = (make_norm(norm, dim).to(cfg.device), tokens)
        modules[f"{norm} qk call"] = (make_norm(norm, dim // heads).to(cfg.device), per_head)
        modules[f"{norm} block"] = (build_block(dim, heads, norm).to(cfg.device), tokens)
        stripped = strip_norms(build_block(dim, heads, norm)).to(cfg.device)
        modules[f"{norm} block without norms"] = (stripped, tokens)
    passes = {"forward": False, "forward+backward": True}
    samples: dict[str, dict[str, Samples]] = {}
    for label, backward in passes.items():
        ctx.log(f"norms: {label}")
        steps = {name: _step(m, x, backward) for name, (m, x) in modules.items()}
        samples[label] = measure(steps, cfg.op_timing, device_sync(cfg.device))
    section = Section(
        "norms",
        "RMSNorm against LayerNorm",
        f"Activations [{b}, {n}, {dim}], QK-Norm on [{b}, {heads}, {n}, {dim // heads}], {cfg.device} fp32; "
        "a ViT-5 block without RoPE. Times are medians in ms.",
    )
    rows, shares = [], {}
    for label in passes:
        s = samples[label]
        ms = {name: 1e3 * s[name].median for name in s}
        for norm in NORMS:
            measured = 1 - s[f"{norm} block without norms"].median / s[f"{norm} block"].median
            summed = (2 * ms[f"{norm} call"] + 2 * ms[f"{norm} qk call"]) / ms[f"{norm} block"]
            shares[(label, norm)] = (measured, summed)
        for what in ("call", "qk call", "block"):
            ratio = speedup(s[f"rmsnorm {what}"], s[f"layernorm {what}"]).median
            rows.append(
                (
                    label,
                    what,
                    f"{ms[f'rmsnorm {what}']:.3f}",
                    f"{ms[f'layernorm {what}']:.3f}",
                    f"{ratio:.2f}x",
                )
            )
        share_cells = [
            f"{100 * shares[(label, norm)][0]:.1f}% / {100 * shares[(label, norm)][1]:.1f}%" for norm in NORMS
        ]
        rows.append((label, "norm share of block (removed / sum of calls)", *share_cells, "-"))
    columns = ("pass", "measurement", "RMSNorm", "LayerNorm", "RMSNorm speed-up")
    section.tables.append(Table("Norm timing", columns, tuple(rows)))
    for label in passes:
        ratio = speedup(samples[label]["rmsnorm block"], samples[label]["layernorm block"]).median
        section.targets.append(
            Target(f"RMSNorm block at least as fast as LayerNorm block, {label}", ratio, 1.0)
        )
    section.notes.append(
        "The targets restate the claim 'RMSNorm is cheaper' (Zhang & Sennrich, arXiv 1910.07467) without a "
        "number. "
        "The share tells how much any norm change can matter."
    )
    section.data = {
        "samples": {k: {n: x.to_dict() for n, x in v.items()} for k, v in samples.items()},
        "shares": {f"{k[0]}/{k[1]}": {"removed": v[0], "sum_of_calls": v[1]} for k, v in shares.items()},
    }
    return section


# --------------------------------------------------------------------------------------------- mlp
def weight_count(module: nn.Module) -> int:
    """Parameters of the weight matrices only (no biases)."""
    return sum(p.numel() for name, p in module.named_parameters() if name.endswith("weight"))


def build_mlps(dim: int, multiple_of: int = 64) -> dict[str, nn.Module]:
    """GELU at 4d (with biases), SwiGLU at 8d/3 (rounded up, no biases) and SwiGLU at 4d."""
    torch.manual_seed(0)
    return {
        "gelu 4d": Mlp(dim, 4 * dim, bias=True),
        "swiglu 8d/3": SwiGLU(dim, swiglu_hidden_dim(dim, 4.0, multiple_of), bias=False),
        "swiglu 4d": SwiGLU(dim, 4 * dim, bias=False),
    }


def run_mlp(ctx: BenchContext) -> Section:
    cfg = ctx.cfg
    b, n, dim = cfg.layer_shape
    mlps = {name: m.to(cfg.device) for name, m in build_mlps(dim).items()}
    x = torch.randn(b, n, dim, generator=torch.Generator().manual_seed(0)).to(cfg.device)
    xg = x.clone().requires_grad_()
    grad = torch.randn_like(x)

    def forward(m: nn.Module):
        def step() -> None:
            with torch.no_grad():
                m(x)

        return step

    def forward_backward(m: nn.Module):
        def step() -> None:
            m(xg).backward(grad)
            m.zero_grad(set_to_none=True)

        return step

    ctx.log("MLPs: forward and forward+backward")
    sync = device_sync(cfg.device)
    fwd = measure({k: forward(m) for k, m in mlps.items()}, cfg.op_timing, sync)
    bwd = measure({k: forward_backward(m) for k, m in mlps.items()}, cfg.op_timing, sync)
    size = cfg.size_for_targets
    depth = {"depth": cfg.depth} if cfg.depth else {}
    whole = {
        kind: count_parameters(vit5.create_model(f"vit5_{size}", mlp=kind, **depth))
        for kind in ("gelu", "swiglu")
    }
    section = Section(
        "mlp",
        "SwiGLU (8d/3) against GELU (4d)",
        f"One MLP on [{b}, {n}, {dim}], {cfg.device} fp32; parameter counts exact. Speed-up is paired, "
        "vs GELU 4d.",
    )
    rows = []
    for name, m in mlps.items():
        rows.append(
            (
                name,
                m.fc2.in_features,
                f"{count_parameters(m):,}",
                f"{weight_count(m):,}",
                f"{1e3 * fwd[name].median:.3f}",
                f"{speedup(fwd[name], fwd['gelu 4d']).median:.2f}x",
                f"{1e3 * bwd[name].median:.3f}",
                f"{speedup(bwd[name], bwd['gelu 4d']).median:.2f}x",
            )
        )
    section.tables.append(
        Table(
            "MLP",
            (
                "mlp",
                "hidden",
                "params",
                "weights",
                "fwd ms",
                "fwd speed-up",
                "fwd+bwd ms",
                "fwd+bwd speed-up",
            ),
            tuple(rows),
        )
    )
    section.tables.append(
        Table(f"Whole model, vit5_{size}", ("mlp", "params"), tuple((k, f"{v:,}") for k, v in whole.items()))
    )
    gap = abs(weight_count(mlps["swiglu 8d/3"]) - weight_count(mlps["gelu 4d"]))
    section.targets.append(
        Target(
            "SwiGLU 8d/3 vs GELU 4d: weight-matrix parameter difference",
            gap,
            0,
            higher_is_better=False,
            unit="params",
        )
    )
    section.notes.append(
        f"Whole vit5_{size}: SwiGLU/GELU parameter ratio {whole['swiglu'] / whole['gelu']:.4f} "
        "(the difference is GELU's biases and the rounding of 8d/3 up to a multiple of 64)."
    )
    section.data = {
        "params": {k: count_parameters(m) for k, m in mlps.items()},
        "weights": {k: weight_count(m) for k, m in mlps.items()},
        "whole_model_params": whole,
        "forward": {k: s.to_dict() for k, s in fwd.items()},
        "forward_backward": {k: s.to_dict() for k, s in bwd.items()},
    }
    return section
