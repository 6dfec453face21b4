"""Turn a model spec string into a model, for the ``viz`` command (and anyone who wants the same idea).

Spec forms::

    vit5_small                        a vit5 preset, random init (demos and tests only)
    vit5_small@weights.pth            a preset with weights (official ViT-5 .pth, timm or vit5 checkpoint)
    runs/demo/model                   a vit5 checkpoint directory (config.json + model.safetensors)
    runs/demo                         a run directory holding exactly one such checkpoint directory
    vit5_small_patch16_224.pth        a checkpoint file; architecture inferred (vit5.load_model)
    timm:vit_small_patch14_reg4_dinov2                  a timm model, random init
    timm:vit_small_patch14_reg4_dinov2@model.safetensors    a timm model with a local checkpoint

``overrides`` are passed on: :class:`~vit5.ViT5Config` fields for vit5 (e.g. ``depth=2``),
``timm.create_model`` keyword arguments for timm (e.g. ``img_size=518``); ``use_ema`` picks the EMA
weights of a checkpoint that has them. timm models are built
with ``dynamic_img_size=True`` so any patch-multiple image size works, and checkpoints go
through the model's own ``checkpoint_filter_fn`` (so Meta's original DINOv2 ``.pth`` files
load) and are loaded strictly. Nothing is downloaded.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..model import PRESETS, create_model, load_model
from .adapters import describe
from .errors import VizError

TIMM_PREFIX = "timm:"


@dataclass
class LoadedModel:
    model: nn.Module
    label: str  # short name for titles and file names
    description: str  # what was loaded from where
    random_init: bool


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["depth=2", "img_size=64", "norm=layernorm"]`` to a dict (values as Python literals, else strings)."""
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise VizError(f"model argument {item!r} is not KEY=VALUE (e.g. depth=2 or img_size=64)")
        try:
            out[key.strip()] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key.strip()] = raw
    return out


def load_model_spec(spec: str, overrides: Mapping[str, Any] | None = None, use_ema: bool = False) -> LoadedModel:
    """Build the model a spec names (see the module docstring), in eval mode."""
    overrides = dict(overrides or {})
    weights = "EMA weights" if use_ema else "weights"
    if spec.startswith(TIMM_PREFIX):
        loaded = _load_timm(spec[len(TIMM_PREFIX) :], overrides, use_ema)
    else:
        name, _, checkpoint = spec.partition("@")
        if name in PRESETS:
            if use_ema and not checkpoint:
                raise VizError(f"{spec} has random weights, so no EMA weights: add @CHECKPOINT or drop --ema")
            model = create_model(name, pretrained=checkpoint or None, use_ema=use_ema, **overrides)
            source = f"{weights} {checkpoint}" if checkpoint else "RANDOM INIT (no weights)"
            loaded = LoadedModel(model, name, f"vit5 preset {name}, {source}", not checkpoint)
        elif Path(spec).exists():
            path = _checkpoint_dir(Path(spec))
            model = load_model(path, use_ema=use_ema, **overrides)
            given = Path(spec).resolve()
            label = (given.name if given.is_dir() else given.stem) + ("-ema" if use_ema else "")
            loaded = LoadedModel(model, label, f"vit5 checkpoint {path} ({weights})", False)
        else:
            close = [p for p in PRESETS if name.split("_")[0] in p][:4]
            raise VizError(
                f"model {spec!r} is neither a vit5 preset ({', '.join(close) or 'see vit5.list_presets()'}) "
                f"nor an existing checkpoint path; timm models are written {TIMM_PREFIX}NAME[@CHECKPOINT]"
            )
    describe(loaded.model)  # fail now, with a clear message, on an unsupported architecture
    loaded.model.eval()
    return loaded


def _checkpoint_dir(path: Path) -> Path:
    """``path`` itself, or the one checkpoint directory (config.json + model.safetensors) of a run directory."""
    if not path.is_dir() or (path / "config.json").exists():
        return path
    found = sorted(d for d in path.iterdir() if (d / "config.json").is_file() and (d / "model.safetensors").is_file())
    if len(found) > 1:
        raise VizError(f"{path} holds several checkpoint directories, pick one: {', '.join(map(str, found))}")
    return found[0] if found else path  # none: vit5.load_model explains what a checkpoint directory needs


def _load_timm(rest: str, overrides: dict[str, Any], use_ema: bool) -> LoadedModel:
    import timm
    from timm.models import load_checkpoint

    name, _, checkpoint = rest.partition("@")
    if not timm.is_model(name):
        close = timm.list_models(f"*{name.split('_')[0]}*")[:5]
        raise VizError(f"timm has no model {name!r}" + (f"; similar: {', '.join(close)}" if close else ""))
    if checkpoint and not Path(checkpoint).is_file():
        raise VizError(f"checkpoint {checkpoint} does not exist")
    try:
        model = timm.create_model(name, pretrained=False, **{"dynamic_img_size": True, **overrides})
    except TypeError:  # not a ViT (no dynamic_img_size): build it as asked, describe() names the problem
        try:
            model = timm.create_model(name, pretrained=False, **overrides)
        except TypeError as err:
            raise VizError(f"cannot build timm model {name} with {overrides}: {err}") from err
    describe(model)
    if checkpoint:
        module = importlib.import_module(type(model).__module__)
        try:
            load_checkpoint(model, checkpoint, use_ema=use_ema, strict=True,
                            filter_fn=getattr(module, "checkpoint_filter_fn", None))
        except (RuntimeError, KeyError) as err:
            raise VizError(f"checkpoint {checkpoint} does not fit timm model {name} (strict load): {err}") from err
    source = f"{'EMA weights' if use_ema else 'weights'} {checkpoint}" if checkpoint else "RANDOM INIT (no weights)"
    return LoadedModel(model, name, f"timm {name}, {source}", not checkpoint)
