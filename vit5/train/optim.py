"""The update rule: optimizer, learning-rate schedule and EMA of the weights.

**Optimizer** through ``timm.optim.create_optimizer_v2``, which does the grouping the official code
relies on (timm ``create_optimizer`` in main.py of github.com/wangf3014/ViT-5 at commit b7b0796): no
weight decay for every 1-D parameter (RMSNorm / LayerNorm / QK-Norm gains, biases, LayerScale
``ls*.gamma``) nor for the model's ``no_weight_decay()`` set (``pos_embed``, ``cls_token``,
``reg_token``). With ``layer_decay`` it reads ``model.group_matcher()`` and gives each group an
``lr_scale`` of ``layer_decay ** (last - layer)``: stem (patch embedding, tokens, ``pos_embed``)
lowest, block ``i`` at layer ``i + 1``, the final norm with the last block (timm's convention), the
head at 1.0. Pre-training uses ``lamb``: timm's ``Lamb`` matches apex ``FusedLAMB`` as the official
code calls it (global grad-norm clip at 1.0, trust ratio only on the decayed group). Fine-tuning
uses ``adamw``.

**Schedule**: cosine with linear warmup (timm ``CosineLRScheduler``)::

    lr(t) = warmup_lr + t (lr - warmup_lr) / warmup               for t < warmup
    lr(t) = min_lr + (lr - min_lr) (1 + cos(pi t / T)) / 2        with T the whole run, warmup included

(official: no warmup prefix). ``lr_scale`` from layer decay multiplies each group. Two clocks
(``schedule.interval``):

* ``"epoch"`` (the default, as the official recipe): per-epoch stepping reproduced with its
  one-epoch lag (main.py calls ``lr_scheduler.step(epoch)`` after each epoch): epoch 0 runs at
  ``warmup_lr`` and epoch ``e >= 1`` at ``lr(e - 1)``.
* ``"update"``: ``t`` counts optimizer updates (epochs x updates per epoch). Call
  :meth:`LRSchedule.after_update` only after a *real* optimizer step
  (``accelerator.sync_gradients``), never on accumulation micro-steps.

The timm scheduler is not a ``torch.optim.lr_scheduler.LRScheduler``, so ``accelerator.prepare``
leaves it alone; it is stateless given ``t`` and the optimizer's param groups (which the checkpoint
restores), so it needs no checkpoint of its own.

**EMA** of the weights (timm ``ModelEmaV3``), evaluated next to the raw ones. Built from the
*unwrapped* model after it is on its device: ``ModelEmaV3`` pairs tensors by the order of
``state_dict().values()``, so it must see the same module the optimizer updates, not a DDP /
compile wrapper. Updated after every real optimizer step with the update count, so a resumed run
decays exactly like an uninterrupted one. Official recipe: decay 0.99996 over the full state dict,
no warmup.
"""

from __future__ import annotations

import torch
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3
from torch import nn

from vit5.train.config import EmaSection, OptimSection, ScheduleSection


def peak_lr(cfg: OptimSection, global_batch: int) -> float:
    """The peak lr: ``cfg.lr`` as is (official ``--unscale-lr``), or scaled linearly by
    ``global_batch / lr_base_batch`` when ``lr_base_batch`` is set (DeiT's default rule, 512)."""
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

    def start(self, num_updates: float, epoch: int) -> None:
        """Set the lr for a run that has made ``num_updates`` updates (the schedule clock of
        :func:`vit5.train.loop.schedule_clock`) and is at ``epoch``."""
        if self.interval == "update":
            self.scheduler.step_update(num_updates)
        else:
            self.scheduler.step(max(epoch - 1, 0))

    def after_update(self, num_updates: float) -> None:
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


def build_ema(model: nn.Module, cfg: EmaSection) -> ModelEmaV3 | None:
    """An EMA copy of ``model`` (unwrapped), or None when disabled."""
    if not cfg.enabled:
        return None
    return ModelEmaV3(model, decay=cfg.decay, use_warmup=cfg.warmup)


def ema_horizon_warning(cfg: EmaSection, total_updates: int) -> str:
    """A warning when the EMA cannot move in this run, else ``""``.

    An EMA of decay ``d`` averages over about ``1 / (1 - d)`` updates (the weight of the start
    falls to ``1/e`` after that many); the recipe's 0.99996 is 25,000 updates, made for ImageNet's
    hundreds of thousands. A run with fewer updates in all ends with EMA weights still close to
    where it started (30% EMA against 86.7% raw on a short fine-tune).
    """
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
