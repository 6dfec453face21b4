"""Section 5: what ``torch.compile`` buys, whole model against regional (per block) compilation.

The same ViT-5 weights run three ways: eagerly, compiled as a whole (``torch.compile(model)``,
``model.compile=true``) and compiled per block (:func:`vit5.compile_blocks`,
``model.compile=regional``), all with ``compile_backend``. First the cold start: the wall time of
each one's first forward and first training step, with the compile caches off (what a new process
pays once per shape), and the number of graphs compiled. Then the steady speed of the three, side
by side, forward and training step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack

import torch
import torch._functorch.config
import torch._inductor.config
from torch._dynamo.utils import counters

import vit5
from vit5.bench.context import BenchContext
from vit5.bench.models import ModelSpec, build_vit5
from vit5.bench.results import Section, Table
from vit5.bench.throughput import (
    MODES,
    autocast_context,
    forward_step,
    measure_throughput,
    random_batch,
    train_step,
)
from vit5.bench.timing import device_sync, speedup

WAYS: tuple[str, ...] = ("eager", "compiled", "regional")


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


def run(ctx: BenchContext) -> Section:
    cfg = ctx.cfg
    size = cfg.compile_size
    spec = ModelSpec(size, cfg.img_size, cfg.depth, cfg.compile_backend)
    images, labels = random_batch(cfg.batch, cfg.img_size, cfg.device)
    amp = autocast_context(cfg.device, cfg.dtype)
    sync = device_sync(cfg.device)
    models = {way: _build(way, spec).to(cfg.device) for way in WAYS}
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
        max_diff = {way: (models[way](images) - reference).abs().max().item() for way in WAYS[1:]}
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
    for way in WAYS:
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
