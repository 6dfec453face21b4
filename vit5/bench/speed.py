"""The model sections, every ratio paired per round: ``speed`` (vit5 eager and regionally compiled against
timm's ``Eva`` built as ViT-5, timm's plain ViT and the official code's way, at equal width, depth, heads and
GELU MLP), ``memory`` (eager attention's ``[B, heads, n, n]`` scores against SDPA's tiled softmax, Dao et al.,
arXiv 2205.14135), ``compile`` and ``export``; :func:`measure_throughput` also times the ablations."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from functools import partial

import timm
import torch
import torch._functorch.config
import torch._inductor.config
import torch.nn.functional as F
from timm.layers import RmsNorm
from timm.models.eva import Eva
from torch import nn

import vit5
from vit5.bench.measure import BenchContext, Samples, TimingConfig, measure, measure_memory, speedup
from vit5.bench.report import Section, Table, Target
from vit5.layers import eager_attention
from vit5.model.footprint import attention_bytes
from vit5.model.presets import SIZES
from vit5.model.vit import unwrap
from vit5.reference import OfficialViT5
from vit5.runtime import format_bytes


def forward_step(model: nn.Module, images: torch.Tensor, amp=nullcontext) -> Callable:
    model.eval()

    def step() -> None:
        with torch.no_grad(), amp():
            model(images)

    return step


def train_step(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, amp=nullcontext
) -> Callable:
    """One training step: forward, cross-entropy, backward, AdamW."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.05, foreach=True)

    def step() -> None:
        with amp():
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def measure_throughput(
    models: dict[str, nn.Module],
    img_size: int,
    batch: int,
    timing: TimingConfig,
    device="cpu",
    dtype="fp32",
) -> dict[str, dict[str, Samples]]:
    """Seconds per batch, ``{"forward": {model: samples}, "train": {...}}``, of every model on one seeded
    random batch, side by side."""
    classes = min(getattr(unwrap(m), "num_classes", 1000) for m in models.values())
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, img_size, img_size, generator=generator).to(device)
    labels = torch.randint(0, classes, (batch,), generator=generator).to(device)
    amp = partial(
        torch.autocast, torch.device(device).type, torch.bfloat16, enabled=dtype == "bf16"
    )
    models = {name: m.to(device) for name, m in models.items()}
    forward = measure({n: forward_step(m, images, amp) for n, m in models.items()}, timing, device)
    train = measure(
        {n: train_step(m, images, labels, amp) for n, m in models.items()}, timing, device
    )
    return {"forward": forward, "train": train}


def throughput_columns(reference: str | tuple[str, ...]) -> tuple[str, ...]:
    """The names of the :func:`throughput_cells`: per mode, images/s, then the speed-up over each
    reference."""
    references = (reference,) if isinstance(reference, str) else reference
    columns = []
    for mode in ("forward", "train"):
        columns.append(f"{mode} img/s (IQR)")
        columns += [f"x {name} (IQR)" for name in references]
    return tuple(columns)


def throughput_cells(
    run: dict[str, dict[str, Samples]],
    name: str,
    reference: str | tuple[str, ...],
    batch: int,
) -> list[str]:
    """Per mode of :func:`measure_throughput`: images/s (IQR) and the paired speed-up over each
    ``reference`` (a name or several), so forward and training-step ratios sit side by side."""
    references = (reference,) if isinstance(reference, str) else reference
    cells = []
    for samples in run.values():
        cells.append(samples[name].rate(batch).text("{:.1f}") if name in samples else "-")
        for ref in references:
            paired = name in samples and ref in samples
            cells.append(speedup(samples[name], samples[ref]).text() if paired else "-")
    return cells


def build(
    name: str, size: str, img: int, depth: int | None = None, backend: str = "inductor"
) -> nn.Module:
    """Contender ``name`` of :data:`CONTENDERS` at ``size`` (``depth`` blocks when given), seeded so that
    every one starts from the same draw. ``timm_eva``: timm's ``Eva`` as close to ViT-5 as its options
    allow: 2D RoPE (theta 1e4, interleaved pairs), 4 registers (before the patches, without RoPE), RMSNorm,
    QK-norm, LayerScale 1e-4, bias-free qkv, APE; ``vit5_regional``: compiled with ``backend``."""
    torch.manual_seed(0)
    dims = {**SIZES[size], **({"depth": depth} if depth else {})}
    if name == "timm_eva":
        rope = dict(
            no_embed_class=True, use_rot_pos_emb=True, rope_temperature=10000.0
        )  # APE, then 2D RoPE
        blocks = dict(
            qkv_bias=False, qk_norm=True, norm_layer=partial(RmsNorm, eps=1e-6), init_values=1e-4
        )
        return Eva(img_size=img, global_pool="token", num_reg_tokens=4, **rope, **blocks, **dims)
    if name == "timm_vit":
        return timm.create_model(f"vit_{size}_patch16_224", img_size=img, **dims)
    if name == "reference":
        return OfficialViT5(img_size=img, **dims)
    model = vit5.create_model(f"vit5_{size}", img_size=img, **dims)
    return vit5.compile_blocks(model, backend=backend) if name == "vit5_regional" else model


