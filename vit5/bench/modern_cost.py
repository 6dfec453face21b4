"""Section 2: what RoPE, registers and QK-Norm cost, measured on the same model.

ViT-5 at the target size is timed with all its parts, without each one, and without all three
(same width, depth, APE, LayerScale, RMSNorm), side by side. The cost of a part is the paired
ratio ``t(full) / t(without it) - 1``. Registers add 4 tokens (201 instead of 197 at 224), so
about 2% of their cost is simply more tokens.

Much of what the parts cost in training is element-wise work (RMSNorm as QK-norm, RoPE) that eager
PyTorch runs as several small kernels, forward and backward. A second measurement therefore
times the training step of the full model and of the model without all three, eagerly and under
``torch.compile`` (``compile_backend``), all four side by side: the compiled cost is what a run
with ``model.compile=true`` pays.
"""

from __future__ import annotations

import torch

from .context import BenchContext
from .models import ModelSpec, build_vit5, modern_variants
from .plots import bar_chart
from .results import Section, Table, Target
from .throughput import MODES, measure_throughput
from .timing import paired_ratio

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
    columns = ("variant", "overrides", "forward img/s", "full's cost (IQR)", "train img/s",
               "full's cost (IQR)")
    title = f"vit5_{size} @ {cfg.img_size} ({cfg.device}, {cfg.dtype})"
    section.tables.append(Table(title, columns, tuple(rows)))
    section.notes.append(
        "The per-round spread (IQR) is the noise of this run: single-part costs inside it, or that do not "
        "add up to the combined cost, are not resolved by this run."
    )
    compiled_table, compiled_costs = _compiled_train_cost(ctx, spec, variants)
    section.tables.append(compiled_table)
    if cfg.compile_backend == "inductor":
        section.notes.append("Compiled: inductor fuses the parts' element-wise work, forward and backward; "
                             "this cost is what training with model.compile=true pays (target: eager).")
    else:
        section.notes.append(f"Compiled rows use backend {cfg.compile_backend!r}, which generates no code: "
                             "they exercise the path, they do not measure fusion.")
    for mode in MODES:
        label = f"RoPE + registers + QK-Norm together, {mode} (vit5_{size})"
        section.targets.append(
            Target(label, costs[mode]["none"], MAX_COST_PERCENT, higher_is_better=False, unit="%")
        )
    parts = [n for n in variants if n != "full"]
    path = ctx.figure("modern_cost.png")
    bar_chart(path, parts, {m: [costs[m][p] for p in parts] for m in MODES},
              title=f"Cost of the full model over each variant, vit5_{size}", ylabel="% slower than variant",
              reference_line=MAX_COST_PERCENT)
    section.figures.append(ctx.relative(path))
    section.data = {"costs_percent": costs, "run": result.to_dict(), "train_compiled": compiled_costs}
    return section


def _compiled_train_cost(
    ctx: BenchContext, spec: ModelSpec, variants: dict[str, dict[str, object]]
) -> tuple[Table, dict[str, object]]:
    """Training step of ``full`` and ``none``, eager and compiled, timed side by side."""
    cfg = ctx.cfg
    models = {}
    for name in ("full", "none"):
        models[name] = build_vit5(spec, **variants[name])
        twin = build_vit5(spec, **variants[name])
        models[f"{name} compiled"] = torch.compile(twin, backend=cfg.compile_backend)
    ctx.log(f"modern parts, training step: full and none, eager and torch.compile ({cfg.compile_backend})")
    result = measure_throughput(models, cfg.img_size, cfg.batch, cfg.timing, cfg.device, cfg.dtype,
                                modes=("train",))
    samples = result.samples["train"]
    rows, costs = [], {}
    for suffix in ("", " compiled"):
        ratio = paired_ratio(samples["full" + suffix], samples["none" + suffix])
        mode = suffix.strip() or "eager"
        costs[mode] = {"cost_percent": 100 * (ratio.median - 1), "ratio": ratio.to_dict()}
        rows.append((
            mode,
            f"{result.images_per_s('train', 'full' + suffix):.1f}",
            f"{result.images_per_s('train', 'none' + suffix):.1f}",
            f"{100 * (ratio.median - 1):+.1f}% ({100 * (ratio.q1 - 1):+.0f} to {100 * (ratio.q3 - 1):+.0f})",
        ))
    speedup = paired_ratio(samples["full"], samples["full compiled"])
    costs["compile_speedup_full"] = speedup.to_dict()
    rows.append(("compiled over eager (full)", "", "",
                 f"{speedup.median:.2f}x ({speedup.q1:.2f}-{speedup.q3:.2f})"))
    title = f"Training step, full vs none, eager and compiled (side by side; {cfg.device}, {cfg.dtype})"
    table = Table(title, ("mode", "full train img/s", "none train img/s", "full's cost (IQR)"), tuple(rows))
    return table, costs
