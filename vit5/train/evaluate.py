"""Top-1 / top-5 accuracy and cross-entropy of the validation set over every process: the loader is
Accelerate-prepared and ``gather_for_metrics`` drops its padding
(https://huggingface.co/docs/accelerate/quicktour#distributed-evaluation); shard loaders pad with
label ``-1``, which counts for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader


@dataclass(frozen=True)
class EvalResult:
    loss: float  # mean cross-entropy
    top1: float  # percent
    top5: float  # percent (top-k with k = min(5, classes))
    count: int  # images evaluated over all processes


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, accelerator: Accelerator) -> EvalResult:
    """Evaluate ``model`` on ``loader`` (prepared; a plain one is evaluated whole on each process)."""
    was_training = model.training
    model.eval()
    # running sums stay on the device: one host sync for the whole pass, not three per batch
    sums = torch.zeros(4, dtype=torch.float64, device=accelerator.device)  # loss, top-1, top-5, count
    for images, labels in loader:
        images = images.to(accelerator.device, non_blocking=True)
        labels = labels.to(accelerator.device, non_blocking=True)
        with accelerator.autocast():
            logits = model(images).float()
        valid = (labels >= 0).float()  # label -1: padding of a shard loader, not an image
        labels = labels.clamp(min=0)
        hits = logits.topk(min(5, logits.shape[-1]), dim=-1).indices.eq(labels[:, None]).float()
        loss = F.cross_entropy(logits, labels, reduction="none")
        per_image = (
            torch.stack([loss, hits[:, 0], hits.amax(dim=1), torch.ones_like(valid)], 1) * valid[:, None]
        )
        per_image = accelerator.gather_for_metrics(per_image)  # every process's images, padding dropped
        sums += per_image.sum(dim=0).double()
    model.train(was_training)
    loss_sum, correct1, correct5, count = sums.tolist()
    if count == 0:
        raise RuntimeError("the validation set is empty on every process")
    return EvalResult(loss_sum / count, 100 * correct1 / count, 100 * correct5 / count, int(count))
