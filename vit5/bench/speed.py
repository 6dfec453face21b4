"""The whole-model sections: ``speed``, ``compile`` and ``export``.

``speed`` times, at equal width, depth, heads and GELU MLP: ``vit5`` (eager), ``vit5_regional``
(``vit5.compile_blocks``); ``timm_eva`` (timm's ``Eva``
set up as close to ViT-5 as it allows), ``timm_vit`` (plain ``vit_{size}_patch16_224``, the yardstick of
"free") and ``reference`` (:class:`vit5.reference.OfficialViT5`, the official code's way). Every ratio is
paired per round (:mod:`vit5.bench.measure`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import timm
import torch
import torch._functorch.config
import torch._inductor.config
from timm.layers import RmsNorm
from timm.models.eva import Eva
from torch import nn

import vit5
from vit5.bench.config import BenchContext
from vit5.bench.measure import (
    TimingConfig,
    autocast_context,
    forward_step,
    measure,
    measure_throughput,
    random_batch,
    speedup,
    throughput_cells,
    train_step,
)
from vit5.bench.report import Section, Table, Target
from vit5.errors import InputError
from vit5.model.presets import SIZES
from vit5.reference import OfficialViT5


def _dims(size: str, depth: int | None) -> dict[str, int]:
    if size not in SIZES:
        raise InputError(f"unknown size {size!r}: use one of {', '.join(SIZES)}")
    return {**SIZES[size], **({"depth": depth} if depth else {})}


def build_timm_eva(size: str, img_size: int, depth: int | None = None) -> nn.Module:
    """timm ``Eva`` as close to ViT-5 as its options allow: 2D RoPE (theta 1e4, interleaved pairs), 4
    registers (before the patches, without RoPE), RMSNorm, QK-norm, LayerScale 1e-4, bias-free qkv, APE."""
    return Eva(
        img_size=img_size,
        global_pool="token",
        qkv_bias=False,
        qk_norm=True,
        norm_layer=partial(RmsNorm, eps=1e-6),
        init_values=1e-4,
        num_reg_tokens=4,
        no_embed_class=True,
        use_rot_pos_emb=True,
        rope_temperature=10000.0,
        **_dims(size, depth),
    )


def build_vit5(size: str, img_size: int, depth: int | None = None, **overrides) -> nn.Module:
    return vit5.create_model(f"vit5_{size}", img_size=img_size, **{**_dims(size, depth), **overrides})


BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "vit5": build_vit5,
    "vit5_regional": lambda *a, backend="inductor": vit5.compile_blocks(build_vit5(*a), backend=backend),
    "timm_eva": build_timm_eva,
    "timm_vit": lambda size, img, depth=None: timm.create_model(
        f"vit_{size}_patch16_224", img_size=img, **({"depth": depth} if depth else {})
    ),
    "reference": lambda size, img, depth=None: OfficialViT5(img_size=img, **_dims(size, depth)),
}
EAGER: tuple[str, ...] = ("vit5", "timm_eva", "timm_vit", "reference")


# (resolution, mode, fast, slow, threshold): ``fast`` at least ``threshold`` times as fast as ``slow``
TARGETS: tuple[tuple[str, str, str, str, float], ...] = (
    ("base", "forward", "vit5", "timm_eva", 1.05),
    ("base", "forward", "vit5", "timm_vit", 0.97),
    ("base", "train", "vit5", "timm_eva", 1.03),
    ("base", "train", "vit5_regional", "timm_vit", 1.0),
    ("base", "forward", "vit5", "reference", 1.3),
    ("base", "train", "vit5", "reference", 1.3),
    ("hires", "forward", "vit5", "reference", 1.8),
    ("hires", "train", "vit5", "reference", 1.8),
)


def run_speed(ctx: BenchContext) -> Section:
    cfg = ctx.cfg
    target = cfg.size_for_targets
    section = Section(
        "speed",
        "Throughput against timm and the official code's way",
        "Images/s of the forward and of a training step (forward, loss, backward, AdamW), every "
        "contender timed side by side; 'x timm_vit' is the paired speed-up over timm's plain ViT of "
        f"the same size (> 1: faster). {cfg.device}, {cfg.dtype}; vit5_regional compiled with "
        f"{cfg.compile_backend!r} in the untimed warm-up; at {cfg.hires_img_size} px the eager ones only.",
    )
    runs = [(size, cfg.img_size, cfg.batch, tuple(BUILDERS), "base") for size in cfg.sizes]
    runs.append((target, cfg.hires_img_size, cfg.hires_batch, EAGER, "hires"))
    rows, data = [], {}
    for size, img, batch, names, resolution in runs:
        ctx.log(f"throughput {size} @ {img}: {', '.join(names)} (batch {batch})")
        models = {}
        for name in names:
            torch.manual_seed(0)
            extra = {"backend": cfg.compile_backend} if name == "vit5_regional" else {}
            models[name] = BUILDERS[name](size, img, cfg.depth, **extra).eval()
        run = measure_throughput(models, img, batch, cfg.timing, cfg.device, cfg.dtype)
        data[f"{size}@{img}"] = run
        for name, model in models.items():
            params = f"{sum(p.numel() for p in model.parameters()):,}"
            rows.append((name, f"{size}@{img}", params, *throughput_cells(run, name, "timm_vit", batch)))
        for res, mode, fast, slow, threshold in TARGETS:
            s = run[mode]
            if size == target and res == resolution and fast in s and slow in s:
                label = f"{fast.replace('vit5', f'vit5_{size}', 1)} {mode} speed-up over {slow} @{img}"
                section.targets.append(Target(label, speedup(s[fast], s[slow]).median, threshold))
    columns = ("model", "size@res", "params", "forward img/s (IQR)", "x timm_vit (IQR)", "train img/s (IQR)")
    section.tables.append(Table("Throughput", (*columns, "x timm_vit (IQR)"), tuple(rows)))
    section.data = {"seconds": data}
    return section


COMPILE_WAYS: dict[str, Callable[[nn.Module, str], nn.Module]] = {
    "eager": lambda model, backend: model,
    "compiled": lambda model, backend: torch.compile(model, backend=backend),
    "regional": lambda model, backend: vit5.compile_blocks(model, backend=backend),
}


def run_compile(ctx: BenchContext) -> Section:
    """Eager, ``torch.compile(model)`` and ``vit5.compile_blocks``: the first calls (compile caches
    off, so a rerun is as cold as the first run), then the steady speed side by side."""
    cfg = ctx.cfg
    size, backend = cfg.compile_size, cfg.compile_backend
    images, labels = random_batch(cfg.batch, cfg.img_size, cfg.device)
    amp = autocast_context(cfg.device, cfg.dtype)
    models, first = {}, {}
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        torch._dynamo.reset()
        for way, wrap in COMPILE_WAYS.items():
            torch.manual_seed(0)
            models[way] = wrap(build_vit5(size, cfg.img_size, cfg.depth), backend).to(cfg.device)
            ctx.log(f"vit5_{size}, {way} ({backend}): first forward and first training step")
            steps = (forward_step(models[way], images, amp), train_step(models[way], images, labels, amp))
            first[way] = [measure({way: s}, TimingConfig(0, 1), cfg.device)[way].median for s in steps]
    with torch.no_grad():
        logits = {way: model.eval()(images) for way, model in models.items()}
    diffs = {way: (out - logits["eager"]).abs().max().item() for way, out in logits.items() if way != "eager"}
    ctx.log(f"vit5_{size}: eager, compiled and regional steady speed, side by side")
    run = measure_throughput(models, cfg.img_size, cfg.batch, cfg.timing, cfg.device, cfg.dtype)
    rows = tuple(
        (way, f"{fwd:.2f}", f"{train:.2f}", *throughput_cells(run, way, "eager", cfg.batch))
        for way, (fwd, train) in first.items()
    )
    columns = ("way", "first forward s", "first train step s", "forward img/s (IQR)", "x eager")
    section = Section(
        "compile",
        "torch.compile: whole model against regional (per block)",
        f"vit5_{size}, batch {cfg.batch} at {cfg.img_size}, {cfg.device} {cfg.dtype}, backend {backend!r}: "
        "eager, torch.compile(model) (model.compile=true) and vit5.compile_blocks (model.compile=regional).",
        tables=[
            Table(
                f"Cold start and steady speed (vit5_{size})", (*columns, "train img/s (IQR)", "x eager"), rows
            )
        ],
        notes=["Largest logit difference from eager: " + ", ".join(f"{w} {d:.1e}" for w, d in diffs.items())],
    )
    if backend != "inductor":
        section.notes.append(f"Backend {backend!r} generates no code: the rows exercise the paths only.")
    section.data = {"cold_start": first, "max_abs_diff": diffs, "seconds": run}
    return section


def run_export(ctx: BenchContext) -> Section:
    """onnxruntime against eager torch: CPU fp32 images/s of the same exported model, side by side."""
    import onnxruntime

    cfg = ctx.cfg
    size, img, name = cfg.size_for_targets, cfg.img_size, f"vit5_{cfg.size_for_targets}"
    model = build_vit5(size, img, cfg.depth).eval()
    ctx.log(f"exporting {name} @ {img} to ONNX (and checking it with onnxruntime)")
    path = ctx.out_dir / "export" / f"{name}_{img}.onnx"
    report = vit5.export_onnx(model, path, size=(img, img), batch=cfg.batch)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = torch.get_num_threads(), 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    images = torch.randn(cfg.batch, 3, img, img)
    feed = {session.get_inputs()[0].name: images.numpy()}
    samples = measure(
        {"torch eager": forward_step(model, images), "onnxruntime": lambda: session.run(None, feed)},
        cfg.timing,
    )
    rows = tuple(
        (k, s.rate(cfg.batch).text("{:.1f}"), speedup(s, samples["torch eager"]).text())
        for k, s in samples.items()
    )
    return Section(
        "export",
        "ONNX Runtime against eager torch (CPU)",
        f"Forward images/s of {name} at {img}x{img}, batch {cfg.batch}, fp32 on the CPU "
        f"({torch.get_num_threads()} threads), side by side; 'x torch' > 1: faster than eager torch.",
        tables=[Table(f"{name} @ {img}", ("runtime", "images/s (IQR)", "x torch (IQR)"), rows)],
        notes=[
            f"Export {report.seconds:.0f} s, {sum(f.stat().st_size for f in report.files) / 2**20:.1f} MiB; "
            f"onnxruntime vs torch max |difference| {report.max_abs_diff:.1e}."
        ],
        data={
            "samples": {k: list(s.seconds) for k, s in samples.items()},
            "max_abs_diff": report.max_abs_diff,
        },
    )
