"""The ``depth`` section: pre-norm against post-norm at depth (Xiong et al., arXiv 2002.04745) on a narrow
ViT-5 trunk (no LayerScale, registers or RoPE, which would hide the norm's placement) over scikit-learn's
8x8 digits (patch 2): the per-block gradient norm at step 0, and short fixed-lr runs without warmup
(trained by :class:`vit5.train.Trainer`). Seeded, on one CPU thread: deterministic on a machine."""

from __future__ import annotations

import contextlib
import io
import math
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import vit5
from vit5 import plotstyle as S
from vit5.bench.measure import BenchContext, DepthAblationConfig, num_threads
from vit5.bench.report import Section, Table, Target
from vit5.train import Trainer, TrainingDiverged
from vit5.train.config import (
    AugSection,
    CheckpointSection,
    DataSection,
    EmaSection,
    LossSection,
    ModelSection,
    OptimSection,
    RunSection,
    ScheduleSection,
    TrainConfig,
)

DIGITS = dict(img_size=8, patch_size=2, in_chans=1, num_classes=10)
NO_EXTRAS = dict(layer_scale=None, num_registers=0, rope=False, register_rope=False)
PLACEMENTS: dict[str, bool] = {"pre-norm": True, "post-norm": False}
SPIKE_NATS = 0.25  # a loss rise (or gap) that counts as real, well above step-to-step batch noise
FLAT_BAND = (2 / 3, 1.5)  # output/input gradient ratio counted as flat (within a factor 1.5)
GROWING_RATIO = 1.5  # output/input gradient ratio counted as growing toward the output
FIGURES = ("depth_grad_profile.png", "depth_loss.png")
GRAD_COLUMNS = (
    "placement",
    "last/first quarter (blocks 1..)",
    "block 0 / block 1",
    "smallest",
    "largest",
)
RUN_COLUMNS = (
    "placement",
    "lr",
    "first loss",
    "best loss",
    "final loss (last 10)",
    "largest spike (nats)",
)


def digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 1797 8x8 digits, standardised, as ``[N, 1, 8, 8]`` images and labels."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)[:, None]
    return (images - images.mean()) / images.std(), torch.tensor(digits.target)


def build_trunk(cfg: DepthAblationConfig, pre_norm: bool) -> nn.Module:
    torch.manual_seed(0)
    dims = dict(embed_dim=cfg.width, depth=cfg.depth, num_heads=cfg.heads, pre_norm=pre_norm)
    return vit5.create_model("vit5_tiny", **DIGITS, **dims, **NO_EXTRAS)


def layer_grad_norms(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> list[float]:
    """L2 norm of d(loss)/d(parameters) of each block, for one batch."""
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(images), labels).backward()
    norms = [
        math.sqrt(sum(float(p.grad.square().sum()) for p in b.parameters())) for b in model.blocks
    ]
    model.zero_grad(set_to_none=True)
    return norms


