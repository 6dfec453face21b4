"""The training step and loop of ``vit5 train``, the register study and the depth ablation, with the update
rule (timm optimizer, cosine schedule, ``ModelEmaV3``) and validation; a loss is checked finite before
backward. Targets are soft ``[B, classes]``; ``bce`` binarises them like the official ``targets.gt(0)``
(github.com/wangf3014/ViT-5 engine.py:47-48, main.py)."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import timm.optim.muon as timm_muon
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from timm.data import Mixup
from timm.data.mixup import mixup_target
from timm.loss import BinaryCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from vit5.runtime import emulated_bf16
from vit5.train.checkpointing import TrainState
from vit5.train.config import AugSection, EmaSection, LossSection, OptimSection, ScheduleSection
from vit5.train.data import start_epoch

# ---------------------------------------------------------------------------------- update rule
# Muon (arXiv 2502.16982) orthogonalises the updates of hidden matrices only; timm's Muon routes
# the patch embedding and the head (by name), the tokens and pos_embed (no_weight_decay()) to its
# AdamW fallback, 1-D parameters by their shape (timm/optim/muon.py, _is_suitable_for_muon)
MUON_FALLBACK = ("patch_embed.*", "head.*")


def build_optimizer(
    model: nn.Module, cfg: OptimSection, lr: float, on_cpu: bool = False
) -> torch.optim.Optimizer:
    """timm's optimizer on the unwrapped ``model`` at peak ``lr``; Muon's fallback as above. A
    Muon-family optimizer for a run ``on_cpu`` that emulates bf16 orthogonalises in fp32
    (:func:`orthogonalise_in_fp32`)."""
    muon = "muon" in cfg.name
    optimizer = create_optimizer_v2(
        model,
        opt=cfg.name,
        lr=lr,
        weight_decay=cfg.weight_decay,
        layer_decay=cfg.layer_decay,
        filter_bias_and_bn=True,
        betas=tuple(cfg.betas),
        eps=cfg.eps,
        fallback_list=MUON_FALLBACK if muon else (),
        fallback_no_weight_decay=muon,
    )
    if muon and emulated_bf16(on_cpu):
        orthogonalise_in_fp32(optimizer)
    return optimizer


def orthogonalise_in_fp32(optimizer: torch.optim.Optimizer) -> None:
    """Make a timm Muon-family ``optimizer`` run its Newton-Schulz orthogonalisation in fp32.

    timm computes it in bf16 (``zeropower_via_newtonschulz(..., dtype=torch.bfloat16)`` in
    ``timm/optim/muon.py``, a default its ``Muon`` does not expose). On a CPU that emulates bf16 that
    made a ``fashion_mnist_cpu`` training step 4.4x slower than AdamW's; in fp32 the step costs about
    9 % more than AdamW's (docs/results.md, "Muon against AdamW at equal wall time"). timm's function
    is swapped for the length of each ``step`` call only, so other optimizers keep timm's default."""
    step = optimizer.step

    @functools.wraps(step)
    def step_in_fp32(*args: Any, **kwargs: Any) -> Any:
        original = timm_muon.zeropower_via_newtonschulz
        timm_muon.zeropower_via_newtonschulz = functools.partial(original, dtype=torch.float32)
        try:
            return step(*args, **kwargs)
        finally:
            timm_muon.zeropower_via_newtonschulz = original

    optimizer.step = step_in_fp32  # type: ignore[method-assign]


def optimizer_note(name: str, on_cpu: bool) -> str:
    """The header's note that a Muon-family optimizer orthogonalises in fp32 on this CPU, not in
    timm's bf16 (:func:`orthogonalise_in_fp32`)."""
    emulated = emulated_bf16(on_cpu)
    if "muon" not in name or not emulated:
        return ""
    return (
        f"optim.name={name} orthogonalises its updates in fp32 here: this CPU ({emulated}) "
        "emulates the bf16 of timm's Muon, which made training steps 4.4x slower"
    )


