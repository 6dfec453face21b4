"""LoRA fine-tuning (Hu et al., arXiv 2106.09685) through peft (``pip install 'vit5[peft]'``): adapters on
the ``targets`` linears of every block, the head trained in full (``modules_to_save``), everything else
frozen. The fused ``qkv`` gets one adapter, as peft does for every fused projection (the paper adapts
``W_q`` and ``W_v`` separately, Section 7.1): it needs no model change and merges exactly. ``best/`` and
``final/`` hold the merged plain ViT-5 weights (``merge_and_unload``), readable without peft.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import torch
from timm.utils import ModelEmaV3

from vit5 import ViT5
from vit5.model.config import ViT5Config

if TYPE_CHECKING:
    from peft import LoraConfig

    from vit5.train.config import LoraSection

# the names in model.lora.targets, and the module of every block they stand for
TARGETS = {"qkv": r"attn\.qkv", "proj": r"attn\.proj", "fc1": r"mlp\.fc1", "fc2": r"mlp\.fc2"}
HEAD = "head"


def check_lora(cfg: LoraSection, pretrained: str | None) -> list[str]:
    """The problems of ``model.lora`` (for :func:`vit5.train.config.validate_config`)."""
    if not cfg.enabled:
        return []
    problems = []
    unknown = [t for t in cfg.targets if t not in TARGETS]
    if unknown or not cfg.targets:
        problems.append(
            f"model.lora.targets={list(cfg.targets)}: give a non-empty list of {', '.join(TARGETS)} "
            f"(the linears of every block{'; not ' + ', '.join(unknown) if unknown else ''})"
        )
    if pretrained is None:
        problems.append(
            "model.lora.enabled=true freezes every pretrained weight, but model.pretrained is not set, so "
            "the frozen weights would stay random; set model.pretrained=... or model.lora.enabled=false"
        )
    if importlib.util.find_spec("peft") is None:
        problems.append(
            "model.lora.enabled=true needs the peft library, which is not installed: "
            "pip install 'vit5[peft]' (or pip install peft)"
        )
    return problems


def lora_config(cfg: LoraSection) -> LoraConfig:
    """The peft ``LoraConfig`` of ``model.lora``; the anchored pattern leaves out ``patch_embed.proj``."""
    from peft import LoraConfig

    modules = "|".join(TARGETS[t] for t in cfg.targets)
    return LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=rf"blocks\.\d+\.({modules})",  # a string: peft full-matches it to module names
        modules_to_save=[HEAD],
        bias="none",
    )


def add_lora(model: ViT5, cfg: LoraSection) -> ViT5:
    """Inject the adapters into ``model`` in place and freeze the rest; return ``model``."""
    from peft import get_peft_model

    get_peft_model(model, lora_config(cfg))  # the wrapper is not kept: the ViT5 inside is adapted in place
    return model


def merge_lora(state_dict: dict[str, torch.Tensor], model_cfg: ViT5Config, cfg: LoraSection) -> ViT5:
    """A plain :class:`~vit5.ViT5` (CPU) from an adapted model's ``state_dict``, adapters folded in."""
    from peft import get_peft_model

    shell = get_peft_model(ViT5(model_cfg), lora_config(cfg))
    shell.get_base_model().load_state_dict(state_dict)  # strict: the same adapters, names and shapes
    merged = shell.merge_and_unload()
    assert isinstance(merged, ViT5)
    return merged.eval()


def describe(model: torch.nn.Module, cfg: LoraSection) -> str:
    """``LoRA r=8 alpha=16 on qkv, proj, fc1, fc2 + full head: 1,234 of 5,678 parameters trained (21.7%)``;
    the total leaves out the head's frozen original, which peft keeps and the merge drops."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for name, p in model.named_parameters() if f"{HEAD}.original_module." not in name)
    return (
        f"LoRA r={cfg.r} alpha={cfg.alpha:g} on {', '.join(cfg.targets)} + full head: "
        f"{trainable:,} of {total:,} parameters trained ({100 * trainable / total:.1f}%)"
    )


def merged_for_export(
    model: ViT5, ema: ModelEmaV3 | None, cfg: LoraSection
) -> tuple[ViT5, ModelEmaV3 | None]:
    """The raw and EMA weights of an adapted run as plain ViT-5 models (for ``best/`` and ``final/``)."""
    merged = merge_lora(model.state_dict(), model.cfg, cfg)
    if ema is None:
        return merged, None
    return merged, ModelEmaV3(merge_lora(ema.module.state_dict(), model.cfg, cfg), decay=ema.decay)
