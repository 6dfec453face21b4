"""Optimizer through timm's factory, with the ViT-5 weight-decay groups and optional layer decay.

``timm.optim.create_optimizer_v2`` does the grouping the official code relies on (reference §3.2):
no weight decay for every 1-D parameter (RMSNorm / LayerNorm / QK-Norm gains, biases, LayerScale
``ls*.gamma``) nor for the model's ``no_weight_decay()`` set (``pos_embed``, ``cls_token``,
``reg_token``). With ``layer_decay`` it reads ``model.group_matcher()`` and gives each group an
``lr_scale`` of ``layer_decay ** (last - layer)``: stem (patch embedding, tokens, ``pos_embed``)
lowest, block ``i`` at layer ``i + 1``, the final norm with the last block (timm's convention), the
head at 1.0. The timm scheduler applies the scales.

Pre-training uses ``lamb``: timm's ``Lamb`` matches apex ``FusedLAMB`` as the official code
calls it (global grad-norm clip at 1.0, trust ratio only on the decayed group). Fine-tuning
uses ``adamw``.
"""

from __future__ import annotations

import torch
from timm.optim import create_optimizer_v2
from torch import nn

from vit5.train.config import OptimSection


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