class LRSchedule:
    """Cosine lr with linear warmup (timm ``CosineLRScheduler``), set per update or per epoch
    (``schedule.interval``; epoch keeps the one-epoch lag of main.py's ``lr_scheduler.step(epoch)``); timm
    ignores the calls of the other interval."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, cfg: ScheduleSection, updates_per_epoch: int
    ):
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
        self.scheduler.step_update(num_updates)
        self.scheduler.step(max(epoch - 1, 0))

    def after_update(self, num_updates: float) -> None:
        self.scheduler.step_update(num_updates)

    def after_epoch(self, epoch: int) -> None:
        self.scheduler.step(epoch)

    @property
    def lr(self) -> float:
        """The largest group lr (the head's under layer decay)."""
        return max(g["lr"] for g in self.optimizer.param_groups)


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


# ---------------------------------------------------------------------------------- training
Mixer = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class NonFiniteLoss(ArithmeticError):
    """The loss of a micro-batch is NaN or infinite (on any process)."""


@dataclass(kw_only=True)
class StepParts:
    """What a step touches: ``raw_model`` is the unwrapped ``model`` the EMA follows; no
    ``accelerator``: plain PyTorch; ``clock``: the schedule's position (default: the update count)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    schedule: LRSchedule | None = None
    clip_grad: float | None = None
    ema: ModelEmaV3 | None = None
    raw_model: nn.Module | None = None
    accelerator: Accelerator | None = None
    clock: Callable[[TrainState], float] | None = None
    # this process's stop requests, summed over processes with the loss check (no collective of
    # their own); the sums of the last micro-batch land in ``stops``
    stop_requests: Callable[[], list[float]] = list
    stops: list[float] = field(default_factory=list)


def schedule_clock(state: TrainState, updates_per_epoch: int, global_batch: int) -> float:
    """The lr schedule's position in optimizer steps of the current global batch (the same fraction of
    the run after an elastic resume)."""
    done, left = divmod(state.epoch_samples, global_batch)
    return state.epoch * updates_per_epoch + (
        done if left == 0 else state.epoch_samples / global_batch
    )


def train_step(
    parts: StepParts, inputs: torch.Tensor, targets: torch.Tensor, state: TrainState
) -> float:
    """Train on one micro-batch, advance ``state``; return its loss (``NonFiniteLoss`` before backward
    on every process when it is NaN or infinite on any)."""
    acc = parts.accelerator
    model = parts.model
    with acc.accumulate(model) if acc is not None else nullcontext():
        with acc.autocast() if acc is not None else nullcontext():
            loss = parts.criterion(model(inputs), targets)
        value = _checked(parts, loss, state)
        if acc is not None:
            acc.backward(loss)
        else:
            loss.backward()
        synced = acc is None or acc.sync_gradients
        if synced and parts.clip_grad is not None:
            clip = acc.clip_grad_norm_ if acc is not None else nn.utils.clip_grad_norm_
            clip(model.parameters(), parts.clip_grad)
        parts.optimizer.step()  # Accelerate's optimizer skips it until the gradients are complete
        parts.optimizer.zero_grad(set_to_none=True)
    state.batch += 1
    state.epoch_samples += inputs.shape[0] * (acc.num_processes if acc is not None else 1)
    if synced:
        state.num_updates += 1
        clock = state.num_updates if parts.clock is None else parts.clock(state)
        if parts.schedule is not None:
            parts.schedule.after_update(clock)
        if parts.ema is not None:
            followed = model if parts.raw_model is None else parts.raw_model
            parts.ema.update(followed, step=state.num_updates)
    return value


def train_steps(
    parts: StepParts,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    state: TrainState,
    bar: tqdm | None = None,
    on_update: Callable[[float, float], None] | None = None,
) -> list[float]:
    """:func:`train_step` on every batch, ``on_update(mean loss, lr it ran at)`` after each update."""
    parts.model.train()
    losses: list[float] = []
    smoothed = math.nan
    step_losses: list[float] = []  # the micro-batches of the optimizer step in progress
    for inputs, targets in batches:
        updates = state.num_updates
        # before the step moves the schedule on
        step_lr = max(g["lr"] for g in parts.optimizer.param_groups)
        losses.append(train_step(parts, inputs, targets, state))
        step_losses.append(losses[-1])
        if state.num_updates > updates:
            if on_update is not None:
                on_update(math.fsum(step_losses) / len(step_losses), step_lr)
            step_losses.clear()
        if bar is not None:
            smoothed = losses[-1] if math.isnan(smoothed) else 0.9 * smoothed + 0.1 * losses[-1]
            lr = max(g["lr"] for g in parts.optimizer.param_groups)
            bar.set_postfix(loss=f"{smoothed:.4f}", lr=f"{lr:.2e}", refresh=False)
            bar.update(1)
    return losses


@dataclass(kw_only=True)
class LoopParts(StepParts):
    """What an epoch of ``vit5 train`` needs: the step's parts and the training data."""

    mixer: Mixer
    loader: DataLoader
    batch_size: int  # per process
    progress: bool