def output_input_ratio(norms: list[float], skip_first: int = 1) -> float:
    """Mean gradient norm of the last quarter of the blocks over the first quarter, leaving out the first
    ``skip_first`` blocks (in post-norm block 0 alone normalises the raw patch embedding, so its gradient
    reflects the input's scale, not depth)."""
    body = norms[skip_first:]
    quarter = max(1, len(body) // 4)
    return float(np.mean(body[-quarter:]) / np.mean(body[:quarter]))


def largest_spike(losses: list[float]) -> float:
    """The largest rise of the loss above its lowest value so far (nats)."""
    best = math.inf
    spike = 0.0
    for loss in losses:
        spike = max(spike, loss - best)
        best = min(best, loss)
    return spike


class DigitSamples(TensorDataset):
    """Images and labels in memory, with the ``class_names`` the trainer records."""

    class_names = [str(digit) for digit in range(10)]


SEED = 1  # draws the samples of the fixed-lr runs, and orders them (run.seed)


def fixed_lr_config(out: str, lr: float, batch: int) -> TrainConfig:
    """One epoch of AdamW at a constant ``lr``: no warmup, cosine from ``lr`` to ``lr``, no weight
    decay, no augmentation, no EMA; plain cross-entropy (soft targets without smoothing), fp32."""
    return TrainConfig(
        model=ModelSection(name="vit5_tiny", img_size=8, overrides=dict(patch_size=2, in_chans=1)),
        data=DataSection(dataset="digits", batch_size=batch, num_workers=0),
        aug=AugSection(train="none", repeated_aug=1, ra_selected_round=0, mixup=0.0, cutmix=0.0),
        loss=LossSection(name="soft_ce"),
        optim=OptimSection(name="adamw", lr=lr, weight_decay=0.0),
        schedule=ScheduleSection(epochs=1, warmup_epochs=0, min_lr=lr, interval="update"),
        ema=EmaSection(enabled=False),
        checkpoint=CheckpointSection(save_best=False),
        run=RunSection(output_dir=out, seed=SEED, mixed_precision="fp32", cpu=True, progress=False),
    )


def train_fixed_lr(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, steps: int, lr: float, batch: int
) -> list[float]:
    """``steps`` AdamW steps at a constant ``lr`` (no warmup) by :class:`vit5.train.Trainer`, one
    epoch over ``steps * batch`` samples drawn with replacement (seeded); the losses come from its
    ``on_update`` hook. A run whose loss turns non-finite has diverged: its remaining steps count as
    ``inf``. The run folder is scratch (a temporary folder), its printout muted."""
    generator = torch.Generator().manual_seed(SEED)
    drawn = torch.randint(0, len(images), (steps * batch,), generator=generator)
    train_set = DigitSamples(images[drawn], labels[drawn])
    losses: list[float] = []
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
        trainer = Trainer(
            fixed_lr_config(out, lr, batch),
            train_set=train_set,
            val_set=DigitSamples(images, labels),
            model=model,
            on_update=losses.append,
        )
        with contextlib.suppress(TrainingDiverged):
            trainer.fit()
    return losses + [math.inf] * (steps - len(losses))


def line_chart(
    path: Path, x, series: dict, labels: tuple[str, str, str], logy: bool = False
) -> None:
    """One line per series over ``x`` (a PNG); ``None`` values (not measured) are left out. ``labels``:
    title, x label, y label."""
    fig = S.figure(5.5, 3.6)
    ax = fig.subplots()
    for index, (name, ys) in enumerate(series.items()):
        points = [(a, b) for a, b in zip(x, ys) if b is not None]
        if points:
            xs, values = zip(*points)
            ax.plot(xs, values, marker="o", markersize=3, label=name, color=S.model_colour(index))
    ax.set_yscale("log" if logy else "linear")
    title, xlabel, ylabel = labels
    S.style_axes(ax, title, xlabel, ylabel)
    S.legend(ax)
    S.save_figure(fig, path)


def run(ctx: BenchContext) -> Section:
    cfg = ctx.cfg.depth_ablation
    images, labels = digits_tensors()
    fixed = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))[
        : cfg.grad_batch
    ]
    profiles: dict[str, list[float]] = {}
    curves: dict[tuple[str, float], list[float]] = {}
    with num_threads(1):
        for name, pre_norm in PLACEMENTS.items():
            profiles[name] = layer_grad_norms(
                build_trunk(cfg, pre_norm), images[fixed], labels[fixed]
            )
            for lr in cfg.lrs:
                ctx.log(f"depth {cfg.depth}: {name}, {cfg.steps} steps at lr {lr:g}")
                model = build_trunk(cfg, pre_norm)
                curves[(name, lr)] = train_fixed_lr(model, images, labels, cfg.steps, lr, cfg.batch)
    ratios = {name: output_input_ratio(p) for name, p in profiles.items()}
    final = {key: float(np.mean(c[-10:])) for key, c in curves.items()}
    grads = tuple(
        (name, f"{ratios[name]:.2f}", f"{p[0] / p[1]:.1f}", f"{min(p):.3g}", f"{max(p):.3g}")
        for name, p in profiles.items()
    )
    runs = tuple(
        (
            name,
            f"{lr:g}",
            f"{c[0]:.3f}",
            f"{min(c):.3f}",
            f"{final[name, lr]:.3f}",
            f"{largest_spike(c):.3f}",
        )
        for (name, lr), c in curves.items()
    )
    top = max(cfg.lrs)
    flat = "pre-norm gradient profile flat: last/first-quarter ratio"
    grows = "post-norm gradient grows toward the output: last/first-quarter ratio"
    spikes = f"post-norm spikes at lr {top:g}: largest rise above its best loss"
    worse = f"post-norm ends clearly worse than pre-norm at lr {top:g}: final-loss gap"
    targets = [  # name, measured, threshold, higher is better, unit
        (f"{flat}, lower bound", ratios["pre-norm"], FLAT_BAND[0], True, "x"),
        (f"{flat}, upper bound", ratios["pre-norm"], FLAT_BAND[1], False, "x"),
        (grows, ratios["post-norm"], GROWING_RATIO, True, "x"),
        (spikes, largest_spike(curves["post-norm", top]), SPIKE_NATS, True, "nats"),
        (worse, final["post-norm", top] - final["pre-norm", top], SPIKE_NATS, True, "nats"),
    ]
    finite = {
        f"{n} lr {lr:g}": [v if math.isfinite(v) else None for v in c]
        for (n, lr), c in curves.items()
    }
    labels = (
        f"Gradient norm per block at step 0, depth {cfg.depth}",
        "block (input -> output)",
        "||grad||",
    )
    line_chart(ctx.out_dir / "figures" / FIGURES[0], range(cfg.depth), profiles, labels, logy=True)
    labels = ("Training loss at fixed lr, no warmup", "step", "cross-entropy")
    line_chart(ctx.out_dir / "figures" / FIGURES[1], range(1, cfg.steps + 1), finite, labels)
    return Section(
        "depth",
        f"Pre-norm against post-norm at depth {cfg.depth}",
        f"Width {cfg.width}, {cfg.heads} heads, no LayerScale/registers/RoPE, 8x8 digits. Gradient norm "
        f"of each block's parameters at step 0 (batch {cfg.grad_batch}); then {cfg.steps} AdamW steps at "
        f"each fixed lr without warmup (batch {cfg.batch}).",
        tables=[
            Table("Gradient profile at step 0", GRAD_COLUMNS, grads),
            Table("Fixed-lr runs", RUN_COLUMNS, runs),
        ],
        targets=[Target(*t) for t in targets],
        figures=[f"figures/{file}" for file in FIGURES],
        notes=[
            "Pre-norm gradients falling toward the output match NormFormer's measurement (Shleifer et al., "
            "2021, Fig. 2). If post-norm trains fine here, the model is too shallow or the LR too low to "
            "test the claim; at this width the model may also be too narrow (Xiong et al. analyse d = 512)."
        ],
        data=dict(
            grad_norms=profiles,
            losses={f"{n}@{lr:g}": c for (n, lr), c in curves.items()},
            config=cfg,
        ),
    )
