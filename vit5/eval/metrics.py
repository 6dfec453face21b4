"""Streaming classification and segmentation metrics from one confusion matrix (rows: true classes, as
scikit-learn). Segmentation as mmsegmentation: IoU = TP / (TP + FP + FN), mIoU over the classes with
union > 0, pixel accuracy = TP / valid."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


def confusion_matrix(targets: torch.Tensor, preds: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``[num_classes, num_classes]`` int64 counts of (target, prediction) pairs."""
    pairs = targets.reshape(-1).long() * num_classes + preds.reshape(-1).long()
    return torch.bincount(pairs, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


@dataclass(frozen=True)
class ClassificationScores:
    num_images: int
    top1: float  # fractions in [0, 1]
    top5: float  # top-k with k = min(5, num_classes)
    loss: float  # mean cross-entropy
    confusion: np.ndarray

    @property
    def per_class_accuracy(self) -> np.ndarray:
        """Recall of each class; NaN for a class with no images."""
        counts = self.confusion.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(counts > 0, np.diag(self.confusion) / counts, np.nan)


class ClassificationMeter:
    """Accumulates top-1/top-5 hits, summed cross-entropy and the confusion matrix batch by batch."""

    def __init__(self, num_classes: int) -> None:
        self.num_classes, self.k = num_classes, min(5, num_classes)
        self.topk, self.loss_sum = 0, 0.0
        self.confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64)

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        logits, targets = logits.detach().float().cpu(), targets.detach().long().cpu()
        ranked = logits.topk(self.k, dim=1).indices
        self.topk += int((ranked == targets[:, None]).any(dim=1).sum())
        self.loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
        self.confusion += confusion_matrix(targets, ranked[:, 0], self.num_classes)

    def compute(self) -> ClassificationScores:
        count = int(self.confusion.sum())
        n, top1 = max(count, 1), int(self.confusion.trace())
        return ClassificationScores(
            count, top1 / n, self.topk / n, self.loss_sum / n, self.confusion.numpy().copy()
        )


@dataclass(frozen=True)
class SegmentationScores:
    miou: float
    pixel_accuracy: float
    iou: np.ndarray  # per class; NaN where the class is absent from labels and predictions
    confusion: np.ndarray


def segmentation_scores(confusion: np.ndarray) -> SegmentationScores:
    confusion = np.asarray(confusion, dtype=np.float64)
    tp = np.diag(confusion)
    union = confusion.sum(axis=0) + confusion.sum(axis=1) - tp
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, tp / union, np.nan)
    total = confusion.sum()
    return SegmentationScores(
        miou=float(np.nanmean(iou)) if np.isfinite(iou).any() else float("nan"),
        pixel_accuracy=float(tp.sum() / total) if total else float("nan"),
        iou=iou,
        confusion=confusion.astype(np.int64),
    )
