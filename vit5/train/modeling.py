"""The model of a run: a fresh preset, or pretrained weights (released, ``hf-hub:``, an official
``.pth``, a timm file, one of our runs) loaded strictly except for the official fine-tune recipe's two
reported changes (main.py ``--finetune``, github.com/wangf3014/ViT-5): a new head when the classes
differ (``model.new_head``) and the position embedding resampled for another ``model.img_size``.
"""

from __future__ import annotations

import os
from pathlib import Path

import vit5
from vit5 import ViT5, create_model
from vit5.model.presets import closest_preset
from vit5.train.config import ModelSection
from vit5.train.errors import TrainConfigError
from vit5.weights import hub
from vit5.weights.checkpoint import CONFIG_NAME, checkpoint_dir
from vit5.weights.convert import HeadMismatchError

PRETRAINED_TRUE = ("true", "True")  # model.pretrained=true (YAML true reaches the str field as "True")


def build_model(cfg: ModelSection, num_classes: int) -> tuple[ViT5, str, str | None]:
    """The model for ``num_classes``, a one-line description, and the load report when fine-tuning."""
    if cfg.num_classes is not None and cfg.num_classes != num_classes:
        raise TrainConfigError(
            f"model.num_classes={cfg.num_classes} but the data has {num_classes} classes; "
            f"remove model.num_classes (it defaults to the data's) or set it to {num_classes}"
        )
    report, arch = None, cfg.name
    if cfg.pretrained is not None:
        model, report = load_pretrained(cfg, num_classes)
        arch = closest_preset(model.cfg)
    else:
        sizes = dict(cfg.overrides, img_size=cfg.img_size, drop_path_rate=cfg.drop_path_rate)
        model = create_model(cfg.name, num_classes=num_classes, max_params=cfg.max_params, **sizes)
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    params = sum(p.numel() for p in model.parameters())
    origin = "fine-tuned" if cfg.pretrained is not None else "from scratch"
    changed = ", ".join(f"{key}={value}" for key, value in cfg.overrides.items())  # differs from the preset
    name = f"{arch} [{changed}]" if changed else arch
    description = f"{name} {origin} ({params / 1e6:.2f}M parameters, {num_classes} classes, {cfg.img_size}px)"
    return model, description, report


def pretrained_source(cfg: ModelSection) -> tuple[str, str | os.PathLike[str] | bool, str]:
    """``(preset to build, weights for vit5.create_model, note)`` of ``model.pretrained``: released
    weights build their own architecture (the note says when it is not ``model.name``); a path is
    read as ``model.name``."""
    text = str(cfg.pretrained)
    if text in PRETRAINED_TRUE:
        release = hub.default_release(cfg.name)
        if release is None:
            raise TrainConfigError(
                f"model.pretrained=true: {cfg.name} has no released weights (released: "
                f"{', '.join(hub.RELEASES)}); name one of them, or give a checkpoint path"
            )
        return cfg.name, release.name, ""
    if text.startswith(hub.HF_HUB_PREFIX):
        return cfg.name, text, ""
    path = Path(text).expanduser()
    if hub.is_weights_name(text) and not path.exists():
        try:
            release = hub.release(text)
        except vit5.CheckpointError as e:
            raise TrainConfigError(f"model.pretrained={text}: {e}") from e
        same = _same_architecture(vit5.preset_config(release.arch), cfg.name)
        return release.arch, text, "" if same else f"{release.arch} (its weights), not model.name={cfg.name}"
    return cfg.name, path, ""


def load_pretrained(cfg: ModelSection, num_classes: int) -> tuple[ViT5, str]:
    """The model ``cfg.pretrained`` holds for ``num_classes``, and a report of what was loaded and reset."""
    name, weights, note = pretrained_source(cfg)
    overrides = dict(cfg.overrides, img_size=cfg.img_size, drop_path_rate=cfg.drop_path_rate)
    if cfg.new_head:
        overrides["num_classes"] = num_classes
    options = dict(use_ema=cfg.pretrained_ema, max_params=cfg.max_params, log_report=False)
    directory = checkpoint_dir(weights) if isinstance(weights, Path) else None
    try:
        if directory is not None and (directory / CONFIG_NAME).is_file():
            # our run or checkpoint directory: its config.json holds the architecture it was trained as
            model = vit5.load_model(directory, **options, **overrides)
            if not _same_architecture(model.cfg, cfg.name):
                built = closest_preset(model.cfg)
                note = f"{built} as in {directory / CONFIG_NAME}, not model.name={cfg.name}"
        else:
            model = vit5.create_model(name, pretrained=weights, **options, **overrides)
    except (vit5.CheckpointError, vit5.ConfigError) as e:
        hint = f"\nIn the training config, model.new_head=true starts a new {num_classes}-class head."
        hint = hint if isinstance(e, HeadMismatchError) else ""
        raise TrainConfigError(f"model.pretrained={cfg.pretrained}: {e}{hint}") from e
    if model.num_classes != num_classes:
        raise TrainConfigError(
            f"model.pretrained={cfg.pretrained} has a {model.num_classes}-class head but the data has "
            f"{num_classes} classes. Set model.new_head=true to fine-tune with a new {num_classes}-class "
            f"head, or train on data with {model.num_classes} classes."
        )
    weights_word = "EMA weights" if cfg.pretrained_ema else "weights"
    lines = [f"{weights_word}: {model.load_report}"]
    if note:
        lines.append(f"  architecture: {note}")
    lines.append(
        f"  new {num_classes}-class head (the checkpoint's head has another size)"
        if model.load_report.reset
        else f"  head kept: it already has {num_classes} classes"
    )
    return model, "\n".join(lines)


_SHAPE_FIELDS = ("embed_dim", "depth", "num_heads", "patch_size", "norm", "qkv_bias", "qk_norm", "rope")


def _same_architecture(built: vit5.ViT5Config, name: str) -> bool:
    """Whether ``built`` is the architecture of preset ``name`` (sizes and the ViT-5 switches)."""
    named = vit5.preset_config(name)
    return all(getattr(built, f) == getattr(named, f) for f in (*_SHAPE_FIELDS, "num_registers"))
