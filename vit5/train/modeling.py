"""The model of a run: a fresh preset or pretrained weights, sized for the data."""

from __future__ import annotations

from vit5 import ViT5, create_model
from vit5.train.config import ModelSection
from vit5.train.errors import TrainConfigError
from vit5.train.finetune import load_pretrained


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
    description = (
        f"{cfg.name} {origin} ({params / 1e6:.2f}M parameters, {num_classes} classes, {cfg.img_size}px)"
    )
    return model, description, report
