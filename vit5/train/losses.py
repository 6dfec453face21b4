"""Training losses on soft targets (see :mod:`vit5.train.mixup`).

* ``bce`` (pre-training, ``--bce-loss``): ``BCEWithLogits`` with targets binarised like the
  official ``targets.gt(0)`` (reference §3.2): every class present in the mix is a positive.
  timm ``BinaryCrossEntropy(smoothing=0, target_threshold=0)`` does exactly this.
* ``soft_ce`` (fine-tuning): timm ``SoftTargetCrossEntropy``; label smoothing is already folded
  into the targets by Mixup (or the one-hot path).
"""

from __future__ import annotations

from timm.loss import BinaryCrossEntropy, SoftTargetCrossEntropy
from torch import nn

from vit5.train.config import LossSection


def build_loss(cfg: LossSection) -> nn.Module:
    """The training criterion ``(logits [B, C], soft targets [B, C]) -> scalar``."""
    if cfg.name == "bce":
        return BinaryCrossEntropy(smoothing=0.0, target_threshold=cfg.bce_target_threshold)
    return SoftTargetCrossEntropy()
