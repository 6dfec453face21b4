"""Exponential moving average of the weights (timm ``ModelEmaV3``), evaluated next to the raw ones.

Built from the *unwrapped* model after it is on its device: ``ModelEmaV3`` pairs tensors by the
order of ``state_dict().values()``, so it must see the same module the optimizer updates, not a
DDP / compile wrapper. Updated after every real optimizer step with the update count, so a
resumed run decays exactly like an uninterrupted one. Official recipe: decay 0.99996 over the full
state dict, no warmup.
"""

from __future__ import annotations

from timm.utils import ModelEmaV3
from torch import nn

from vit5.train.config import EmaSection


def build_ema(model: nn.Module, cfg: EmaSection) -> ModelEmaV3 | None:
    """An EMA copy of ``model`` (unwrapped), or None when disabled."""
    if not cfg.enabled:
        return None
    return ModelEmaV3(model, decay=cfg.decay, use_warmup=cfg.warmup)
