"""Model specs, one string per model and its weights for every command-line tool (docs/model.md): a preset
(its released weights), a released name, ``PRESET@CHECKPOINT``, a checkpoint (or run) directory or file,
``hf-hub:USER/REPO[@REVISION]``, ``timm:NAME[.TAG]``, ``timm:NAME@CHECKPOINT``; untrained only if asked."""

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

from vit5.errors import InputError
from vit5.model.config import ConfigError
from vit5.model.presets import PRESETS
from vit5.weights import catalog
from vit5.weights.checkpoint import EMA_WEIGHTS_NAME, checkpoint_dir
from vit5.weights.convert import CheckpointError
from vit5.weights.factory import create_model, load_model, pretrained_overlay

TIMM_PREFIX = "timm:"
GENERIC_DIRS = frozenset({"final", "best", "last", "latest", "model"})
Weights = Literal["raw", "ema", "random"]


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
    class_names: tuple[str, ...] | None = None  # what each output means, when the weights record it

    @property
    def random_init(self) -> bool:
        return self.weights == "random"


def parse_model_args(items: Sequence[str]) -> dict[str, Any]:
    """``["depth=2", "img_size=64", "norm=layernorm"]`` to a dict (Python literals, else strings)."""
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"model argument {item!r} is not KEY=VALUE (e.g. depth=2 or img_size=64)")
        try:
            out[key.strip()] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key.strip()] = raw
    return out


def has_ema_weights(spec: str) -> bool:
    """Whether a spec names a vit5 checkpoint directory that also holds EMA weights."""
    if spec.startswith((TIMM_PREFIX, catalog.HF_HUB_PREFIX)) or "@" in spec or not Path(spec).is_dir():
        return False
    return (checkpoint_dir(Path(spec)) / EMA_WEIGHTS_NAME).is_file()


def load_spec(
    spec: str, overrides: Mapping[str, Any] | None = None, use_ema: bool = False, random_init: bool = False
) -> LoadedModel:
    """Build the model a spec names, in eval mode (``random_init``: untrained, for a bare architecture name);
    ``overrides``: ViT5Config fields (and ``max_params``) or ``timm.create_model`` arguments. Failures: one
    :class:`InputError`."""
    overrides = dict(overrides or {})
    try:
        if random_init:
            model, label, description = _load_random(spec, overrides, use_ema)
        elif spec.startswith(TIMM_PREFIX):
            model, label, description = _load_timm(spec, overrides, use_ema)
        else:
            model, label, description = _load_vit5(spec, overrides, use_ema)
    except (CheckpointError, ConfigError) as err:
        name = spec.partition("@")[0]  # how a spec names a local copy of the weights it would download
        form = f"{name if name.startswith(TIMM_PREFIX) else name.partition('.')[0]}@PATH"
        if spec.startswith(catalog.HF_HUB_PREFIX):
            form = "the model (the folder holding its config.json and weights)"
        raise InputError(f"cannot load {spec}: {str(err).replace(catalog.LOCAL_FORM, form)}") from err
    from timm.data import resolve_model_data_config

    data = resolve_model_data_config(model)
    return LoadedModel(
        model=model.eval(),
        label=label + ("-ema" if use_ema else ""),
        spec=spec,
        weights="random" if random_init else "ema" if use_ema else "raw",
        description=description,
        input_size=tuple(data["input_size"][1:]),
        mean=tuple(data["mean"]),
        std=tuple(data["std"]),
        crop_pct=float(data.get("crop_pct", 1.0)),
        class_names=_label_names(model),
    )


