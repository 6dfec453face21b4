"""One training epoch: targets, loss, mixed precision and gradient accumulation through Accelerate.

Each micro-batch: targets mixed (:class:`TargetMixer`), forward and loss (:func:`build_loss`) under
``accelerator.autocast()`` (bf16 on GPU in the recipe; fp32 master weights), a finite-loss check
*before* backward (a NaN never reaches the weights), ``accelerator.backward``. Inside
``accelerator.accumulate`` the optimizer only steps when ``accelerator.sync_gradients`` is true;
only then do the lr schedule, the EMA, the update counter and the ``on_update`` callback (mid-epoch
checkpoints) advance.

An epoch is truncated to a multiple of the accumulation steps, so every optimizer step sees the
same number of micro-batches and epochs start on a step boundary (the loader is not prepared by
Accelerate, which would otherwise flush a partial accumulation at the end of the loader).

Targets are always soft ``[B, classes]``: Mixup / CutMix (timm ``Mixup``; the official recipe mixes
every batch: Mixup alpha 0.8, CutMix alpha 1.0, switch 0.5, mode ``batch``) or, with mixing off,
(smoothed) one-hot rows, so one loss code path serves both. timm ``Mixup`` draws from NumPy's global
RNG (checkpointed with the run) and asserts an even batch per process (validated in the config).
The losses:

* ``bce`` (pre-training, ``--bce-loss``): ``BCEWithLogits`` with targets binarised like the
  official ``targets.gt(0)`` (engine.py:47-48 of github.com/wangf3014/ViT-5 at commit b7b0796):
  every class present in the mix is a positive. timm ``BinaryCrossEntropy(smoothing=0,
  target_threshold=0)`` does exactly this.
* ``soft_ce`` (fine-tuning): timm ``SoftTargetCrossEntropy``; label smoothing is already folded
  into the targets; on smoothed one-hot rows it equals cross-entropy with label smoothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from timm.data import Mixup
from timm.data.mixup import mixup_target
from timm.loss import BinaryCrossEntropy, SoftTargetCrossEntropy
from timm.utils import ModelEmaV3
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from vit5.train.checkpointing import TrainState
from vit5.train.config import AugSection, LossSection
from vit5.train.optim import LRSchedule


class NonFiniteLoss(ArithmeticError):
    """The loss of a micro-batch is NaN or infinite (on any process)."""

    def __init__(self, value: float, epoch: int, batch: int, num_updates: int) -> None:
        self.value, self.epoch, self.batch, self.num_updates = value, epoch, batch, num_updates
        super().__init__(
            f"loss is {value} at epoch {epoch + 1}, batch {batch + 1} (optimizer step {num_updates + 1})"
        )


@dataclass
class LoopParts:
    """What an epoch needs; ``raw_model`` is the unwrapped module (EMA source), ``model`` the prepared one."""

    accelerator: Accelerator
    model: nn.Module
    raw_model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    criterion: nn.Module
    mixer: TargetMixer
    ema: ModelEmaV3 | None
    loader: DataLoader
    batches_per_epoch: int
    clip_grad: float | None
    progress: bool


@dataclass(frozen=True)
class EpochResult:
    loss: float  # mean training loss over all processes' micro-batches of this session
    images: int  # images trained on, all processes
    seconds: float


def train_one_epoch(
    parts: LoopParts, state: TrainState, epoch: int, num_epochs: int, on_update: Callable[[], None]
) -> EpochResult:
    """Train ``epoch`` from micro-batch ``state.batch``; advance ``state`` after every optimizer step."""
    acc, model = parts.accelerator, parts.model
    batch_size = parts.loader.batch_size or 1
    parts.loader.sampler.set_epoch(epoch, start_index=state.batch * batch_size)  # type: ignore[attr-defined]
    model.train()
    bar = tqdm(
        total=parts.batches_per_epoch,
        initial=state.batch,
        desc=f"epoch {epoch + 1}/{num_epochs}",
        disable=not (parts.progress and acc.is_main_process),
        dynamic_ncols=True,
        leave=False,
    )
    loss_sum, seen, smoothed = 0.0, 0, math.nan
    start = time.perf_counter()
    for images, labels in parts.loader:
        if state.batch >= parts.batches_per_epoch:
            break
        images = images.to(acc.device, non_blocking=True)
        labels = labels.to(acc.device, non_blocking=True)
        images, targets = parts.mixer(images, labels)
        with acc.accumulate(model):
            with acc.autocast():
                loss = parts.criterion(model(images), targets)
            value = _checked(acc, loss, epoch, state)
            acc.backward(loss)
            if acc.sync_gradients and parts.clip_grad is not None:
                acc.clip_grad_norm_(model.parameters(), parts.clip_grad)
            parts.optimizer.step()
            parts.optimizer.zero_grad(set_to_none=True)
        state.batch += 1
        loss_sum += value * labels.numel()
        seen += labels.numel()
        if acc.sync_gradients:
            state.num_updates += 1
            parts.schedule.after_update(state.num_updates)
            if parts.ema is not None:
                parts.ema.update(parts.raw_model, step=state.num_updates)
            on_update()
        smoothed = value if math.isnan(smoothed) else 0.9 * smoothed + 0.1 * value
        elapsed = time.perf_counter() - start
        bar.set_postfix(
            loss=f"{smoothed:.4f}",
            lr=f"{parts.schedule.lr:.2e}",
            img_s=f"{seen * acc.num_processes / elapsed:.0f}",
            refresh=False,
        )
        bar.update(1)
    bar.close()
    seconds = time.perf_counter() - start
    loss_total, images = reduce_sums(acc, [loss_sum, seen])
    return EpochResult(loss=loss_total / max(images, 1), images=int(images), seconds=seconds)


def reduce_sums(accelerator: Accelerator, values: Sequence[float]) -> list[float]:
    """Sum ``values`` over all processes (collective: every rank must call it)."""
    tensor = torch.tensor(list(values), dtype=torch.float64, device=accelerator.device)
    return accelerator.reduce(tensor, "sum").tolist()


def _checked(acc: Accelerator, loss: torch.Tensor, epoch: int, state: TrainState) -> float:
    """The loss as a float, after checking that it is finite on every process (one host sync)."""
    loss = loss.detach().float()
    bad = (~torch.isfinite(loss)).float()
    if acc.num_processes > 1:  # every rank must stop together
        bad = acc.reduce(bad, "sum")
    value, bad_ranks = torch.stack([loss, bad]).tolist()
    if bad_ranks:  # a finite local value means another process saw the NaN
        raise NonFiniteLoss(
            value if not math.isfinite(value) else math.nan, epoch, state.batch, state.num_updates
        )
    return value


class TargetMixer:
    """``(images, labels) -> (images, soft targets)`` for a training batch."""

    def __init__(self, cfg: AugSection, num_classes: int, smoothing: float) -> None:
        self.num_classes = num_classes
        self.smoothing = smoothing
        self.mixup: Mixup | None = None
        if cfg.mixing:
            self.mixup = Mixup(
                mixup_alpha=cfg.mixup,
                cutmix_alpha=cfg.cutmix,
                prob=cfg.mixup_prob,
                switch_prob=cfg.mixup_switch_prob,
                mode=cfg.mixup_mode,
                label_smoothing=smoothing,
                num_classes=num_classes,
            )

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mixup is not None:
            return self.mixup(images, labels)
        return images, mixup_target(labels, self.num_classes, lam=1.0, smoothing=self.smoothing)


def build_loss(cfg: LossSection) -> nn.Module:
    """The training criterion ``(logits [B, C], soft targets [B, C]) -> scalar``."""
    if cfg.name == "bce":
        return BinaryCrossEntropy(smoothing=0.0, target_threshold=cfg.bce_target_threshold)
    return SoftTargetCrossEntropy()
