"""Cosine learning-rate schedule with linear warmup (timm ``CosineLRScheduler``).

``lr(t) = warmup_lr + t (lr - warmup_lr) / warmup``  for ``t < warmup``, then
``lr(t) = min_lr + (lr - min_lr) (1 + cos(pi t / T)) / 2`` with ``T`` the whole run, warmup
included (official: no warmup prefix). ``lr_scale`` from layer decay multiplies each group.

Two clocks:

* ``"update"`` (default): ``t`` counts optimizer updates (epochs x updates per epoch). Call
  :meth:`LRSchedule.after_update` only after a *real* optimizer step
  (``accelerator.sync_gradients``), never on accumulation micro-steps.
* ``"epoch"``: the official per-epoch stepping, reproduced with its one-epoch lag
  (reference §3.2): epoch 0 runs at ``warmup_lr`` and epoch ``e >= 1`` at ``lr(e - 1)``.

The timm scheduler is not a ``torch.optim.lr_scheduler.LRScheduler``, so ``accelerator.prepare``
leaves it alone; it is stateless given ``t`` and the optimizer's param groups (which the
checkpoint restores), so it needs no checkpoint of its own.
"""

from __future__ import annotations

import torch
from timm.scheduler import create_scheduler_v2

from vit5.train.config import ScheduleSection


class LRSchedule:
    """Sets the optimizer's lr for the next update; see the module docstring for the clocks."""

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

    def start(self, num_updates: int, epoch: int) -> None:
        """Set the lr for a run that has made ``num_updates`` updates and is at ``epoch``."""
        if self.interval == "update":
            self.scheduler.step_update(num_updates)
        else:
            self.scheduler.step(max(epoch - 1, 0))

    def after_update(self, num_updates: int) -> None:
        """Call after each real optimizer step; ``num_updates`` counts the steps done so far."""
        if self.interval == "update":
            self.scheduler.step_update(num_updates)

    def after_epoch(self, epoch: int) -> None:
        """Call when epoch ``epoch`` (0-based) is finished."""
        if self.interval == "epoch":
            self.scheduler.step(epoch)

    @property
    def lr(self) -> float:
        """The lr of the group with the largest ``lr_scale`` (the head's under layer decay)."""
        return max(g["lr"] for g in self.optimizer.param_groups)
