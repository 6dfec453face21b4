"""Top-1 / top-5 accuracy and cross-entropy on the validation shard of each process, reduced."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader

from vit5.train.metrics import reduce_sums


@dataclass(frozen=True)
class EvalResult:
    loss: float  # mean cross-entropy
    top1: float  # percent
    top5: float  # percent (top-k with k = min(5, classes))
    count: int  # images evaluated over all processes


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, accelerator: Accelerator) -> EvalResult:
    """Evaluate ``model`` (raw or EMA) on this process's ``loader`` shard; collective over ranks."""
    was_training = model.training
    model.eval()
    loss_sum, correct1, correct5, count = 0.0, 0, 0, 0
    for images, labels in loader:
        images = images.to(accelerator.device, non_blocking=True)
        labels = labels.to(accelerator.device, non_blocking=True)
        with accelerator.autocast():
            logits = model(images)
        logits = logits.float()
        loss_sum += float(F.cross_entropy(logits, labels, reduction="sum"))
        topk = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
        hits = topk.eq(labels[:, None])
        correct1 += int(hits[:, 0].sum())
        correct5 += int(hits.any(dim=1).sum())
        count += labels.numel()
    model.train(was_training)
    loss_sum, correct1, correct5, count = reduce_sums(accelerator, [loss_sum, correct1, correct5, count])
    if count == 0:
        raise RuntimeError("the validation set is empty on every process")
    return EvalResult(
        loss=loss_sum / count, top1=100 * correct1 / count, top5=100 * correct5 / count, count=int(count)
    )