def train_one_epoch(
    parts: LoopParts,
    state: TrainState,
    epoch: int,
    num_epochs: int,
    on_update: Callable[[bool, float, float], None],
) -> tuple[float, int, float]:
    """Train ``epoch`` from sample ``state.epoch_samples`` on, in whole optimizer steps;
    ``on_update(end_of_epoch, loss, lr)`` after each. Returns the mean loss and images over all
    processes, and the seconds taken."""
    acc = parts.accelerator
    start_epoch(parts.loader, epoch, consumed=state.epoch_samples)
    accum = acc.gradient_accumulation_steps
    end = state.batch + len(parts.loader) // accum * accum
    sizes: list[int] = []

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for images, labels in islice(parts.loader, end - state.batch):
            sizes.append(labels.shape[0])
            yield parts.mixer(
                images.to(acc.device, non_blocking=True), labels.to(acc.device, non_blocking=True)
            )

    bar = tqdm(
        total=end,
        initial=state.batch,
        desc=f"epoch {epoch + 1}/{num_epochs}",
        disable=not (parts.progress and acc.is_main_process),
        unit="img",
        unit_scale=parts.batch_size * acc.num_processes,
        dynamic_ncols=True,
        leave=False,
    )
    start = time.perf_counter()
    losses = train_steps(
        parts, batches(), state, bar, lambda loss, lr: on_update(state.batch >= end, loss, lr)
    )
    bar.close()
    seconds = time.perf_counter() - start
    loss_sum = sum(loss * size for loss, size in zip(losses, sizes))
    loss_total, images = reduce_sums(acc, [loss_sum, sum(sizes)])
    return loss_total / max(images, 1), int(images), seconds


def reduce_sums(accelerator: Accelerator, values: Sequence[float]) -> list[float]:
    """Sum ``values`` over all processes (collective: every rank must call it)."""
    tensor = torch.tensor(list(values), dtype=torch.float64, device=accelerator.device)
    return accelerator.reduce(tensor, "sum").tolist()


def _checked(parts: StepParts, loss: torch.Tensor, state: TrainState) -> float:
    """The loss as a float, after checking that it is finite on every process: the step's one host
    sync, which also sums the processes' stop requests into ``parts.stops``."""
    acc = parts.accelerator
    loss = loss.detach().float()
    requests = torch.tensor(parts.stop_requests(), device=loss.device)
    flags = torch.cat([(~torch.isfinite(loss)).float()[None], requests])
    if acc is not None and acc.num_processes > 1:  # every rank must stop together
        flags = acc.reduce(flags, "sum")
    value, bad_ranks, *parts.stops = torch.cat([loss[None], flags]).tolist()
    if bad_ranks:  # a finite local value means another process saw the NaN
        raise NonFiniteLoss(
            f"loss is {value if not math.isfinite(value) else math.nan} at epoch {state.epoch + 1}, "
            f"batch {state.batch + 1} (optimizer step {state.num_updates + 1})"
        )
    return value


