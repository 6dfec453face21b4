"""Model specs: one string names a model and its weights, for every command-line tool.

Spec forms::

    vit5_small                          a vit5 preset, random init (demos, baselines, tests)
    vit5_small@weights.pth              a preset with weights (official ViT-5 .pth, timm or vit5 checkpoint)
    runs/demo_digits/final              a vit5 checkpoint directory (config.json + model.safetensors)
    runs/demo_digits                    a run directory: its final/ checkpoint, or its only one
    vit5_small_patch16_224.pth          a checkpoint file; architecture inferred (vit5.load_model)
    timm:vit_small_patch14_reg4_dinov2                   a timm model, random init
    timm:vit_small_patch14_reg4_dinov2@model.safetensors a timm model with a local checkpoint

``overrides`` are :class:`~vit5.ViT5Config` fields for vit5 models and ``timm.create_model``
arguments for timm models. timm models are built with ``dynamic_img_size=True`` where they accept
it (any patch-multiple input size), and their checkpoints go through the model's own
``checkpoint_filter_fn`` (so Meta's DINOv2 ``.pth`` files load) and load strictly. Nothing is
downloaded.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from torch import nn

from ..errors import Vit5Error
from .checkpoint import EMA_WEIGHTS_NAME, WEIGHTS_NAME, create_model, load_model
from .config import ConfigError
from .convert import CheckpointError
from .presets import PRESETS

TIMM_PREFIX = "timm:"
GENERIC_DIRS = frozenset({"final", "best", "last", "latest", "model"})
Weights = Literal["raw", "ema", "random"]


class ModelSpecError(Vit5Error, ValueError):
    """A model spec cannot be resolved; the message says what was expected."""


@dataclass
class LoadedModel:
    """A model in eval mode, where it came from, and the preprocessing it expects."""

    model: nn.Module
    label: str  # short name for tables, titles and file names
    spec: str
    weights: Weights
    description: str  # what was loaded from where
    input_size: tuple[int, int]  # the size it was built for
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    crop_pct: float

    @property
    def random_init(self) -> bool:
        return self.weights == "random"


def parse_model_args(items: Sequence[str]) -> dict[str, Any]:
    """``["depth=2", "img_size=64", "norm=layernorm"]`` to a dict (Python literals, else strings)."""
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ModelSpecError(f"model argument {item!r} is not KEY=VALUE (e.g. depth=2 or img_size=64)")
        try:
            out[key.strip()] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key.strip()] = raw
    return out


def has_ema_weights(spec: str) -> bool:
    """Whether a spec names a vit5 checkpoint directory that also holds EMA weights."""
    if spec.startswith(TIMM_PREFIX) or "@" in spec or not Path(spec).is_dir():
        return False
    return (checkpoint_dir(Path(spec)) / EMA_WEIGHTS_NAME).is_file()


def checkpoint_dir(path: Path) -> Path:
    """``path`` itself, or the checkpoint directory of a run directory (``final/``, else its only one)."""
    if not path.is_dir() or (path / "config.json").exists():
        return path
    found = sorted(d for d in path.iterdir() if (d / "config.json").is_file() and (d / WEIGHTS_NAME).is_file())
    names = [d.name for d in found]
    if "final" in names:
        return path / "final"
    if len(found) > 1:
        raise ModelSpecError(f"{path} holds several checkpoint directories, pick one: {', '.join(map(str, found))}")
    return found[0] if found else path  # none: vit5.load_model explains what a checkpoint directory needs


def load_spec(spec: str, overrides: Mapping[str, Any] | None = None, use_ema: bool = False) -> LoadedModel:
    """Build the model a spec names (see the module docstring), in eval mode.

    ``overrides`` may hold ``max_params``, the size limit of :func:`vit5.create_model` (vit5 models).
    """
    overrides = dict(overrides or {})
    try:
        if spec.startswith(TIMM_PREFIX):
            return _load_timm(spec, overrides, use_ema)
        name, _, weights_path = spec.partition("@")
        if name in PRESETS:
            if use_ema and not weights_path:
                raise ModelSpecError(f"{spec} has random weights, so no EMA weights: add @CHECKPOINT or drop the EMA option")
            model = create_model(name, pretrained=weights_path or None, use_ema=use_ema, **overrides)
            kind = _kind(bool(weights_path), use_ema)
            source = f"{_weights_word(use_ema)} {weights_path}" if weights_path else "RANDOM INIT (no weights)"
            return _finish(model, name + ("-ema" if kind == "ema" else ""), spec, kind, f"vit5 preset {name}, {source}")
        path = Path(spec)
        if not path.exists():
            close = difflib.get_close_matches(name, list(PRESETS), n=4, cutoff=0.5)
            raise ModelSpecError(
                f"model {spec!r} is neither an existing checkpoint path nor a vit5 preset "
                f"({', '.join(close) or 'see vit5.list_presets()'}); timm models are written {TIMM_PREFIX}NAME[@CHECKPOINT]"
            )
        resolved = checkpoint_dir(path)
        model = load_model(resolved, use_ema=use_ema, **overrides)
        label = _path_label(resolved) + ("-ema" if use_ema else "")
        return _finish(model, label, spec, "ema" if use_ema else "raw", f"vit5 checkpoint {resolved} ({_weights_word(use_ema)})")
    except (CheckpointError, ConfigError) as err:
        raise ModelSpecError(f"cannot load {spec}: {err}") from err


def distinct_labels(models: list[LoadedModel]) -> list[LoadedModel]:
    """Suffix repeated labels (``vit5_tiny``, ``vit5_tiny-2``) so tables and file names keep models apart."""
    seen: dict[str, int] = {}
    for m in models:
        seen[m.label] = seen.get(m.label, 0) + 1
        if seen[m.label] > 1:
            m.label = f"{m.label}-{seen[m.label]}"
    return models


def _kind(has_weights: bool, use_ema: bool) -> Weights:
    return ("ema" if use_ema else "raw") if has_weights else "random"


def _weights_word(use_ema: bool) -> str:
    return "EMA weights" if use_ema else "weights"


def _path_label(path: Path) -> str:
    """``runs/demo/final`` -> ``demo-final``: training runs name their model folders generically."""
    path = Path(os.path.abspath(path))
    if path.is_file():
        return path.stem
    generic = path.name in GENERIC_DIRS or path.name.startswith("checkpoint")
    return f"{path.parent.name}-{path.name}" if generic else path.name


def _load_timm(spec: str, overrides: dict[str, Any], use_ema: bool) -> LoadedModel:
    import timm
    from timm.models import load_checkpoint

    name, _, weights_path = spec[len(TIMM_PREFIX) :].partition("@")
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
        raise ModelSpecError(f"timm has no model {name!r}" + (f"; similar: {', '.join(close)}" if close else ""))
    if weights_path and not Path(weights_path).is_file():
        raise ModelSpecError(f"checkpoint {weights_path} does not exist")
    if use_ema and not weights_path:
        raise ModelSpecError(f"{spec} has random weights, so no EMA weights: add @CHECKPOINT or drop the EMA option")
    overrides.pop("max_params", None)  # vit5's size limit; timm builds its own named architectures
    try:
        model = timm.create_model(name, pretrained=False, **{"dynamic_img_size": True, **overrides})
    except TypeError:  # a family without dynamic sizes: build it as asked
        try:
            model = timm.create_model(name, pretrained=False, **overrides)
        except TypeError as err:
            raise ModelSpecError(f"cannot build timm model {name} with {overrides}: {err}") from err
    if weights_path:
        filter_fn = getattr(importlib.import_module(type(model).__module__), "checkpoint_filter_fn", None)
        try:
            load_checkpoint(model, weights_path, use_ema=use_ema, strict=True, filter_fn=filter_fn)
        except (RuntimeError, KeyError) as err:
            raise ModelSpecError(f"checkpoint {weights_path} does not fit timm model {name} (strict load): {err}") from err
    kind = _kind(bool(weights_path), use_ema)
    source = f"{_weights_word(use_ema)} {weights_path}" if weights_path else "RANDOM INIT (no weights)"
    return _finish(model, name + ("-ema" if kind == "ema" else ""), spec, kind, f"timm {name}, {source}")


def _finish(model: nn.Module, label: str, spec: str, kind: Weights, description: str) -> LoadedModel:
    from timm.data import resolve_model_data_config

    data = resolve_model_data_config(model)
    return LoadedModel(
        model=model.eval(),
        label=label,
        spec=spec,
        weights=kind,
        description=description,
        input_size=tuple(data["input_size"][1:]),
        mean=tuple(data["mean"]),
        std=tuple(data["std"]),
        crop_pct=float(data.get("crop_pct", 1.0)),
    )
