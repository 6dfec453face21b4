"""Training targets: Mixup / CutMix (timm ``Mixup``) or plain one-hot, always soft ``[B, classes]``.

The official recipe mixes every batch (Mixup alpha 0.8, CutMix alpha 1.0, switch 0.5, mode
``batch``). With mixing off, labels still become (smoothed) one-hot rows, so one loss code path
serves both; ``SoftTargetCrossEntropy`` on smoothed one-hot rows equals cross-entropy with label
smoothing. timm ``Mixup`` draws from NumPy's global RNG (checkpointed by Accelerate) and asserts an
even batch per process (validated in the config).
"""

from __future__ import annotations

import torch
from timm.data import Mixup
from timm.data.mixup import mixup_target

from vit5.train.config import AugSection


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
