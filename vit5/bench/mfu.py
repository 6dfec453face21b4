"""Section 3: model FLOPs utilisation (MFU) of the forward.

Achieved FLOP/s = forward FLOPs (matrix products, counted by ``FlopCounterMode`` and checked
against the analytic formula) / forward time. The machine's attainable peak is not a datasheet
number but a large square matmul in the same dtype, timed in the same rounds as the models, so
MFU = achieved / matmul FLOP/s is a paired ratio that a busy machine affects on both sides.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vit5.bench.context import BenchContext
from vit5.bench.flops import analytic_forward_flops, counted_forward_flops
from vit5.bench.models import EAGER_CONTENDERS, ModelSpec, build_contender
from vit5.bench.plots import bar_chart
from vit5.bench.results import Section, Table
from vit5.bench.throughput import autocast_context, forward_step
from vit5.bench.timing import Quartiles, device_sync, measure

MATMUL = "matmul"


def matmul_step(n: int, device: str, dtype: str) -> tuple[Callable[[], torch.Tensor], int]:
    """``a @ b`` for two n x n matrices in the benchmark dtype; returns (step, FLOPs per call)."""
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=generator).to(device, torch_dtype)
    b = torch.randn(n, n, generator=generator).to(device, torch_dtype)
    return (lambda: a @ b), 2 * n**3


def run(ctx: BenchContext) -> Section:
    cfg = ctx.cfg
    size = cfg.size_for_targets
    spec = ModelSpec(size, cfg.img_size, cfg.depth)
    images = torch.randn(cfg.batch, 3, cfg.img_size, cfg.img_size, generator=torch.Generator().manual_seed(0))
    models = {name: build_contender(name, spec).to(cfg.device) for name in EAGER_CONTENDERS}
    images = images.to(cfg.device)
    flops = {name: counted_forward_flops(m, images) for name, m in models.items()}
    analytic = analytic_forward_flops(models["vit5"].cfg, cfg.batch)
    amp = autocast_context(cfg.device, cfg.dtype)
    steps = {name: forward_step(m, images, amp) for name, m in models.items()}
    steps[MATMUL], matmul_flops = matmul_step(cfg.matmul_size, cfg.device, cfg.dtype)
    ctx.log(f"MFU: {', '.join(models)} against a {cfg.matmul_size}^2 matmul")
    samples = measure(steps, cfg.timing, device_sync(cfg.device))
    peak = Quartiles.of([matmul_flops / s for s in samples[MATMUL].seconds])
    section = Section(
        "mfu",
        "Model FLOPs utilisation",
        f"Forward FLOP/s of each contender (vit5_{size} size, batch {cfg.batch}) over the FLOP/s of a "
        f"{cfg.matmul_size}x{cfg.matmul_size} {cfg.dtype} matmul measured in the same rounds.",
    )
    rows, mfu = [], {}
    for name in models:
        achieved = [flops[name] / s for s in samples[name].seconds]
        ratio = Quartiles.of([a / (matmul_flops / m) for a, m in zip(achieved, samples[MATMUL].seconds)])
        mfu[name] = ratio.median
        rows.append(
            (
                name,
                f"{flops[name] / cfg.batch / 1e9:.2f}",
                f"{Quartiles.of(achieved).median / 1e9:.1f}",
                f"{100 * ratio.median:.1f}% ({100 * ratio.q1:.1f}-{100 * ratio.q3:.1f})",
            )
        )
    section.tables.append(
        Table(
            f"MFU ({cfg.device}, {cfg.dtype}); matmul peak {peak.median / 1e9:.1f} GFLOP/s",
            ("model", "GFLOPs / image", "achieved GFLOP/s", "MFU (IQR)"),
            tuple(rows),
        )
    )
    section.notes.append(
        f"vit5 FLOPs counted {flops['vit5']:,} vs analytic {analytic:,} "
        f"({'equal' if flops['vit5'] == analytic else 'differ'}). The reference path does the same math "
        "(its explicit attention matmuls count the same FLOPs as the fused kernel)."
    )
    path = ctx.figure("mfu.png")
    bar_chart(
        path,
        list(mfu),
        {"MFU %": [100 * v for v in mfu.values()]},
        title="Forward MFU vs same-run matmul",
        ylabel="% of matmul FLOP/s",
    )
    section.figures.append(ctx.relative(path))
    section.data = {
        "flops": flops,
        "analytic_vit5_flops": analytic,
        "matmul_flops_per_s": peak.to_dict(),
        "mfu": mfu,
        "samples": {k: s.to_dict() for k, s in samples.items()},
    }
    return section