CONTENDERS = ("vit5", "vit5_regional", "timm_eva", "timm_vit", "reference")
EAGER = tuple(name for name in CONTENDERS if name != "vit5_regional")
TIMM = ("timm_vit", "timm_eva")  # the references of every speed-up column


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
    runs = [(size, cfg.img_size, cfg.batch, CONTENDERS, "base") for size in cfg.sizes]
    runs.append((target, cfg.hires_img_size, cfg.hires_batch, EAGER, "hires"))
    rows = []
    data = {}
    targets = []
    for size, img, batch, names, resolution in runs:
        ctx.log(f"throughput {size} @ {img}: {', '.join(names)} (batch {batch})")
        models = {name: build(name, size, img, cfg.depth, cfg.compile_backend) for name in names}
        run = measure_throughput(models, img, batch, cfg.timing, cfg.device, cfg.dtype)
        data[f"{size}@{img}"] = run
        for name, model in models.items():
            params = f"{sum(p.numel() for p in model.parameters()):,}"
            cells = throughput_cells(run, name, TIMM, batch)
            rows.append((name, f"{size}@{img}", params, *cells))
        for res, mode, fast, slow, threshold in TARGETS:
            s = run[mode]
            if size == target and res == resolution and fast in s and slow in s:
                label = (
                    f"{fast.replace('vit5', f'vit5_{size}', 1)} {mode} speed-up over {slow} @{img}"
                )
                targets.append(Target(label, speedup(s[fast], s[slow]).median, threshold))
    columns = ("model", "size@res", "params", *throughput_columns(TIMM))
    return Section(
        "speed",
        "Throughput against timm and the official code's way",
        "Images/s of the forward and of a training step (forward, loss, backward, AdamW), every "
        "contender timed side by side; 'x timm_vit' and 'x timm_eva' are the paired speed-ups over "
        "timm's plain ViT and timm's Eva built as ViT-5 of the same size (> 1: faster). "
        f"{cfg.device}, {cfg.dtype}; vit5_regional compiled with {cfg.compile_backend!r} in the "
        f"untimed warm-up; at {cfg.hires_img_size} px the eager ones only.",
        tables=[Table("Throughput", columns, tuple(rows))],
        targets=targets,
        data={"seconds": data},
    )


def run_memory(
    ctx: BenchContext, target_tokens: int = 8192, max_sdpa_fraction: float = 0.25
) -> Section:
    """One attention call per sequence length: peak memory of SDPA and eager, and their outputs' largest
    difference (both are exact). Eager lengths past ``attn_eager_max_bytes`` are skipped, not estimated."""
    cfg = ctx.cfg
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
    peaks = {}  # peak bytes by length
    diffs = {}  # max |sdpa - eager| by length
    rows = []
    for n in cfg.attn_seq_lens:
        eager = attention_bytes(1, cfg.attn_heads, n, dtype.itemsize) <= cfg.attn_eager_max_bytes
        ctx.log(f"attention memory at n={n}" + ("" if eager else " (sdpa only)"))
        g = torch.Generator().manual_seed(n)
        qkv = torch.randn(3, 1, cfg.attn_heads, n, cfg.attn_head_dim, generator=g).to(
            cfg.device, dtype
        )
        names = ("sdpa", "eager") if eager else ("sdpa",)
        with (
            torch.inference_mode()
        ):  # the outputs stay alive: each reading counts only its own call
            found = {
                name: measure_memory(partial(BACKENDS[name], *qkv), cfg.device) for name in names
            }
        p = peaks[n] = {name: reading.peak for name, (reading, _) in found.items()}
        cells = [format_bytes(p["sdpa"]), "skipped", "-", "-"]
        if eager:
            diffs[n] = (found["sdpa"][1].float() - found["eager"][1].float()).abs().max().item()
            cells[1:] = (
                format_bytes(p["eager"]),
                f"{p['eager'] / p['sdpa']:.1f}x",
                f"{diffs[n]:.1e}",
            )
        rows.append((n, *cells))
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
    if target_tokens in diffs:
        fraction = peaks[target_tokens]["sdpa"] / peaks[target_tokens]["eager"]
        name = f"sdpa peak memory / eager peak at {target_tokens} tokens"
        section.targets.append(Target(name, fraction, max_sdpa_fraction, higher_is_better=False))
    else:
        section.notes.append(
            f"The {target_tokens}-token target was not measured ({cfg.attn_seq_lens})."
        )
    return section


