"""Section 5: what ``torch.compile`` buys on the forward.

The same ViT-5 weights run eagerly and compiled (default mode, ``compile_backend``), side by side
after the compiled one has been warmed up. The first compiled call's wall time (tracing plus code
generation) is reported separately: it is paid once per shape.
"""

from __future__ import annotations

import time

import torch

from .context import BenchContext
from .models import ModelSpec, build_vit5
from .results import Section, Table
from .throughput import autocast_context, forward_step
from .timing import device_sync, measure, speedup


def run(ctx: BenchContext) -> Section:
    cfg = ctx.cfg
    size = cfg.compile_size
    spec = ModelSpec(size, cfg.img_size, cfg.depth)
    model = build_vit5(spec).eval().to(cfg.device)
    compiled = torch.compile(model, backend=cfg.compile_backend)
    images = torch.randn(cfg.batch, 3, cfg.img_size, cfg.img_size, generator=torch.Generator().manual_seed(0))
    images = images.to(cfg.device)
    amp = autocast_context(cfg.device, cfg.dtype)
    sync = device_sync(cfg.device)
    steps = {"eager": forward_step(model, images, amp), "compiled": forward_step(compiled, images, amp)}
    ctx.log(f"torch.compile ({cfg.compile_backend}) of vit5_{size}: compiling")
    start = time.perf_counter()
    steps["compiled"]()
    sync()
    compile_s = time.perf_counter() - start
    with torch.inference_mode():
        max_diff = (compiled(images) - model(images)).abs().max().item()
    samples = measure(steps, cfg.timing, sync)
    ratio = speedup(samples["compiled"], samples["eager"])
    section = Section(
        "compile",
        "torch.compile speed-up",
        f"vit5_{size} forward, batch {cfg.batch} at {cfg.img_size}, eager vs torch.compile(backend="
        f"{cfg.compile_backend!r}), {cfg.device} {cfg.dtype}.",
    )
    rows = [
        ("eager", f"{cfg.batch / samples['eager'].median:.1f}", "1.00x", "-"),
        ("compiled", f"{cfg.batch / samples['compiled'].median:.1f}",
         f"{ratio.median:.2f}x ({ratio.q1:.2f}-{ratio.q3:.2f})", f"{compile_s:.1f}"),
    ]
    columns = ("mode", "images/s", "speed-up (IQR)", "first call s")
    section.tables.append(Table("torch.compile", columns, tuple(rows)))
    section.notes.append(f"Largest logit difference compiled vs eager: {max_diff:.1e}.")
    section.data = {"speedup": ratio.to_dict(), "compile_seconds": compile_s, "max_abs_diff": max_diff,
                    "samples": {k: s.to_dict() for k, s in samples.items()}, "backend": cfg.compile_backend}
    return section
