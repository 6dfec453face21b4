"""Section 2: what RoPE, registers and QK-Norm cost, measured on the same model.

ViT-5 at the target size is timed with all its parts, without each one, and without all three
(same width, depth, APE, LayerScale, RMSNorm), side by side. The cost of a part is the paired
ratio ``t(full) / t(without it) - 1``. Registers add 4 tokens (201 instead of 197 at 224), so
about 2% of their cost is simply more tokens.

Much of what the parts cost is element-wise work (QK-norm, RoPE) that eager PyTorch runs as
separate kernels, forward and backward. A second measurement therefore times the full model and
the model without all three run three ways, all six side by side: eagerly, fused for inference
(:func:`vit5.fuse_for_inference`, forward only) and with each block compiled
(:func:`vit5.compile_blocks` with ``compile_backend``: what a run with ``model.compile=regional``
pays).
"""

from __future__ import annotations

import vit5
from vit5.bench.context import BenchContext
from vit5.bench.models import ModelSpec, build_vit5, modern_variants
from vit5.bench.plots import bar_chart
from vit5.bench.results import Section, Table, Target
from vit5.bench.throughput import MODES, measure_throughput
from vit5.bench.timing import paired_ratio, speedup

MAX_COST_PERCENT = 5.0


def run(ctx: BenchContext) -> Section:
    cfg = ctx.cfg
    size = cfg.size_for_targets
    spec = ModelSpec(size, cfg.img_size, cfg.depth)
    variants = modern_variants()
    ctx.log(f"modern parts: vit5_{size} as {', '.join(variants)}")
    models = {name: build_vit5(spec, **overrides).eval() for name, overrides in variants.items()}
    result = measure_throughput(models, cfg.img_size, cfg.batch, cfg.timing, cfg.device, cfg.dtype)
    section = Section(
        "modern_cost",
        "The cost of the modern parts",
        f"vit5_{size} with and without RoPE (patch and register), registers and QK-Norm; "
        "cost = paired t(full) / t(variant) - 1, in percent (negative: the variant is slower, i.e. noise).",
    )
    costs: dict[str, dict[str, float]] = {mode: {} for mode in MODES}
    rows = []
    for name, overrides in variants.items():
        cells: list[object] = [name, ", ".join(f"{k}={v}" for k, v in overrides.items()) or "-"]
        for mode in MODES:
            ratio = paired_ratio(result.samples[mode]["full"], result.samples[mode][name])
            costs[mode][name] = 100 * (ratio.median - 1)
            spread = f"{100 * (ratio.q1 - 1):+.0f} to {100 * (ratio.q3 - 1):+.0f}"
            cells += [f"{result.images_per_s(mode, name):.1f}", f"{costs[mode][name]:+.1f}% ({spread})"]
        rows.append(tuple(cells))
    columns = (
        "variant",
        "overrides",
        "forward img/s",
        "full's cost (IQR)",
        "train img/s",
        "full's cost (IQR)",
    )
    title = f"vit5_{size} @ {cfg.img_size} ({cfg.device}, {cfg.dtype})"
    section.tables.append(Table(title, columns, tuple(rows)))
    section.notes.append(
        "The per-round spread (IQR) is the noise of this run: single-part costs inside it, or that do not "
        "add up to the combined cost, are not resolved by this run."
    )
    ways_table, ways_costs = _cost_by_way(ctx, spec, variants)
    section.tables.append(ways_table)
    if cfg.compile_backend == "inductor":
        section.notes.append(
            "Regional: inductor fuses each block's element-wise work, forward and backward; "
            "this cost is what training with model.compile=regional pays."
        )
    else:
        section.notes.append(
            f"Regional rows use backend {cfg.compile_backend!r}, which generates no code: "
            "they exercise the path, they do not measure fusion."
        )
    for mode in MODES:
        label = f"RoPE + registers + QK-Norm together, {mode} (vit5_{size})"
        section.targets.append(
            Target(label, costs[mode]["none"], MAX_COST_PERCENT, higher_is_better=False, unit="%")
        )
    parts = [n for n in variants if n != "full"]
    path = ctx.figure("modern_cost.png")
    bar_chart(
        path,
        parts,
        {m: [costs[m][p] for p in parts] for m in MODES},
        title=f"Cost of the full model over each variant, vit5_{size}",
        ylabel="% slower than variant",
        reference_line=MAX_COST_PERCENT,
    )
    section.figures.append(ctx.relative(path))
    section.data = {"costs_percent": costs, "run": result.to_dict(), "by_way": ways_costs}
    return section


WAYS: dict[str, str] = {"eager": "", "fused": " fused", "regional": " regional"}


def _cost_by_way(
    ctx: BenchContext, spec: ModelSpec, variants: dict[str, dict[str, object]]
) -> tuple[Table, dict[str, object]]:
    """``full`` and ``none`` eager, fused for inference and regionally compiled, timed side by side."""
    cfg = ctx.cfg
    models = {}
    for name in ("full", "none"):
        models[name] = build_vit5(spec, **variants[name])
        models[f"{name} fused"] = vit5.fuse_for_inference(build_vit5(spec, **variants[name]))
        models[f"{name} regional"] = vit5.compile_blocks(
            build_vit5(spec, **variants[name]), backend=cfg.compile_backend
        )
    ctx.log(f"modern parts: full and none, eager / fused / regional ({cfg.compile_backend}), side by side")
    result = measure_throughput(models, cfg.img_size, cfg.batch, cfg.timing, cfg.device, cfg.dtype)
    rows, costs = [], {}
    for way, suffix in WAYS.items():
        for mode in MODES:
            samples = result.samples[mode]
            if "full" + suffix not in samples:
                continue  # a fused model has no training step
            ratio = paired_ratio(samples["full" + suffix], samples["none" + suffix])
            costs[f"{way} {mode}"] = {"cost_percent": 100 * (ratio.median - 1), "ratio": ratio.to_dict()}
            spread = f"{100 * (ratio.q1 - 1):+.0f} to {100 * (ratio.q3 - 1):+.0f}"
            rows.append(
                (
                    way,
                    mode,
                    f"{result.images_per_s(mode, 'full' + suffix):.1f}",
                    f"{result.images_per_s(mode, 'none' + suffix):.1f}",
                    f"{100 * (ratio.median - 1):+.1f}% ({spread})",
                )
            )
    for way in ("fused", "regional"):
        for mode in MODES:
            if f"full {way}" in result.samples[mode]:
                gain = speedup(result.samples[mode][f"full {way}"], result.samples[mode]["full"])
                costs[f"{way} over eager {mode} (full)"] = gain.to_dict()
                cell = f"{gain.median:.2f}x ({gain.q1:.2f}-{gain.q3:.2f})"
                rows.append((f"{way} over eager (full)", mode, "", "", cell))
    title = f"full vs none, three ways of running them (side by side; {cfg.device}, {cfg.dtype})"
    table = Table(title, ("way", "step", "full img/s", "none img/s", "full's cost (IQR)"), tuple(rows))
    return table, costs