BACKENDS = {
    "sdpa": F.scaled_dot_product_attention,
    "eager": lambda q, k, v: eager_attention(q, k, v)[0],
}


def run_compile(ctx: BenchContext) -> Section:
    """Eager, ``torch.compile(model)`` and ``vit5.compile_blocks``: the first calls (compile caches
    off, so a rerun is as cold as the first run), then the steady speed side by side."""
    cfg = ctx.cfg
    size = cfg.compile_size
    backend = cfg.compile_backend
    ways = {
        "eager": lambda model: model,
        "compiled": partial(torch.compile, backend=backend),
        "regional": partial(vit5.compile_blocks, backend=backend),
    }
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        torch._dynamo.reset()
        models = {
            way: wrap(build("vit5", size, cfg.img_size, cfg.depth)) for way, wrap in ways.items()
        }
        ctx.log(
            f"vit5_{size}, {', '.join(ways)} ({backend}): first forward and first training step"
        )
        cold = measure_throughput(
            models, cfg.img_size, cfg.batch, TimingConfig(0, 1), cfg.device, cfg.dtype
        )
    first = {way: [cold[mode][way].median for mode in ("forward", "train")] for way in ways}
    images = torch.randn(cfg.batch, 3, cfg.img_size, cfg.img_size, device=cfg.device)
    with torch.no_grad():
        logits = {way: model.eval()(images) for way, model in models.items()}
    diffs = {
        way: (out - logits["eager"]).abs().max().item()
        for way, out in logits.items()
        if way != "eager"
    }
    ctx.log(f"vit5_{size}: eager, compiled and regional steady speed, side by side")
    run = measure_throughput(models, cfg.img_size, cfg.batch, cfg.timing, cfg.device, cfg.dtype)
    rows = tuple(
        (way, f"{fwd:.2f}", f"{train:.2f}", *throughput_cells(run, way, "eager", cfg.batch))
        for way, (fwd, train) in first.items()
    )
    columns = ("way", "first forward s", "first train step s", *throughput_columns("eager"))
    section = Section(
        "compile",
        "torch.compile: whole model against regional (per block)",
        f"vit5_{size}, batch {cfg.batch} at {cfg.img_size}, {cfg.device} {cfg.dtype}, backend {backend!r}: "
        "eager, torch.compile(model) (model.compile=true) and vit5.compile_blocks (model.compile=regional).",
        tables=[Table(f"Cold start and steady speed (vit5_{size})", columns, rows)],
        notes=[
            "Largest logit difference from eager: "
            + ", ".join(f"{w} {d:.1e}" for w, d in diffs.items())
        ],
        data={"cold_start": first, "max_abs_diff": diffs, "seconds": run},
    )
    if backend != "inductor":
        section.notes.append(
            f"Backend {backend!r} generates no code: the rows exercise the paths only."
        )
    return section


def run_export(ctx: BenchContext) -> Section:
    """onnxruntime against eager torch: CPU fp32 images/s of the same exported model, side by side."""
    import onnxruntime

    cfg = ctx.cfg
    size = cfg.size_for_targets
    img = cfg.img_size
    name = f"vit5_{size}"
    model = build("vit5", size, img, cfg.depth).eval()
    ctx.log(f"exporting {name} @ {img} to ONNX (and checking it with onnxruntime)")
    path = ctx.out_dir / "export" / f"{name}_{img}.onnx"
    report = vit5.export_onnx(model, path, size=(img, img), batch=cfg.batch)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    images = torch.randn(cfg.batch, 3, img, img)
    feed = {session.get_inputs()[0].name: images.numpy()}
    calls = {
        "torch eager": forward_step(model, images),
        "onnxruntime": lambda: session.run(None, feed),
    }
    samples = measure(calls, cfg.timing)
    rows = tuple(
        (k, *throughput_cells({"forward": samples}, k, "torch eager", cfg.batch)) for k in samples
    )
    mib = sum(f.stat().st_size for f in report.files) / 2**20
    return Section(
        "export",
        "ONNX Runtime against eager torch (CPU)",
        f"Forward images/s of {name} at {img}x{img}, batch {cfg.batch}, fp32 on the CPU "
        f"({torch.get_num_threads()} threads), side by side; 'x torch' > 1: faster than eager torch.",
        tables=[Table(f"{name} @ {img}", ("runtime", "images/s (IQR)", "x torch (IQR)"), rows)],
        notes=[
            f"Export {report.seconds:.0f} s, {mib:.1f} MiB; "
            f"onnxruntime vs torch max |difference| {report.max_abs_diff:.1e}."
        ],
        data={
            "samples": {k: list(s.seconds) for k, s in samples.items()},
            "max_abs_diff": report.max_abs_diff,
        },
    )