def target_mixer(cfg: AugSection, num_classes: int, smoothing: float) -> Mixer:
    """``(images, labels) -> (images, soft targets)`` for a training batch."""
    if cfg.mixing:
        return Mixup(
            mixup_alpha=cfg.mixup,
            cutmix_alpha=cfg.cutmix,
            prob=cfg.mixup_prob,
            switch_prob=cfg.mixup_switch_prob,
            mode=cfg.mixup_mode,
            label_smoothing=smoothing,
            num_classes=num_classes,
        )
    return lambda images, labels: (images, _soft_targets(labels, num_classes, smoothing))


def _soft_targets(labels: torch.Tensor, num_classes: int, smoothing: float) -> torch.Tensor:
    """Class labels as smoothed one-hot targets; ``[B, classes]`` targets (multi-label) as they are."""
    if labels.ndim == 2:
        return labels
    return mixup_target(labels, num_classes, lam=1.0, smoothing=smoothing)


def build_loss(cfg: LossSection) -> nn.Module:
    """The training criterion ``(logits [B, C], soft targets [B, C]) -> scalar``."""
    if cfg.name == "bce":
        return BinaryCrossEntropy(smoothing=0.0, target_threshold=cfg.bce_target_threshold)
    return SoftTargetCrossEntropy()


# ---------------------------------------------------------------------------------- validation
@dataclass(frozen=True)
class EvalResult:
    loss: float  # mean cross-entropy
    top1: float  # percent
    top5: float  # percent (top-k with k = min(5, classes))
    count: int  # images evaluated over all processes


BatchHook = Callable[[torch.Tensor, torch.Tensor, list[torch.Tensor]], None]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[Sequence[torch.Tensor]],
    accelerator: Accelerator,
    on_batch: BatchHook | None = None,
) -> EvalResult:
    """Loss, top-1 / top-5 of ``model`` over ``batches`` of ``(images, labels, *extra)`` on every
    process: a prepared loader's padding is dropped by ``gather_for_metrics``
    (huggingface.co/docs/accelerate/quicktour#distributed-evaluation), a label ``-1`` (a shard
    loader's padding, an unreadable file) counts for nothing; a plain loader is evaluated whole on
    each process. ``on_batch(logits, labels, extra)`` sees each batch gathered from every process
    (``vit5 eval classify``: the confusion matrix, the skipped files). No images: ``count`` 0 and
    NaN scores."""
    was_training = model.training
    model.eval()
    device = accelerator.device
    # running sums stay on the device: one host sync for the whole pass, not three per batch
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top-1, top-5, count
    for images, labels, *extra in batches:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with accelerator.autocast():
            logits = model(images).float()
        valid = (labels >= 0).float()
        clamped = labels.clamp(min=0)
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
        hits = top.eq(clamped[:, None]).float()
        loss = F.cross_entropy(logits, clamped, reduction="none")
        columns = [loss, hits[:, 0], hits.amax(dim=1), torch.ones_like(valid)]
        per_image = torch.stack(columns, 1) * valid[:, None]
        # every process's images, padding dropped, in one gather
        tensors = [per_image] if on_batch is None else [per_image, logits, labels, *extra]
        gathered = accelerator.gather_for_metrics(tensors)
        sums += gathered[0].sum(dim=0).double()
        if on_batch is not None:
            on_batch(gathered[1], gathered[2], gathered[3:])
    model.train(was_training)
    loss_sum, correct1, correct5, count = sums.tolist()
    if count == 0:
        return EvalResult(math.nan, math.nan, math.nan, 0)
    return EvalResult(loss_sum / count, 100 * correct1 / count, 100 * correct5 / count, int(count))
