"""Parameter-efficient fine-tuning: LoRA adapters through the peft library (``pip install 'vit5[peft]'``).

LoRA (Hu et al., arXiv 2106.09685) freezes a pretrained weight ``W`` and trains a low-rank update:
``W x + (alpha / r) B A x`` with ``A: r x in`` (random) and ``B: out x r`` (zeros, so training starts
from the pretrained model). ``model.lora`` puts adapters on the linears named in ``targets`` of every
block: ``qkv`` and ``proj`` (attention), ``fc1`` and ``fc2`` (MLP; with SwiGLU ``fc1`` is the packed
gate and up projection). The head is trained in full (peft ``modules_to_save``): a fine-tune on
another data set starts a new head, which has nothing pretrained to adapt. Everything else (patch
embedding, tokens, position embedding, norms, LayerScale) stays frozen.

**The fused qkv.** ViT-5 computes queries, keys and values with one ``Linear(dim, 3 dim)`` (GQA:
``(H + 2 H_kv) d`` outputs), as timm's ViTs do. peft adapts it as any linear: one adapter ``B A`` on
the fused matrix ``[W_q; W_k; W_v]``, its ``A`` (``r x dim``) shared by q, k and v and the rows of
its ``B`` (``3 dim x r``) split between them. The paper adapts ``W_q`` and ``W_v`` with separate
rank-``r`` pairs (Section 7.1); separate pairs on q, k and v would have the same ``B`` and three
times the ``A``, and updates of rank up to ``3 r`` in all instead of ``r``. The fused adapter is
kept: it is what peft does with every fused projection (timm ViTs, CLIP's ``in_proj``), it needs
no change of the model, and it merges exactly into the one fused weight.

**Training**: :func:`add_lora` injects the adapters in place (``peft.get_peft_model``): the module
stays a :class:`~vit5.ViT5`, its parameter names gain ``.base_layer`` / ``.lora_A.default`` /
``.lora_B.default`` (the head: ``head.modules_to_save.default``), and only the adapters and the head
require gradients, so the optimizer (which skips frozen parameters), the EMA, layer decay (the block
indices are unchanged) and the training checkpoints work as for a full fine-tune; ``--resume``
restores the adapters with the rest.

**Export**: ``best/`` and ``final/`` are plain ViT-5 checkpoints. :func:`merge_lora` loads the
adapted weights into a fresh adapted copy and calls peft's ``merge_and_unload``, which folds every
``B A`` into its ``W`` and keeps the trained head: ``vit5.load_model``, ``vit5 eval`` and
``vit5 export`` read the result without peft installed.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

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
    """The peft ``LoraConfig`` of ``model.lora``: adapters on ``blocks.<i>.<target>``, the head trained
    in full. The pattern is anchored: the patch embedding's ``patch_embed.proj`` is not a target."""
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
    """A plain :class:`~vit5.ViT5` (on the CPU) from the ``state_dict`` of an adapted model: every
    adapter folded into its weight, the trained head kept (peft ``merge_and_unload``)."""
    from peft import get_peft_model

    shell = get_peft_model(ViT5(model_cfg), lora_config(cfg))
    shell.get_base_model().load_state_dict(state_dict)  # strict: the same adapters, names and shapes
    merged = shell.merge_and_unload()
    assert isinstance(merged, ViT5)
    return merged.eval()


def trainable_summary(model: torch.nn.Module) -> dict[str, Any]:
    """How many parameters an adapted model trains: ``{"trainable", "total", "fraction"}``; ``total``
    counts every parameter (the adapters too) except the head's frozen original, which peft keeps
    next to the trained copy and the merge drops."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for name, p in model.named_parameters() if f"{HEAD}.original_module." not in name)
    return dict(trainable=trainable, total=total, fraction=trainable / total)


def describe(model: torch.nn.Module, cfg: LoraSection) -> str:
    """``LoRA r=8 alpha=16 on qkv, proj, fc1, fc2 + full head: 1,234 of 5,678 parameters trained (21.7%)``."""
    counts = trainable_summary(model)
    return (
        f"LoRA r={cfg.r} alpha={cfg.alpha:g} on {', '.join(cfg.targets)} + full head: "
        f"{counts['trainable']:,} of {counts['total']:,} parameters trained ({100 * counts['fraction']:.1f}%)"
    )


def merged_for_export(
    model: ViT5, ema: ModelEmaV3 | None, cfg: LoraSection
) -> tuple[ViT5, ModelEmaV3 | None]:
    """The raw and EMA weights of an adapted run as plain ViT-5 models, for ``best/`` and ``final/``
    (:func:`vit5.train.checkpointing.save_model_dir`); the training model is not touched."""
    merged = merge_lora(model.state_dict(), model.cfg, cfg)
    if ema is None:
        return merged, None
    return merged, ModelEmaV3(merge_lora(ema.module.state_dict(), model.cfg, cfg), decay=ema.decay)
