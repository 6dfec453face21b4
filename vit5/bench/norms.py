"""Section 7: RMSNorm against LayerNorm, per call, inside a block, and as a share of the block.

RMSNorm (Zhang and Sennrich, 2019) drops LayerNorm's mean subtraction and bias: one reduction
instead of two. Whether that shows depends on the kernels: a norm that is 2% of a block's time
cannot make the block 20% faster. The share is measured two ways: ``1 - t(block without norms) /
t(block)`` (all four norms of a ViT-5 block replaced by identities) and the sum of the four
per-call times over the block time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vit5.bench.context import BenchContext
from vit5.bench.results import Section, Table, Target
from vit5.bench.timing import Samples, device_sync, measure, speedup
from vit5.layers import AttentionConfig, Block, BlockConfig, make_norm

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


def run(ctx: BenchContext) -> Section:
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
        "The targets restate the claim 'RMSNorm is cheaper' (modern-deltas); the issue sets no number. "
        "The share tells how much any norm change can matter."
    )
    section.data = {
        "samples": {k: {n: x.to_dict() for n, x in v.items()} for k, v in samples.items()},
        "shares": {f"{k[0]}/{k[1]}": {"removed": v[0], "sum_of_calls": v[1]} for k, v in shares.items()},
    }
    return section