def _load_vit5(spec: str, overrides: dict[str, Any], use_ema: bool) -> tuple[nn.Module, str, str]:
    weights = "EMA weights" if use_ema else "weights"
    if spec.startswith(catalog.HF_HUB_PREFIX):
        label = spec[len(catalog.HF_HUB_PREFIX) :].partition("@")[0].split("/")[-1]
        return load_model(spec, use_ema=use_ema, **overrides), label, f"vit5 model {spec} ({weights})"
    name, _, weights_path = spec.partition("@")
    if name in PRESETS or (catalog.is_weights_name(name) and not Path(spec).exists()):
        release = catalog.default_release(name)
        pretrained = weights_path or (name if catalog.is_weights_name(name) else release and release.name)
        if not pretrained:
            raise InputError(
                f"{name} has no released weights (released: {catalog.RELEASED_NAMES}): add @CHECKPOINT for "
                "your own weights, or ask for an untrained model with --random-init"
            )
        model = create_model(name, pretrained=pretrained, use_ema=use_ema, **overrides)
        arch = name.partition(".")[0]
        return model, arch, f"vit5 {arch}, {weights} {pretrained}"
    if not Path(spec).exists():
        _unknown(spec)
    resolved = checkpoint_dir(Path(spec))
    model = load_model(resolved, use_ema=use_ema, **overrides)
    path = Path(os.path.abspath(resolved))  # runs name their model folders generically: runs/demo/final
    label = path.stem if path.is_file() else path.name
    if path.is_dir() and (label in GENERIC_DIRS or label.startswith("checkpoint")):
        label = f"{path.parent.name}-{label}"
    return model, label, f"vit5 checkpoint {resolved} ({weights})"


def _unknown(spec: str) -> None:
    close = difflib.get_close_matches(spec.partition("@")[0], list(PRESETS), n=4, cutoff=0.5)
    raise InputError(
        f"model {spec!r} is neither an existing checkpoint path nor a vit5 preset "
        f"({', '.join(close) or '`vit5 list models` names them'}); timm models are written "
        f"{TIMM_PREFIX}NAME[@CHECKPOINT]"
    )


def names_weights(spec: str) -> bool:
    """Whether ``spec`` names weights: a path, ``@CHECKPOINT``, ``hf-hub:``, a tag (``NAME.TAG``)."""
    if spec.startswith(TIMM_PREFIX):
        return not is_bare_name(spec)
    hub_or_file = spec.startswith(catalog.HF_HUB_PREFIX) or "@" in spec or Path(spec).exists()
    return hub_or_file or catalog.is_weights_name(spec)


def is_bare_name(spec: str) -> bool:
    """Whether ``spec`` names an architecture only (``vit5_tiny``, ``timm:vit_small_patch16_224``)."""
    if spec.startswith(TIMM_PREFIX):
        return "@" not in spec and "." not in spec
    return spec in PRESETS and not Path(spec).exists()


def random_init_flags(specs: Sequence[str], random_init: bool) -> list[bool]:
    """Which of a command's models ``--random-init`` builds untrained: its bare architecture names (the
    others load as usual, so one command compares trained and untrained; a misspelt name fails to load)."""
    if random_init and all(names_weights(spec) for spec in specs):
        raise InputError(
            f"--random-init builds bare architecture names untrained (vit5_tiny, {TIMM_PREFIX}NAME), but "
            f"{', '.join(specs)} {'names' if len(specs) == 1 else 'name'} weights: drop --random-init"
        )
    return [random_init and is_bare_name(spec) for spec in specs]


def _load_random(spec: str, overrides: dict[str, Any], use_ema: bool) -> tuple[nn.Module, str, str]:
    """An untrained model of the architecture ``spec`` names, labelled as such everywhere."""
    if names_weights(spec):
        raise InputError(
            f"--random-init asks for an untrained model, but {spec} names weights: give a bare "
            f"architecture (a vit5 preset, or {TIMM_PREFIX}NAME), or drop --random-init"
        )
    if not is_bare_name(spec):
        _unknown(spec)
    if use_ema:
        raise InputError(f"{spec} with --random-init has no EMA weights: drop the EMA option")
    if spec.startswith(TIMM_PREFIX):
        name, kind = spec[len(TIMM_PREFIX) :], "timm"
        model = _create_timm(name, overrides, pretrained=False)
    else:
        name, kind, model = spec, "vit5 preset", create_model(spec, **overrides)
    return model, name + "-random-init", f"{kind} {name}, RANDOM INIT (--random-init: no weights)"


