"""The model of a run: a preset, or pretrained weights loaded strictly but for the official fine-tune's
two changes (main.py ``--finetune``, github.com/wangf3014/ViT-5): a new head for other classes, the
position embedding resampled (both by :func:`vit5.create_model`). LoRA (arXiv 2106.09685) through peft:
one adapter on the fused ``qkv``, as peft does (the paper adapts ``W_q``, ``W_v``, Section 7.1);
``best/`` / ``final/`` hold the merged weights."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from timm.utils import ModelEmaV3

import vit5
from vit5 import ViT5
from vit5.model.presets import closest_preset
from vit5.train.config import LORA_TARGETS, LoraSection, ModelSection, pretrained_kind
from vit5.train.errors import TrainConfigError
from vit5.weights.checkpoint import CONFIG_NAME, checkpoint_dir
from vit5.weights.convert import HeadMismatchError, OverrideMismatchError

if TYPE_CHECKING:
    from peft import LoraConfig


def build_model(cfg: ModelSection, num_classes: int) -> tuple[ViT5, str, str | None]:
    """The model for ``num_classes``, a one-line description, and the load report when fine-tuning."""
    if cfg.num_classes is not None and cfg.num_classes != num_classes:
        raise TrainConfigError(
            f"model.num_classes={cfg.num_classes} but the data has {num_classes} classes; "
            f"remove model.num_classes (it defaults to the data's) or set it to {num_classes}"
        )
    report = None
    arch = cfg.name
    if cfg.pretrained is not None:
        model, report = load_pretrained(cfg, num_classes)
        arch = closest_preset(model.cfg)
    else:
        sizes = dict(cfg.overrides, img_size=cfg.img_size, drop_path_rate=cfg.drop_path_rate)
        model = vit5.create_model(
            cfg.name, num_classes=num_classes, max_params=cfg.max_params, **sizes
        )
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    params = sum(p.numel() for p in model.parameters())
    origin = "fine-tuned" if cfg.pretrained is not None else "from scratch"
    # what differs from the preset
    changed = ", ".join(f"{key}={value}" for key, value in cfg.overrides.items())
    name = f"{arch} [{changed}]" if changed else arch
    size = f"{num_classes} classes, {cfg.img_size}px"
    return model, f"{name} {origin} ({params / 1e6:.2f}M parameters, {size})", report


def describe_given(model: ViT5) -> str:
    """The one-line description of a model handed to the trainer (not built from ``model``)."""
    params = sum(p.numel() for p in model.parameters())
    size = "x".join(str(n) for n in model.cfg.img_size)
    return (
        f"{closest_preset(model.cfg)} given ({params / 1e6:.2f}M parameters, "
        f"{model.num_classes} classes, {size}px)"
    )


def load_pretrained(cfg: ModelSection, num_classes: int) -> tuple[ViT5, str]:
    """The model ``cfg.pretrained`` holds for ``num_classes``, and a report of what was loaded and
    reset. Released weights build their own architecture, our run folder the one its config.json
    holds; the report says when that is not ``model.name``."""
    text = str(cfg.pretrained)
    kind = pretrained_kind(text)
    sizes = dict(cfg.overrides, img_size=cfg.img_size, drop_path_rate=cfg.drop_path_rate)
    if cfg.new_head:
        sizes["num_classes"] = num_classes
    options = dict(sizes, use_ema=cfg.pretrained_ema, max_params=cfg.max_params, log_report=False)
    path = Path(text).expanduser()
    folder = checkpoint_dir(path) if kind == "path" else None
    try:
        if folder is not None and (folder / CONFIG_NAME).is_file():
            model = vit5.load_model(folder, **options)
        elif kind == "release":
            model = vit5.create_model(text, pretrained=True, **options)
        else:
            weights = path if kind == "path" else (True if kind == "true" else text)
            model = vit5.create_model(cfg.name, pretrained=weights, **options)
    except (vit5.CheckpointError, vit5.ConfigError) as e:
        hint = ""
        if isinstance(e, HeadMismatchError):
            hint = f"\nIn the training config, model.new_head=true starts a new {num_classes}-class head."
        if isinstance(e, OverrideMismatchError):  # the recipe's or the command line's overrides
            hint = f"\nIn the training config, set {e.dotlist('model.overrides.')} to fit these weights."
        raise TrainConfigError(f"model.pretrained={cfg.pretrained}: {e}{hint}") from e
    if model.num_classes != num_classes:
        raise TrainConfigError(
            f"model.pretrained={cfg.pretrained} has a {model.num_classes}-class head but the data "
            f"has {num_classes} classes. Set model.new_head=true to fine-tune with a new "
            f"{num_classes}-class head, or train on data with {model.num_classes} classes."
        )
    weights_word = "EMA weights" if cfg.pretrained_ema else "weights"
    lines = [f"{weights_word}: {model.load_report}"]
    named = vit5.preset_config(cfg.name, **cfg.overrides)
    if any(getattr(model.cfg, f) != getattr(named, f) for f in _ARCH):
        held = f"as in {folder / CONFIG_NAME}" if folder is not None else "(its weights)"
        built = closest_preset(model.cfg)
        lines.append(f"  architecture: {built} {held}, not model.name={cfg.name}")
    if model.load_report.reset:
        lines.append(f"  new {num_classes}-class head (the checkpoint's head has another size)")
    else:
        lines.append(f"  head kept: it already has {num_classes} classes")
    return model, "\n".join(lines)


# the sizes and the ViT-5 switches that make another architecture than model.name
_ARCH = "embed_dim depth num_heads patch_size norm qkv_bias qk_norm rope num_registers".split()


# ---------------------------------------------------------------------------------- LoRA
def lora_config(cfg: LoraSection) -> LoraConfig:
    """The peft ``LoraConfig`` of ``model.lora``; the anchored pattern leaves out ``patch_embed.proj``."""
    from peft import LoraConfig

    modules = "|".join(LORA_TARGETS[t] for t in cfg.targets)
    return LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=rf"blocks\.\d+\.({modules})",  # a string: peft full-matches it to module names
        modules_to_save=["head"],
        bias="none",
    )


def add_lora(model: ViT5, cfg: LoraSection) -> ViT5:
    """Inject the adapters into ``model`` in place and freeze the rest; return ``model``."""
    from peft import get_peft_model

    get_peft_model(model, lora_config(cfg))  # the wrapper is not kept: the ViT5 inside is adapted
    return model


def describe(model: torch.nn.Module, cfg: LoraSection) -> str:
    """``LoRA r=8 alpha=16 on qkv, proj, fc1, fc2 + full head: 1,234 of 5,678 parameters trained
    (21.7%)``; the total leaves out the head's frozen original, which peft keeps and the merge drops."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    named = model.named_parameters()
    total = sum(p.numel() for name, p in named if "head.original_module." not in name)
    return (
        f"LoRA r={cfg.r} alpha={cfg.alpha:g} on {', '.join(cfg.targets)} + full head: "
        f"{trainable:,} of {total:,} parameters trained ({100 * trainable / total:.1f}%)"
    )


def merged_for_export(
    model: ViT5, ema: ModelEmaV3 | None, cfg: LoraSection
) -> tuple[ViT5, ModelEmaV3 | None]:
    """The raw and EMA weights of an adapted run as plain CPU ViT-5 models, the adapters folded in."""
    from peft import get_peft_model

    def merged(module: torch.nn.Module) -> ViT5:
        shell = get_peft_model(ViT5(model.cfg), lora_config(cfg))
        # strict: the same adapters and shapes
        shell.get_base_model().load_state_dict(module.state_dict())
        return shell.merge_and_unload().eval()

    merged_ema = ModelEmaV3(merged(ema.module), decay=ema.decay) if ema is not None else None
    return merged(model), merged_ema
