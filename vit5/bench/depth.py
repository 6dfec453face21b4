"""The ``depth`` section: pre-norm against post-norm at depth (Xiong et al., arXiv 2002.04745) on a narrow
ViT-5 trunk (no LayerScale, registers or RoPE, which would hide the norm's placement) over scikit-learn's
8x8 digits (patch 2): the per-block gradient norm at step 0, and short fixed-lr runs without warmup
(the training step of :mod:`vit5.train.loop`). Seeded, on one CPU thread: deterministic on a machine."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import vit5
from vit5.bench.config import BenchContext, DepthAblationConfig
from vit5.bench.measure import num_threads
from vit5.bench.report import Section, Table, Target, line_chart
from vit5.train.checkpointing import TrainState
from vit5.train.loop import NonFiniteLoss, StepParts, train_steps

NO_EXTRAS = dict(layer_scale=None, num_registers=0, rope=False, register_rope=False)
PLACEMENTS: dict[str, bool] = {"pre-norm": True, "post-norm": False}
SPIKE_NATS = 0.25  # a loss rise (or gap) that counts as real, well above step-to-step batch noise
FLAT_BAND = (2 / 3, 1.5)  # output/input gradient ratio counted as flat (within a factor 1.5)
GROWING_RATIO = 1.5  # output/input gradient ratio counted as growing toward the output


def digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 1797 8x8 digits, standardised, as ``[N, 1, 8, 8]`` images and labels."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)[:, None]
    return (images - images.mean()) / images.std(), torch.tensor(digits.target)


def build_trunk(cfg: DepthAblationConfig, pre_norm: bool) -> nn.Module:
    torch.manual_seed(0)
    dims = dict(embed_dim=cfg.width, depth=cfg.depth, num_heads=cfg.heads, pre_norm=pre_norm)
    return vit5.create_model(
        "vit5_tiny", img_size=8, patch_size=2, in_chans=1, num_classes=10, **dims, **NO_EXTRAS
    )


def layer_grad_norms(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> list[float]:
    """L2 norm of d(loss)/d(parameters) of each block, for one batch."""
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(images), labels).backward()
    norms = [math.sqrt(sum(float(p.grad.square().sum()) for p in b.parameters())) for b in model.blocks]
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
    best, spike = math.inf, 0.0
    for loss in losses:
        spike, best = max(spike, loss - best), min(best, loss)
    return spike


def train_fixed_lr(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, steps: int, lr: float, batch: int
) -> list[float]:
    """``steps`` AdamW steps at a constant ``lr`` (no warmup) on seeded random batches. A run whose loss
    turns non-finite has diverged: its remaining steps count as ``inf``."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(1)
    idx = (torch.randint(0, len(images), (batch,), generator=generator) for _ in range(steps))
    losses: list[float] = []
    try:
        parts = StepParts(model=model, optimizer=optimizer, criterion=F.cross_entropy)
        train_steps(
            parts,
            ((images[i], labels[i]) for i in idx),
            TrainState(),
            on_update=lambda x, _: losses.append(x),
        )
    except NonFiniteLoss:
        pass
    return losses + [math.inf] * (steps - len(losses))


def _final(losses: list[float]) -> float:
    return float(np.mean(losses[-10:]))


def run(ctx: BenchContext) -> Section:
    cfg = ctx.cfg.depth_ablation
    images, labels = digits_tensors()
    fixed = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))[: cfg.grad_batch]
    profiles: dict[str, list[float]] = {}
    curves: dict[tuple[str, float], list[float]] = {}
    with num_threads(1):
        for name, pre_norm in PLACEMENTS.items():
            profiles[name] = layer_grad_norms(build_trunk(cfg, pre_norm), images[fixed], labels[fixed])
            for lr in cfg.lrs:
                ctx.log(f"depth {cfg.depth}: {name}, {cfg.steps} steps at lr {lr:g}")
                model = build_trunk(cfg, pre_norm)
                curves[(name, lr)] = train_fixed_lr(model, images, labels, cfg.steps, lr, cfg.batch)
    ratios = {name: output_input_ratio(p) for name, p in profiles.items()}
    grads = tuple(
        (name, f"{ratios[name]:.2f}", f"{p[0] / p[1]:.1f}", f"{min(p):.3g}", f"{max(p):.3g}")
        for name, p in profiles.items()
    )
    runs = tuple(
        (name, f"{lr:g}", f"{c[0]:.3f}", f"{min(c):.3f}", f"{_final(c):.3f}", f"{largest_spike(c):.3f}")
        for (name, lr), c in curves.items()
    )
    top, ratio = max(cfg.lrs), ratios["pre-norm"]
    flat = "pre-norm gradient profile flat: last/first-quarter ratio"
    loss_columns = ("final loss (last 10)", "largest spike (nats)")
    post, pre = curves[("post-norm", top)], curves[("pre-norm", top)]
    section = Section(
        "depth",
        f"Pre-norm against post-norm at depth {cfg.depth}",
        f"Width {cfg.width}, {cfg.heads} heads, no LayerScale/registers/RoPE, 8x8 digits. Gradient norm "
        f"of each block's parameters at step 0 (batch {cfg.grad_batch}); then {cfg.steps} AdamW steps at "
        f"each fixed lr without warmup (batch {cfg.batch}).",
        tables=[
            Table(
                "Gradient profile at step 0",
                ("placement", "last/first quarter (blocks 1..)", "block 0 / block 1", "smallest", "largest"),
                grads,
            ),
            Table("Fixed-lr runs", ("placement", "lr", "first loss", "best loss", *loss_columns), runs),
        ],
        targets=[
            Target(f"{flat}, lower bound", ratio, FLAT_BAND[0]),
            Target(f"{flat}, upper bound", ratio, FLAT_BAND[1], higher_is_better=False),
            Target(
                "post-norm gradient grows toward the output: last/first-quarter ratio",
                ratios["post-norm"],
                GROWING_RATIO,
            ),
            Target(
                f"post-norm spikes at lr {top:g}: largest rise above its best loss",
                largest_spike(post),
                SPIKE_NATS,
                unit="nats",
            ),
            Target(
                f"post-norm ends clearly worse than pre-norm at lr {top:g}: final-loss gap",
                _final(post) - _final(pre),
                SPIKE_NATS,
                unit="nats",
            ),
        ],
        notes=[
            "Pre-norm gradients falling toward the output match NormFormer's measurement (Shleifer et al., "
            "2021, Fig. 2). If post-norm trains fine here, the model is too shallow or the LR too low to "
            "test the claim; at this width the model may also be too narrow (Xiong et al. analyse d = 512)."
        ],
        data={
            "grad_norms": profiles,
            "losses": {f"{n}@{lr:g}": c for (n, lr), c in curves.items()},
            "config": dataclasses.asdict(cfg),
        },
    )
    labels = (f"Gradient norm per block at step 0, depth {cfg.depth}", "block (input -> output)", "||grad||")
    line_chart(ctx.figure("depth_grad_profile.png"), range(cfg.depth), profiles, labels, logy=True)
    finite = {f"{n} lr {lr:g}": [v if math.isfinite(v) else None for v in c] for (n, lr), c in curves.items()}
    labels = ("Training loss at fixed lr, no warmup", "step", "cross-entropy")
    line_chart(ctx.figure("depth_loss.png"), range(1, cfg.steps + 1), finite, labels)
    section.figures += ["figures/depth_grad_profile.png", "figures/depth_loss.png"]
    return section
