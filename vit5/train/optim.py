"""The update rule: optimizer (timm ``create_optimizer_v2``: no weight decay on 1-D parameters and
``no_weight_decay()``, optional layer decay), cosine lr schedule with linear warmup (timm
``CosineLRScheduler``; ``schedule.interval=epoch`` keeps the official one-epoch lag of main.py's
``lr_scheduler.step(epoch)``), and the EMA of the weights (timm ``ModelEmaV3``, built on the unwrapped
model). github.com/wangf3014/ViT-5 main.py; see docs/training.md.
"""

from __future__ import annotations

import torch
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3
from torch import nn

from vit5.train.config import EmaSection, OptimSection, ScheduleSection


def peak_lr(cfg: OptimSection, global_batch: int) -> float:
    """``cfg.lr`` (official ``--unscale-lr``), or scaled by ``global_batch / lr_base_batch`` when set."""
    if cfg.lr_base_batch is None:
        return cfg.lr
    return cfg.lr * global_batch / cfg.lr_base_batch


def build_optimizer(model: nn.Module, cfg: OptimSection, lr: float) -> torch.optim.Optimizer:
    """``create_optimizer_v2`` on ``model`` (unwrapped, before ``accelerator.prepare``)."""
    return create_optimizer_v2(
        model,
        opt=cfg.name,
        lr=lr,
        weight_decay=cfg.weight_decay,
        layer_decay=cfg.layer_decay,
        filter_bias_and_bn=True,
        betas=tuple(cfg.betas),
        eps=cfg.eps,
    )


class LRSchedule:
    """Sets the optimizer's lr for the next update, per update or per epoch (``schedule.interval``)."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, cfg: ScheduleSection, updates_per_epoch: int
    ) -> None:
        if updates_per_epoch < 1:
            raise ValueError(f"updates_per_epoch must be >= 1, got {updates_per_epoch}")
        self.interval = cfg.interval
        self.scheduler, _ = create_scheduler_v2(
            optimizer,
            sched="cosine",
            num_epochs=cfg.epochs,
            warmup_epochs=cfg.warmup_epochs,
            warmup_lr=cfg.warmup_lr,
            min_lr=cfg.min_lr,
            warmup_prefix=False,
            step_on_epochs=cfg.interval == "epoch",
            updates_per_epoch=updates_per_epoch,
        )
        self.optimizer = optimizer
        self.start(num_updates=0, epoch=0)

    def start(self, num_updates: float, epoch: int) -> None:
        """Set the lr for a run at ``epoch`` that has made ``num_updates`` updates (its schedule clock)."""
        if self.interval == "update":
            self.scheduler.step_update(num_updates)
        else:
            self.scheduler.step(max(epoch - 1, 0))

    def after_update(self, num_updates: float) -> None:
        if self.interval == "update":
            self.scheduler.step_update(num_updates)

    def after_epoch(self, epoch: int) -> None:
        if self.interval == "epoch":
            self.scheduler.step(epoch)

    @property
    def lr(self) -> float:
        """The lr of the group with the largest ``lr_scale`` (the head's under layer decay)."""
        return max(g["lr"] for g in self.optimizer.param_groups)


def build_ema(model: nn.Module, cfg: EmaSection) -> ModelEmaV3 | None:
    if not cfg.enabled:
        return None
    return ModelEmaV3(model, decay=cfg.decay, use_warmup=cfg.warmup)


def ema_horizon_warning(cfg: EmaSection, total_updates: int) -> str:
    """A warning when the EMA (averaging over ``1 / (1 - decay)`` updates) cannot move in this run."""
    if not cfg.enabled or cfg.warmup:  # timm's warmup shortens the horizon early on by itself
        return ""
    horizon = 1.0 / (1.0 - cfg.decay)
    if horizon <= total_updates:
        return ""
    suggested = 1.0 - 10.0 / max(total_updates, 20)
    return (
        f"WARNING: ema.decay={cfg.decay:g} averages over ~{horizon:,.0f} updates (1 / (1 - decay)) but this "
        f"run makes {total_updates:,} in all, so the EMA weights barely move from the starting ones and "
        f"their scores mean little; for this run set ema.decay={suggested:.4g} (a tenth of the run), "
        "ema.warmup=true, or ema.enabled=false"
    )
