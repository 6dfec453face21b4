"""Semantic checks of a :class:`~vit5.train.config.TrainConfig`, run before any work starts.

Every problem is collected and reported at once, each with its fix: a value out of range, a model
preset or timm optimizer that does not exist, model overrides that do not form a valid
``ViT5Config``, combinations that cannot work (an odd batch under Mixup, smoothed BCE targets that
a threshold turns into all ones) and data / checkpoint paths that do not exist.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import vit5
from vit5.model.footprint import check_size
from vit5.train.config import TrainConfig
from vit5.train.errors import TrainConfigError


def validate_config(cfg: TrainConfig, check_paths: bool = True) -> None:
    """Check ranges, names, combinations and (optionally) paths; raise one error listing all."""
    problems: list[str] = []
    for check in _CHECKS:
        problems.extend(check(cfg))
    if check_paths:
        problems.extend(_check_paths(cfg))
    if problems:
        raise TrainConfigError("invalid training config:\n  - " + "\n  - ".join(problems))


def _ranges(cfg: TrainConfig) -> list[str]:
    rules: list[tuple[str, Any, Callable[[Any], bool], str]] = [
        ("model.img_size", cfg.model.img_size, lambda v: v > 0, "> 0"),
        ("model.num_classes", cfg.model.num_classes, lambda v: v is None or v >= 1, ">= 1 or null"),
        ("model.drop_path_rate", cfg.model.drop_path_rate, lambda v: 0 <= v < 1, "in [0, 1)"),
        ("model.max_params", cfg.model.max_params, lambda v: v > 0, "> 0"),
        ("data.batch_size", cfg.data.batch_size, lambda v: v >= 1, ">= 1"),
        ("data.eval_batch_size", cfg.data.eval_batch_size, lambda v: v is None or v >= 1, ">= 1 or null"),
        ("data.num_workers", cfg.data.num_workers, lambda v: v >= 0, ">= 0"),
        ("data.digits_val_fraction", cfg.data.digits_val_fraction, lambda v: 0 < v < 1, "in (0, 1)"),
        ("aug.color_jitter", cfg.aug.color_jitter, lambda v: v >= 0, ">= 0"),
        ("aug.scale", cfg.aug.scale, lambda v: 0 < v[0] <= v[1] <= 1, "0 < min <= max <= 1"),
        ("aug.hflip", cfg.aug.hflip, lambda v: 0 <= v <= 1, "a probability in [0, 1]"),
        ("aug.eval_crop_ratio", cfg.aug.eval_crop_ratio, lambda v: 0 < v <= 1, "in (0, 1]"),
        ("aug.repeated_aug", cfg.aug.repeated_aug, lambda v: v >= 1, ">= 1 (1 = off)"),
        ("aug.ra_selected_round", cfg.aug.ra_selected_round, lambda v: v >= 0, ">= 0"),
        ("aug.mixup", cfg.aug.mixup, lambda v: v >= 0, ">= 0 (0 = off)"),
        ("aug.cutmix", cfg.aug.cutmix, lambda v: v >= 0, ">= 0 (0 = off)"),
        ("aug.mixup_prob", cfg.aug.mixup_prob, lambda v: 0 <= v <= 1, "a probability in [0, 1]"),
        (
            "aug.mixup_switch_prob",
            cfg.aug.mixup_switch_prob,
            lambda v: 0 <= v <= 1,
            "a probability in [0, 1]",
        ),
        ("loss.smoothing", cfg.loss.smoothing, lambda v: 0 <= v < 1, "in [0, 1)"),
        ("optim.lr", cfg.optim.lr, lambda v: v > 0, "> 0"),
        ("optim.lr_base_batch", cfg.optim.lr_base_batch, lambda v: v is None or v >= 1, ">= 1 or null"),
        ("optim.weight_decay", cfg.optim.weight_decay, lambda v: v >= 0, ">= 0"),
        ("optim.eps", cfg.optim.eps, lambda v: v > 0, "> 0"),
        ("optim.betas", cfg.optim.betas, lambda v: all(0 <= b < 1 for b in v), "each in [0, 1)"),
        ("optim.layer_decay", cfg.optim.layer_decay, lambda v: v is None or 0 < v <= 1, "in (0, 1] or null"),
        ("optim.clip_grad", cfg.optim.clip_grad, lambda v: v is None or v > 0, "> 0 or null"),
        ("optim.accum_steps", cfg.optim.accum_steps, lambda v: v >= 1, ">= 1"),
        ("schedule.epochs", cfg.schedule.epochs, lambda v: v >= 1, ">= 1"),
        (
            "schedule.warmup_epochs",
            cfg.schedule.warmup_epochs,
            lambda v: 0 <= v < cfg.schedule.epochs,
            "in [0, schedule.epochs)",
        ),
        ("schedule.warmup_lr", cfg.schedule.warmup_lr, lambda v: v >= 0, ">= 0"),
        ("schedule.min_lr", cfg.schedule.min_lr, lambda v: v >= 0, ">= 0"),
        ("ema.decay", cfg.ema.decay, lambda v: 0 < v < 1, "in (0, 1)"),
        (
            "checkpoint.every_steps",
            cfg.checkpoint.every_steps,
            lambda v: v >= 0,
            ">= 0 (0 = epoch ends only)",
        ),
        ("checkpoint.every_epochs", cfg.checkpoint.every_epochs, lambda v: v >= 1, ">= 1"),
        ("checkpoint.keep_last", cfg.checkpoint.keep_last, lambda v: v >= 1, ">= 1"),
        ("run.eval_every_epochs", cfg.run.eval_every_epochs, lambda v: v >= 1, ">= 1"),
    ]
    return [f"{key}={value!r} must be {rule}" for key, value, ok, rule in rules if not ok(value)]


def _names(cfg: TrainConfig) -> list[str]:
    from timm.optim import list_optimizers

    problems = []
    presets = vit5.list_presets()
    if cfg.model.name not in presets:
        close = difflib.get_close_matches(cfg.model.name, presets, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        problems.append(f"model.name={cfg.model.name!r} is not a preset; {hint}presets: {', '.join(presets)}")
    else:
        problems.extend(_model_overrides(cfg))
    optimizers = list_optimizers()
    if cfg.optim.name not in optimizers:
        close = difflib.get_close_matches(cfg.optim.name, optimizers, n=3)
        problems.append(
            f"optim.name={cfg.optim.name!r} is not a timm optimizer (closest: {', '.join(close) or 'none'}); "
            f"this recipe uses 'lamb' for pre-training and 'adamw' for fine-tuning"
        )
    if not cfg.aug.randaug.startswith("rand-"):
        problems.append(
            f"aug.randaug={cfg.aug.randaug!r} must be a timm RandAugment string like 'rand-m9-mstd0.5-inc1'"
        )
    if not cfg.run.name or "/" in cfg.run.name or cfg.run.name in (".", ".."):
        problems.append(
            f"run.name={cfg.run.name!r} must be a plain folder name (the run goes to run.output_dir/run.name)"
        )
    return problems


def _model_overrides(cfg: TrainConfig) -> list[str]:
    taken = {"img_size", "drop_path_rate", "num_classes"} & set(cfg.model.overrides)
    if taken:
        return [f"model.overrides.{k} duplicates model.{k}; set model.{k} instead" for k in sorted(taken)]
    try:
        model_cfg = vit5.preset_config(
            cfg.model.name,
            img_size=cfg.model.img_size,
            drop_path_rate=cfg.model.drop_path_rate,
            **cfg.model.overrides,
        )
        if cfg.model.pretrained is None:  # a checkpoint's own size is checked when it is read
            check_size(
                model_cfg.replace(num_classes=cfg.model.num_classes or 0), cfg.model.max_params, "the config"
            )
    except (vit5.ConfigError, TypeError, ValueError) as e:
        return [
            f"model (preset {cfg.model.name} with img_size={cfg.model.img_size}, "
            f"overrides={cfg.model.overrides}): {e}"
        ]
    return []


def _combinations(cfg: TrainConfig) -> list[str]:
    problems = []
    if cfg.aug.mixing and cfg.data.batch_size % 2:
        problems.append(
            f"data.batch_size={cfg.data.batch_size} is odd, but timm Mixup/CutMix needs an even batch per "
            f"process; use an even batch size or switch mixing off (aug.mixup=0 aug.cutmix=0)"
        )
    threshold = cfg.loss.bce_target_threshold
    if (
        cfg.loss.name == "bce"
        and cfg.loss.smoothing > 0
        and threshold is not None
        and threshold < cfg.loss.smoothing
    ):
        problems.append(
            f"loss.smoothing={cfg.loss.smoothing} gives every class a target > "
            f"loss.bce_target_threshold={threshold}, so binarising makes all targets 1; "
            f"set loss.smoothing=0 (official) or loss.bce_target_threshold=null"
        )
    if cfg.data.dataset == "folder" and cfg.data.root is None:
        problems.append(
            "data.root is not set: pass data.root=/path/to/dataset "
            "(holding train/<class>/*.jpg and val/<class>/*.jpg), "
            "or data.dataset=digits for the built-in digits"
        )
    if isinstance(cfg.model.compile, str) and cfg.model.compile != "regional":
        problems.append(
            f"model.compile={cfg.model.compile} is not a choice: use true (torch.compile the whole model), "
            "regional (compile one block, shared by all: faster first step) or false"
        )
    if cfg.model.compile and cfg.model.grad_checkpointing:
        problems.append("model.compile and model.grad_checkpointing together are not supported; pick one")
    return problems


def _check_paths(cfg: TrainConfig) -> list[str]:
    problems = []
    if cfg.data.dataset == "folder" and cfg.data.root is not None:
        root = Path(cfg.data.root).expanduser()
        if not root.is_dir():
            problems.append(f"data.root={cfg.data.root} does not exist or is not a folder; check the path")
        else:
            for key, split in (
                ("data.train_split", cfg.data.train_split),
                ("data.val_split", cfg.data.val_split),
            ):
                if not (root / split).is_dir():
                    found = sorted(
                        p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
                    )
                    problems.append(
                        f"{key}={split!r}: {root / split} does not exist (sub-folders of {root}: {found}); "
                        f"set {key} or fix data.root"
                    )
    if cfg.model.pretrained is not None and not Path(cfg.model.pretrained).expanduser().exists():
        problems.append(f"model.pretrained={cfg.model.pretrained} does not exist; check the path")
    return problems


_CHECKS: tuple[Callable[[TrainConfig], list[str]], ...] = (_ranges, _names, _combinations)
