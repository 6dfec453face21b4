"""The whole-model sections: speed (1), the modern components' cost (2), MFU (3), compilation (5), export.

Section 1: forward and training-step throughput against timm and the official code's way.

Contenders (see :mod:`vit5.bench.models`) are measured side by side: at the base resolution every
contender at the target size (the other sizes: the eager ones and the fused model), at the high
resolution (448: 785 patches) the target size again without the compiled contenders (compiling
for a second shape would double the section's compile time). Ratios are paired per round: "x timm_vit" is
the median over rounds of ``t_timm_vit / t_model`` (> 1: faster than timm's plain ViT, the
yardstick of "free"). A ``torch.profiler`` breakdown (matmul / attention / elementwise share) of
one forward and one training step of the eager contenders says where the differences come from.

Also here:

* Section 2 (``modern_cost``): what RoPE, registers and QK-Norm cost, measured on the same model.
* Section 3 (``mfu``): model FLOPs utilisation (MFU) of the forward.
* Section 5 (``compile``): what ``torch.compile`` buys, whole model against regional (per block)
  compilation.
* ``export``: ONNX Runtime against eager torch: CPU images/s of the same exported model, side by side.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

import torch
import torch._functorch.config
import torch._inductor.config
from torch._dynamo.utils import counters

import vit5
from vit5.bench.config import BenchContext
from vit5.bench.measure import (
    CATEGORIES,
    MODES,
    OpBreakdown,
    Quartiles,
    ThroughputRun,
    analytic_forward_flops,
    autocast_context,
    counted_forward_flops,
    device_sync,
    forward_step,
    measure,
    measure_throughput,
    op_breakdown,
    paired_ratio,
    random_batch,
    speedup,
    train_step,
)
from vit5.bench.models import (
    CONTENDERS,
    EAGER_CONTENDERS,
    ModelSpec,
    build_contender,
    build_vit5,
    count_parameters,
    modern_variants,
)
from vit5.bench.report import Section, Table, Target, bar_chart

# ------------------------------------------------------------------------------------------- speed
YARDSTICK = "timm_vit"
PROFILED: tuple[str, ...] = ("vit5", "vit5_fused", "timm_eva", "timm_vit")


@dataclass(frozen=True)
class SpeedTarget:
    """``fast`` must be at least ``threshold`` times as fast as ``slow`` in ``mode`` at ``resolution``."""

    resolution: str  # "base" or "hires"
    mode: str
    fast: str
    slow: str
    threshold: float


TARGETS: tuple[SpeedTarget, ...] = (
    SpeedTarget("base", "forward", "vit5_fused", "timm_eva", 1.05),
    SpeedTarget("base", "forward", "vit5_fused", "timm_vit", 0.97),
    SpeedTarget("base", "train", "vit5", "timm_eva", 1.03),
    SpeedTarget("base", "train", "vit5_regional", "timm_vit", 1.0),
    SpeedTarget("base", "forward", "vit5", "reference", 1.3),
    SpeedTarget("base", "train", "vit5", "reference", 1.3),
    SpeedTarget("hires", "forward", "vit5", "reference", 1.8),
    SpeedTarget("hires", "train", "vit5", "reference", 1.8),
)


def _measure(
    ctx: BenchContext, size: str, img_size: int, batch: int, names: tuple[str, ...]
) -> tuple[ThroughputRun, dict[str, int]]:
    spec = ModelSpec(size, img_size, ctx.cfg.depth, ctx.cfg.compile_backend)
    models = {name: build_contender(name, spec) for name in names}
    ctx.log(f"throughput {size} @ {img_size}: {', '.join(names)} (batch {batch}; compiled: compile first)")
    run = measure_throughput(models, img_size, batch, ctx.cfg.timing, ctx.cfg.device, ctx.cfg.dtype)
    return run, {name: count_parameters(m) for name, m in models.items()}


def _rows(size: str, run: ThroughputRun, params: dict[str, int]) -> list[tuple]:
    rows = []
    for name in run.samples["forward"]:
        cells: list[object] = [name, size, run.img_size, f"{params[name]:,}"]
        for mode in MODES:
            samples = run.samples[mode]
            if name not in samples:
                cells += ["-", "-"]
                continue
            rate = samples[name].rate(run.batch)
            cells.append(f"{rate.median:.1f} ({rate.q1:.1f}-{rate.q3:.1f})")
            if YARDSTICK in samples:
                ratio = speedup(samples[name], samples[YARDSTICK])
                cells.append(f"{ratio.median:.2f}x ({ratio.q1:.2f}-{ratio.q3:.2f})")
            else:
                cells.append("-")
        rows.append(tuple(cells))
    return rows


def _targets(size: str, resolution: str, run: ThroughputRun) -> list[Target]:
    targets = []
    for t in TARGETS:
        samples = run.samples.get(t.mode, {})
        if t.resolution != resolution or t.fast not in samples or t.slow not in samples:
            continue
        ratio = speedup(samples[t.fast], samples[t.slow]).median
        label = f"{t.fast.replace('vit5', f'vit5_{size}', 1)} {t.mode} speed-up over {t.slow} @{run.img_size}"
        targets.append(Target(label, ratio, t.threshold))
    return targets


def _profiles(ctx: BenchContext, size: str) -> tuple[Table, dict[str, dict[str, object]]]:
    """Operator breakdown of one forward and one training step of each eager contender."""
    cfg = ctx.cfg
    spec = ModelSpec(size, cfg.img_size, cfg.depth, cfg.compile_backend)
    images, labels = random_batch(cfg.batch, cfg.img_size, cfg.device)
    amp = autocast_context(cfg.device, cfg.dtype)
    rows, data = [], {}
    ctx.log(f"operator profile of {', '.join(PROFILED)} ({size} @ {cfg.img_size})")
    for name in PROFILED:
        model = build_contender(name, spec).to(cfg.device)
        steps = {"forward": forward_step(model, images, amp)}
        if name != "vit5_fused":
            steps["train"] = train_step(model, images, labels, amp)
        for mode, step in steps.items():
            breakdown: OpBreakdown = op_breakdown(step, cfg.device, calls=cfg.profile_calls)
            data[f"{name} {mode}"] = breakdown.to_dict()
            top = ", ".join(
                f"{op.removeprefix('aten::')} {100 * s / breakdown.total:.1f}%"
                for op, s in breakdown.top_elementwise[:4]
            )
            rows.append((name, mode, *(f"{100 * breakdown.share(c):.1f}%" for c in CATEGORIES), top))
    columns = ("model", "step", *(f"{c} %" for c in CATEGORIES), "largest elementwise ops")
    title = f"Where the time goes: torch.profiler self time ({size} @ {cfg.img_size}, {cfg.device})"
    return Table(title, columns, tuple(rows)), data


def run_speed(ctx: BenchContext) -> Section:
    cfg = ctx.cfg
    section = Section(
        "speed",
        "Throughput against timm and the official code's way",
        "Images/s of the forward (inference) and of a training step (forward, loss, backward, AdamW), "
        "each contender timed side by side; 'x timm_vit' is the row's paired speed-up over timm's plain "
        "ViT of the same size (> 1: faster). vit5_fused has no training step (inference only).",
    )
    target_size = cfg.size_for_targets
    runs: dict[str, ThroughputRun] = {}
    params: dict[str, dict[str, int]] = {}
    for size in cfg.sizes:
        names = CONTENDERS if size == target_size else (*EAGER_CONTENDERS, "vit5_fused")
        key = f"{size}@{cfg.img_size}"
        runs[key], params[key] = _measure(ctx, size, cfg.img_size, cfg.batch, names)
    hires_key = f"{target_size}@{cfg.hires_img_size}"
    runs[hires_key], params[hires_key] = _measure(
        ctx, target_size, cfg.hires_img_size, cfg.hires_batch, (*EAGER_CONTENDERS, "vit5_fused")
    )

    columns = (
        "model",
        "size",
        "res",
        "params",
        "forward img/s (IQR)",
        "x timm_vit (IQR)",
        "train img/s (IQR)",
        "x timm_vit (IQR)",
    )
    rows = [row for key, r in runs.items() for row in _rows(key.split("@")[0], r, params[key])]
    section.tables.append(Table(f"Throughput ({cfg.device}, {cfg.dtype})", columns, tuple(rows)))
    section.targets += _targets(target_size, "base", runs[f"{target_size}@{cfg.img_size}"])
    section.targets += _targets(target_size, "hires", runs[hires_key])
    profile_table, profile_data = _profiles(ctx, target_size)
    section.tables.append(profile_table)
    section.notes.append(
        "Compiled contenders (vit5_regional: each block compiled, as model.compile=regional; "
        f"timm_eva_compiled: the whole model) use backend {cfg.compile_backend!r}; their compilation "
        "happens in the untimed warm-up"
        + (
            "."
            if cfg.compile_backend == "inductor"
            else ", and this backend generates no code: the rows "
            "exercise the path, they do not measure fusion."
        )
    )
    for mode in MODES:
        ref = {
            k: speedup(r.samples[mode]["timm_vit"], r.samples[mode]["reference"]).median
            for k, r in runs.items()
        }
        section.notes.append(
            f"Context ({mode}): timm's plain ViT over the reference path: "
            + ", ".join(f"{v:.2f}x at {k}" for k, v in ref.items())
            + " (about 1.5x at 224 and 1.9x at 448 were measured elsewhere, on other hardware)."
        )
    for key, r in runs.items():
        names = list(r.samples["forward"])
        rates = {
            mode: [r.samples[mode][n].rate(r.batch) if n in r.samples[mode] else None for n in names]
            for mode in MODES
        }
        series = {mode: [q.median if q else math.nan for q in qs] for mode, qs in rates.items()}
        errors = {
            mode: [(q.q1, q.q3) if q else (math.nan, math.nan) for q in qs] for mode, qs in rates.items()
        }
        path = ctx.figure(f"throughput_{key.replace('@', '_')}.png")
        bar_chart(
            path,
            names,
            series,
            errors,
            title=f"{key} images/s ({cfg.device}, {cfg.dtype})",
            ylabel="images/s",
        )
        section.figures.append(ctx.relative(path))
    section.data = {
        "runs": {k: r.to_dict() for k, r in runs.items()},
        "params": params,
        "op_profile": profile_data,
    }
    return section


# ------------------------------------------------------------------------------------- modern_cost
MAX_COST_PERCENT = 5.0


def run_modern_cost(ctx: BenchContext) -> Section:
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


COST_WAYS: dict[str, str] = {"eager": "", "fused": " fused", "regional": " regional"}


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
    for way, suffix in COST_WAYS.items():
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


# --------------------------------------------------------------------------------------------- mfu
MATMUL = "matmul"


def matmul_step(n: int, device: str, dtype: str) -> tuple[Callable[[], torch.Tensor], int]:
    """``a @ b`` for two n x n matrices in the benchmark dtype; returns (step, FLOPs per call)."""
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=generator).to(device, torch_dtype)
    b = torch.randn(n, n, generator=generator).to(device, torch_dtype)
    return (lambda: a @ b), 2 * n**3


def run_mfu(ctx: BenchContext) -> Section:
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


# --------------------------------------------------------------------------------- compile_speedup
COMPILE_WAYS: tuple[str, ...] = ("eager", "compiled", "regional")


def _build(way: str, spec: ModelSpec) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_vit5(spec)
    if way == "compiled":
        return torch.compile(model, backend=spec.compile_backend)
    if way == "regional":
        return vit5.compile_blocks(model, backend=spec.compile_backend)
    return model


def _first_call(step: Callable[[], None], sync: Callable[[], None]) -> tuple[float, int]:
    """Wall time of one call and the number of graphs dynamo compiled during it."""
    graphs = counters["stats"]["unique_graphs"]
    sync()
    start = time.perf_counter()
    step()
    sync()
    return time.perf_counter() - start, counters["stats"]["unique_graphs"] - graphs


def run_compile(ctx: BenchContext) -> Section:
    cfg = ctx.cfg
    size = cfg.compile_size
    spec = ModelSpec(size, cfg.img_size, cfg.depth, cfg.compile_backend)
    images, labels = random_batch(cfg.batch, cfg.img_size, cfg.device)
    amp = autocast_context(cfg.device, cfg.dtype)
    sync = device_sync(cfg.device)
    models = {way: _build(way, spec).to(cfg.device) for way in COMPILE_WAYS}
    cold: dict[str, dict[str, float]] = {}
    with ExitStack() as stack:  # a cold start: no graphs reused from an earlier process
        stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
        stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
        torch._dynamo.reset()
        for way, model in models.items():
            ctx.log(f"torch.compile ({cfg.compile_backend}) of vit5_{size}: first calls, {way}")
            fwd_s, fwd_graphs = _first_call(forward_step(model, images, amp), sync)
            train_s, train_graphs = _first_call(train_step(model, images, labels, amp), sync)
            cold[way] = {
                "first_forward_s": fwd_s,
                "first_train_step_s": train_s,
                "graphs": fwd_graphs + train_graphs,
            }
    with torch.no_grad():
        for model in models.values():
            model.eval()
        reference = models["eager"](images)
        max_diff = {way: (models[way](images) - reference).abs().max().item() for way in COMPILE_WAYS[1:]}
    ctx.log(f"torch.compile of vit5_{size}: steady speed, side by side")
    run = measure_throughput(models, cfg.img_size, cfg.batch, cfg.timing, cfg.device, cfg.dtype)
    section = Section(
        "compile",
        "torch.compile: whole model against regional (per block)",
        f"vit5_{size}, batch {cfg.batch} at {cfg.img_size}, {cfg.device} {cfg.dtype}, backend "
        f"{cfg.compile_backend!r}: eager, torch.compile(model) (model.compile=true) and vit5.compile_blocks "
        "(model.compile=regional). First calls with the compile caches off; then steady speed side by side.",
    )
    rows = []
    for way in COMPILE_WAYS:
        first = cold[way]
        cells: list[object] = [
            way,
            f"{first['first_forward_s']:.2f}",
            f"{first['first_train_step_s']:.2f}",
            int(first["graphs"]),
        ]
        for mode in MODES:
            rate = run.samples[mode][way].rate(cfg.batch)
            ratio = speedup(run.samples[mode][way], run.samples[mode]["eager"])
            cells += [
                f"{rate.median:.1f} ({rate.q1:.1f}-{rate.q3:.1f})",
                f"{ratio.median:.2f}x ({ratio.q1:.2f}-{ratio.q3:.2f})",
            ]
        rows.append(tuple(cells))
    columns = (
        "way",
        "first forward s",
        "first train step s",
        "graphs compiled",
        "forward img/s (IQR)",
        "x eager",
        "train img/s (IQR)",
        "x eager",
    )
    section.tables.append(Table(f"Cold start and steady speed (vit5_{size})", columns, tuple(rows)))
    section.notes.append(
        "Largest logit difference from eager: "
        + ", ".join(f"{way} {diff:.1e}" for way, diff in max_diff.items())
        + ". Graphs compiled: dynamo graphs (forward and training step) built during the first calls; "
        "regional compilation builds one block's graphs and reuses them for every block."
    )
    if cfg.compile_backend != "inductor":
        section.notes.append(
            f"Backend {cfg.compile_backend!r} generates no code: these rows exercise the "
            "paths, they do not measure fusion or compile time."
        )
    section.data = {
        "cold_start": cold,
        "max_abs_diff": max_diff,
        "backend": cfg.compile_backend,
        "run": run.to_dict(),
    }
    return section


# ------------------------------------------------------------------------------------------ export
def _session(path, threads: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_export(ctx: BenchContext) -> Section:
    cfg = ctx.cfg
    size, img = cfg.size_for_targets, cfg.img_size
    name = f"vit5_{size}"
    section = Section(
        "export",
        "ONNX Runtime against eager torch (CPU)",
        f"Forward images/s of {name} at {img}x{img}, batch {cfg.batch}, fp32 on the CPU: the eager torch "
        "model and its ONNX export run by onnxruntime, timed side by side; 'x torch' is the paired speed-up "
        "over eager torch (> 1: faster).",
    )
    model = vit5.create_model(name, img_size=img, **({"depth": cfg.depth} if cfg.depth else {})).eval()
    ctx.log(f"exporting {name} @ {img} to ONNX (and checking it with onnxruntime)")
    path = ctx.out_dir / "export" / f"{name}_{img}.onnx"
    report = vit5.export_onnx(model, path, size=(img, img), batch=cfg.batch)
    threads = torch.get_num_threads()
    session = _session(path, threads)
    images = torch.randn(cfg.batch, 3, img, img)
    feed = {session.get_inputs()[0].name: images.numpy()}

    def torch_forward() -> None:
        with torch.no_grad():
            model(images)

    ctx.log(f"timing torch eager and onnxruntime ({cfg.timing.rounds} rounds, {threads} threads)")
    samples = measure(
        {"torch eager": torch_forward, "onnxruntime": lambda: session.run(None, feed)}, cfg.timing
    )
    rows = []
    for contender, s in samples.items():
        rate = s.rate(cfg.batch)
        ratio = speedup(s, samples["torch eager"]).median
        rows.append((contender, f"{rate.median:.1f} ({rate.q1:.1f}-{rate.q3:.1f})", f"{ratio:.2f}x"))
    columns = ("runtime", "images/s (IQR)", "x torch")
    section.tables.append(
        Table(f"{name} @ {img}, batch {cfg.batch}, CPU fp32, {threads} threads", columns, tuple(rows))
    )
    section.notes.append(
        f"Export: {report.seconds:.0f} s, {sum(f.stat().st_size for f in report.files) / 2**20:.1f} MiB; "
        "onnxruntime vs torch max "
        f"|difference| {report.max_abs_diff:.1e}."
    )
    if cfg.device != "cpu" or cfg.dtype != "fp32":
        section.notes.append(
            f"Measured on the CPU in fp32 whatever the run's device ({cfg.device}) and dtype ({cfg.dtype})."
        )
    section.data = {
        "model": name,
        "img_size": img,
        "batch": cfg.batch,
        "threads": threads,
        "max_abs_diff": report.max_abs_diff,
        "export_seconds": report.seconds,
        "samples": {k: s.to_dict() for k, s in samples.items()},
    }
    return section