def distinct_labels(models: list[LoadedModel]) -> list[LoadedModel]:
    """Suffix repeated labels (``vit5_tiny``, ``vit5_tiny-2``) so tables and file names keep models apart."""
    seen: dict[str, int] = {}
    for m in models:
        seen[m.label] = seen.get(m.label, 0) + 1
        if seen[m.label] > 1:
            m.label = f"{m.label}-{seen[m.label]}"
    return models


def _load_timm(spec: str, overrides: dict[str, Any], use_ema: bool) -> tuple[nn.Module, str, str]:
    from timm.models import load_checkpoint

    name, _, weights_path = spec[len(TIMM_PREFIX) :].partition("@")
    if weights_path and not Path(weights_path).is_file():
        raise InputError(f"checkpoint {weights_path} does not exist")
    if use_ema and not weights_path:
        raise InputError(f"{spec}: timm's pretrained weights have no separate EMA copy; drop the EMA option")
    model = _create_timm(name, overrides, pretrained=not weights_path)
    if weights_path:
        filter_fn = getattr(importlib.import_module(type(model).__module__), "checkpoint_filter_fn", None)
        try:
            load_checkpoint(model, weights_path, use_ema=use_ema, strict=True, filter_fn=filter_fn)
        except (RuntimeError, KeyError) as err:
            raise InputError(
                f"checkpoint {weights_path} does not fit timm model {name} (strict load): {err}"
            ) from err
        source = f"{'EMA weights' if use_ema else 'weights'} {weights_path}"
    else:
        cfg = model.pretrained_cfg
        source = f"pretrained weights {cfg.get('architecture', name)}.{cfg.get('tag') or ''}"
    return model, name.partition(".")[0], f"timm {name}, {source}"


def _create_timm(name: str, overrides: dict[str, Any], pretrained: bool) -> nn.Module:
    """``timm.create_model``, with ``dynamic_img_size=True`` where the family takes it."""
    import timm

    overrides = {k: v for k, v in overrides.items() if k != "max_params"}  # vit5's size limit
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
        raise InputError(f"timm has no model {name!r}" + (f"; similar: {', '.join(close)}" if close else ""))
    if pretrained and not timm.is_model_pretrained(name):
        raise InputError(
            f"timm has no pretrained weights for {name} (tagged ones: "
            f"{', '.join(timm.list_pretrained(name + '*')[:8]) or 'none'}): "
            "add @CHECKPOINT, name a tag, or ask for an untrained model with --random-init"
        )
    kwargs = dict(overrides)
    if pretrained:  # through vit5's download (cache first) and reader
        cfg, overlay = timm.models.get_pretrained_cfg(name), overrides.get("pretrained_cfg_overlay")
        kwargs["pretrained_cfg_overlay"] = pretrained_overlay(cfg, overlay)
    try:
        try:
            return timm.create_model(name, pretrained=pretrained, **{"dynamic_img_size": True, **kwargs})
        except TypeError:  # a family without dynamic sizes: build it as asked
            return timm.create_model(name, pretrained=pretrained, **kwargs)
    except TypeError as err:
        raise InputError(f"cannot build timm model {name} with {overrides}: {err}") from err


def _label_names(model: nn.Module) -> tuple[str, ...] | None:
    """``pretrained_cfg["label_names"]`` (a list or an ``{index: name}`` mapping) if it names every output."""
    names = (getattr(model, "pretrained_cfg", None) or {}).get("label_names")
    if isinstance(names, Mapping):
        names = [names.get(i, names.get(str(i))) for i in range(len(names))]
    named = bool(names) and len(names) == getattr(model, "num_classes", None)
    return tuple(names) if named and all(isinstance(n, str) for n in names) else None
