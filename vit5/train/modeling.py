"""The model of a run: a fresh preset, or pretrained weights, sized for the data.

Pretrained weights: an official ViT-5 ``.pth``, a timm ``deit3_*`` / ``vit_*`` state dict, or one of
our runs (a ``final/`` or ``best/`` directory). Loading goes through :func:`vit5.create_model` and is
strict except for the two deliberate, reported changes of the official fine-tune recipe (main.py's
``--finetune`` branch, github.com/wangf3014/ViT-5 at commit b7b0796): a **new head** when the
checkpoint's head does not fit the data's number of classes (``model.new_head``), and the
**position embedding resampled** (bicubic) when ``model.img_size`` differs. With
``model.new_head=false`` a head of the wrong size is an error that says how to fix it.
"""

from __future__ import annotations

from pathlib import Path

import vit5
from vit5 import ViT5, create_model
from vit5.train.config import ModelSection
from vit5.train.errors import TrainConfigError
from vit5.weights.convert import HeadMismatchError


def build_model(cfg: ModelSection, num_classes: int) -> tuple[ViT5, str, str | None]:
    """The model for ``num_classes``, a one-line description, and the load report when fine-tuning."""
    if cfg.num_classes is not None and cfg.num_classes != num_classes:
        raise TrainConfigError(
            f"model.num_classes={cfg.num_classes} but the data has {num_classes} classes; "
            f"remove model.num_classes (it defaults to the data's) or set it to {num_classes}"
        )
    report = None
    if cfg.pretrained is not None:
        model, report = load_pretrained(cfg, num_classes)
    else:
        model = create_model(
            cfg.name,
            img_size=cfg.img_size,
            num_classes=num_classes,
            drop_path_rate=cfg.drop_path_rate,
            max_params=cfg.max_params,
            **cfg.overrides,
        )
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    params = sum(p.numel() for p in model.parameters())
    origin = "fine-tuned" if cfg.pretrained is not None else "from scratch"
    changed = ", ".join(
        f"{key}={value}" for key, value in cfg.overrides.items()
    )  # what differs from the preset
    name = f"{cfg.name} [{changed}]" if changed else cfg.name
    description = f"{name} {origin} ({params / 1e6:.2f}M parameters, {num_classes} classes, {cfg.img_size}px)"
    return model, description, report


def load_pretrained(cfg: ModelSection, num_classes: int) -> tuple[ViT5, str]:
    """Build ``cfg.name`` from ``cfg.pretrained`` for ``num_classes``; return the model and a
    report of what was loaded, reset and resampled."""
    overrides = dict(cfg.overrides, img_size=cfg.img_size, drop_path_rate=cfg.drop_path_rate)
    if cfg.new_head:
        overrides["num_classes"] = num_classes
    try:
        model = vit5.create_model(
            cfg.name,
            pretrained=Path(str(cfg.pretrained)).expanduser(),
            use_ema=cfg.pretrained_ema,
            max_params=cfg.max_params,
            log_report=False,  # the report is returned and printed once by the main process
            **overrides,
        )
    except vit5.CheckpointError as e:
        hint = (
            f"\nIn the training config, model.new_head=true starts a new {num_classes}-class head."
            if isinstance(e, HeadMismatchError)
            else ""
        )
        raise TrainConfigError(f"model.pretrained={cfg.pretrained}: {e}{hint}") from e
    if model.num_classes != num_classes:
        raise TrainConfigError(
            f"model.pretrained={cfg.pretrained} has a {model.num_classes}-class head but the data has "
            f"{num_classes} classes. Set model.new_head=true to fine-tune with a new {num_classes}-class "
            f"head, or train on data with {model.num_classes} classes."
        )
    weights = "EMA weights" if cfg.pretrained_ema else "weights"
    lines = [f"{weights}: {model.load_report}"]
    lines.append(
        f"  new {num_classes}-class head (the checkpoint's head has another size)"
        if model.load_report.reset
        else f"  head kept: it already has {num_classes} classes"
    )
    return model, "\n".join(lines)
