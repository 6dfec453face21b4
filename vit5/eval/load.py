"""Turn a model spec into the model(s) to evaluate, with their preprocessing.

Spec forms::

    runs/exp/checkpoint              our checkpoint directory; raw weights, plus EMA when it has them
    vit5_small_patch16_224.pth       an official ViT-5 .pth (architecture inferred, vit5.load_model)
    vit5_tiny                        a vit5 preset with random weights (baselines, tests)
    vit5_small@weights.pth           a vit5 preset with weights from any supported checkpoint
    timm:vit_small_patch16_224@w.safetensors   a timm model and a local checkpoint (strict)

Nothing is downloaded. timm models are built with ``dynamic_img_size=True`` when they accept it,
so any patch-multiple input size works as it does for vit5 models.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from torch import nn

from ..model import PRESETS, CheckpointError, ConfigError, create_model, load_model
from .errors import EvalError

TIMM_PREFIX = "timm:"
EMA_FILE = "model_ema.safetensors"
WeightChoice = Literal["auto", "raw", "ema"]
GENERIC_DIRS = frozenset({"final", "best", "last", "latest", "model"})


@dataclass
class LoadedModel:
    """A model in eval mode and what evaluating it needs."""

    model: nn.Module
    label: str  # short name for tables, figures and file names
    spec: str
    weights: Literal["raw", "ema", "random"]
    input_size: tuple[int, int]  # the size it was built for
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    crop_pct: float


def load_models(spec: str, weights: WeightChoice = "auto", **overrides: Any) -> list[LoadedModel]:
    """The models a spec names: ``weights="auto"`` gives raw and EMA weights when a checkpoint
    directory holds both (an official ``.pth`` needs ``"ema"`` to pick its ``model_ema``).
    ``overrides`` are ViT5Config fields for vit5 models, ``timm.create_model`` arguments for timm."""
    if weights not in ("auto", "raw", "ema"):
        raise EvalError(f"weights must be 'auto', 'raw' or 'ema', got {weights!r}")
    try:
        if spec.startswith(TIMM_PREFIX):
            return [_timm(spec, weights, overrides)]
        name, _, checkpoint = spec.partition("@")
        if name in PRESETS:
            if weights == "ema" and not checkpoint:
                raise EvalError(f"{spec} has no weights, so no EMA weights; add @CHECKPOINT")
            model = create_model(name, pretrained=checkpoint or None, use_ema=weights == "ema", **overrides)
            kind = ("ema" if weights == "ema" else "raw") if checkpoint else "random"
            return [_finish(model, name + ("-ema" if kind == "ema" else ""), spec, kind)]
        path = Path(spec)
        if not path.exists():
            close = [p for p in PRESETS if p.startswith(name.split("_")[0])][:4]
            raise EvalError(
                f"model {spec!r} is neither an existing checkpoint path nor a vit5 preset "
                f"({', '.join(close) or ', '.join(sorted(PRESETS)[:4])}, ...); timm models are written {TIMM_PREFIX}NAME@CHECKPOINT"
            )
        both = weights == "auto" and path.is_dir() and (path / EMA_FILE).exists()
        kinds = ["raw", "ema"] if both else ["ema" if weights == "ema" else "raw"]
        label = path.stem if path.is_file() else _directory_label(Path(os.path.abspath(path)))
        return [
            _finish(load_model(path, use_ema=kind == "ema", **overrides), label + ("-ema" if kind == "ema" else ""), spec, kind)
            for kind in kinds
        ]
    except (CheckpointError, ConfigError) as err:
        raise EvalError(f"cannot load {spec}: {err}") from err


def _directory_label(path: Path) -> str:
    """``runs/demo/final`` -> ``demo-final``: training runs name their model folders generically."""
    return f"{path.parent.name}-{path.name}" if path.name in GENERIC_DIRS or path.name.startswith("checkpoint") else path.name


def distinct_labels(models: list[LoadedModel]) -> list[LoadedModel]:
    """Suffix repeated labels (``vit5_tiny``, ``vit5_tiny-2``) so tables and file names keep models apart."""
    seen: dict[str, int] = {}
    for m in models:
        seen[m.label] = seen.get(m.label, 0) + 1
        if seen[m.label] > 1:
            m.label = f"{m.label}-{seen[m.label]}"
    return models


def _timm(spec: str, weights: WeightChoice, overrides: dict[str, Any]) -> LoadedModel:
    import timm
    from timm.models import load_checkpoint

    name, _, checkpoint = spec[len(TIMM_PREFIX) :].partition("@")
    if not timm.is_model(name):
        close = timm.list_models(f"*{name.split('_')[0]}*")[:5]
        raise EvalError(f"timm has no model {name!r}" + (f"; similar: {', '.join(close)}" if close else ""))
    if checkpoint and not Path(checkpoint).is_file():
        raise EvalError(f"checkpoint {checkpoint} does not exist")
    try:
        model = timm.create_model(name, pretrained=False, **{"dynamic_img_size": True, **overrides})
    except TypeError:  # a model family without dynamic sizes (e.g. a CNN) still classifies
        model = timm.create_model(name, pretrained=False, **overrides)
    if checkpoint:
        filter_fn = getattr(importlib.import_module(type(model).__module__), "checkpoint_filter_fn", None)
        try:
            load_checkpoint(model, checkpoint, use_ema=weights == "ema", strict=True, filter_fn=filter_fn)
        except (RuntimeError, KeyError) as err:
            raise EvalError(f"checkpoint {checkpoint} does not fit timm model {name} (strict load): {err}") from err
    kind = ("ema" if weights == "ema" else "raw") if checkpoint else "random"
    return _finish(model, name + ("-ema" if kind == "ema" else ""), spec, kind)


def _finish(model: nn.Module, label: str, spec: str, kind: Literal["raw", "ema", "random"]) -> LoadedModel:
    from timm.data import resolve_model_data_config

    data = resolve_model_data_config(model)
    return LoadedModel(
        model=model.eval(),
        label=label,
        spec=spec,
        weights=kind,
        input_size=tuple(data["input_size"][1:]),
        mean=tuple(data["mean"]),
        std=tuple(data["std"]),
        crop_pct=float(data.get("crop_pct", 1.0)),
    )
