"""Start from pretrained weights: an official ViT-5 ``.pth``, a timm ``deit3_*`` / ``vit_*`` state
dict, or one of our runs (a ``final/`` or ``best/`` directory).

Loading goes through :func:`vit5.create_model` and is strict except for the two deliberate,
reported changes of the official fine-tune recipe (reference §3.2): a **new head** when the
checkpoint's head does not fit the data's number of classes (``model.new_head``), and the
**position embedding resampled** (bicubic) when ``model.img_size`` differs. With
``model.new_head=false`` a head of the wrong size is an error that says how to fix it.
"""

from __future__ import annotations

from pathlib import Path

import vit5
from vit5 import ViT5
from vit5.model.convert import HeadMismatchError
from vit5.train.config import ModelSection
from vit5.train.errors import TrainConfigError


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
