"""Model specs: one string names a model and its weights, for every command-line tool.

Spec forms::

    vit5_small                          a vit5 preset with its released weights (the 224 ones, from the Hub)
    vit5_base_patch16_384.in1k          released weights by their timm name
    vit5_small@weights.pth              a preset with weights (official ViT-5 .pth, timm or vit5 checkpoint)
    runs/demo_digits/final              a vit5 checkpoint directory (config.json + model.safetensors)
    runs/demo_digits                    a run directory: its final/ checkpoint, or its only one
    vit5_small_patch16_224.pth          a checkpoint file; architecture inferred (vit5.load_model)
    hf-hub:USER/REPO[@REVISION]         a vit5 model on the Hub (vit5.push_to_hub)
    timm:vit_small_patch14_reg4_dinov2                   a timm model with timm's pretrained weights
    timm:vit_small_patch14_dinov2.lvd142m                ... with the weights of that tag
    timm:vit_small_patch14_reg4_dinov2@model.safetensors a timm model with a local checkpoint

A name means its pretrained weights, as in timm; an untrained model only when asked for
(``random_init=True``, the commands' ``--random-init``), and then its label says ``random-init``
so every table and figure shows it. Downloads go through huggingface_hub (its cache,
``HF_HUB_OFFLINE``; see :mod:`vit5.weights.hub`).

``overrides`` are :class:`~vit5.ViT5Config` fields for vit5 models and ``timm.create_model``
arguments for timm models. timm models are built with ``dynamic_img_size=True`` where they accept
it (any patch-multiple input size), and their checkpoints go through the model's own
``checkpoint_filter_fn`` (so Meta's DINOv2 ``.pth`` files load) and load strictly.
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

from vit5.errors import InputError
from vit5.model.config import ConfigError
from vit5.model.presets import PRESETS
from vit5.weights import hub
from vit5.weights.checkpoint import EMA_WEIGHTS_NAME, checkpoint_dir
from vit5.weights.convert import CheckpointError
from vit5.weights.factory import create_model, load_model
from vit5.weights.registry import pretrained_overlay

TIMM_PREFIX = "timm:"
GENERIC_DIRS = frozenset({"final", "best", "last", "latest", "model"})
RANDOM_LABEL = "-random-init"
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
    if spec.startswith((TIMM_PREFIX, hub.HF_HUB_PREFIX)) or "@" in spec or not Path(spec).is_dir():
        return False
    return (checkpoint_dir(Path(spec)) / EMA_WEIGHTS_NAME).is_file()


def load_spec(
    spec: str, overrides: Mapping[str, Any] | None = None, use_ema: bool = False, random_init: bool = False
) -> LoadedModel:
    """Build the model a spec names (see the module docstring), in eval mode.

    ``random_init``: an untrained model of the named architecture (no download); an error for a
    spec that names weights (a path, ``@CHECKPOINT``, a tag, ``hf-hub:``). ``overrides`` may hold
    ``max_params``, the size limit of :func:`vit5.create_model` (vit5 models).
    """
    overrides = dict(overrides or {})
    try:
        with hub.local_path_form(_local_form(spec)):
            return _load_spec(spec, overrides, use_ema, random_init)
    except (CheckpointError, ConfigError) as err:
        raise InputError(f"cannot load {spec}: {err}") from err


def _local_form(spec: str) -> str:
    """How a spec names a local copy of the weights it would download (for the hub's advice)."""
    if spec.startswith(hub.HF_HUB_PREFIX):
        return "the model (the folder holding its config.json and weights)"
    name = spec.partition("@")[0]
    return f"{name.partition('.')[0] if not name.startswith(TIMM_PREFIX) else name}@PATH"


def _load_spec(spec: str, overrides: dict[str, Any], use_ema: bool, random_init: bool) -> LoadedModel:
    """:func:`load_spec` without its error wrapping."""
    if random_init:
        return _load_random(spec, overrides, use_ema)
    if spec.startswith(TIMM_PREFIX):
        return _load_timm(spec, overrides, use_ema)
    if spec.startswith(hub.HF_HUB_PREFIX):
        model = load_model(spec, use_ema=use_ema, **overrides)
        label = spec[len(hub.HF_HUB_PREFIX) :].partition("@")[0].split("/")[-1] + ("-ema" if use_ema else "")
        return _finish(
            model,
            label,
            spec,
            "ema" if use_ema else "raw",
            f"vit5 model {spec} ({_weights_word(use_ema)})",
        )
    name, _, weights_path = spec.partition("@")
    if name in PRESETS or (hub.is_weights_name(name) and not Path(spec).exists()):
        weights = weights_path or _released(name)
        model = create_model(name, pretrained=weights, use_ema=use_ema, **overrides)
        arch = name.partition(".")[0]
        label = arch + ("-ema" if use_ema else "")
        return _finish(
            model,
            label,
            spec,
            "ema" if use_ema else "raw",
            f"vit5 {arch}, {_weights_word(use_ema)} {weights}",
        )
    path = Path(spec)
    if not path.exists():
        _unknown(spec)
    resolved = checkpoint_dir(path)
    model = load_model(resolved, use_ema=use_ema, **overrides)
    label = _path_label(resolved) + ("-ema" if use_ema else "")
    return _finish(
        model,
        label,
        spec,
        "ema" if use_ema else "raw",
        f"vit5 checkpoint {resolved} ({_weights_word(use_ema)})",
    )


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
    return (
        spec.startswith(hub.HF_HUB_PREFIX) or "@" in spec or hub.is_weights_name(spec) or Path(spec).exists()
    )


def is_bare_name(spec: str) -> bool:
    """Whether ``spec`` names an architecture only (``vit5_tiny``, ``timm:vit_small_patch16_224``),
    no weights: no path, ``@CHECKPOINT``, tag or ``hf-hub:``."""
    if spec.startswith(TIMM_PREFIX):
        name = spec[len(TIMM_PREFIX) :]
        return "@" not in name and "." not in name
    return spec in PRESETS and not Path(spec).exists()


def random_init_flags(specs: Sequence[str], random_init: bool) -> list[bool]:
    """Which of a command's models ``--random-init`` builds untrained: its bare architecture names
    (checkpoints among them load as usual, so one command can compare trained and untrained)."""
    flags = [random_init and is_bare_name(spec) for spec in specs]
    if random_init and all(
        names_weights(spec) for spec in specs
    ):  # (a misspelt name is reported when loaded)
        raise InputError(
            f"--random-init builds bare architecture names untrained (vit5_tiny, {TIMM_PREFIX}NAME), but "
            f"{', '.join(specs)} {'names' if len(specs) == 1 else 'name'} weights: drop --random-init"
        )
    return flags


def _released(name: str) -> str:
    """The released weights a bare preset name means; without any, say how to get a model anyway."""
    if hub.is_weights_name(name):
        return name
    release = hub.default_release(name)
    if release is None:
        raise InputError(
            f"{name} has no released weights (released: {', '.join(hub.RELEASES)}): add @CHECKPOINT for "
            "your own weights, or ask for an untrained model with --random-init"
        )
    return release.name


def _load_random(spec: str, overrides: dict[str, Any], use_ema: bool) -> LoadedModel:
    """An untrained model of the architecture ``spec`` names, labelled as such everywhere."""
    timm_model = spec.startswith(TIMM_PREFIX)
    name = spec[len(TIMM_PREFIX) :] if timm_model else spec
    if not names_weights(spec) and not is_bare_name(spec):
        _unknown(spec)
    if names_weights(spec):
        raise InputError(
            f"--random-init asks for an untrained model, but {spec} names weights: give a bare "
            f"architecture (a vit5 preset, or {TIMM_PREFIX}NAME), or drop --random-init"
        )
    if use_ema:
        raise InputError(f"{spec} with --random-init has no EMA weights: drop the EMA option")
    if timm_model:
        model, kind = _create_timm(name, overrides, pretrained=False), "timm"
    else:
        model, kind = create_model(name, **overrides), "vit5 preset"
    return _finish(
        model, name + RANDOM_LABEL, spec, "random", f"{kind} {name}, RANDOM INIT (--random-init: no weights)"
    )


def distinct_labels(models: list[LoadedModel]) -> list[LoadedModel]:
    """Suffix repeated labels (``vit5_tiny``, ``vit5_tiny-2``) so tables and file names keep models apart."""
    seen: dict[str, int] = {}
    for m in models:
        seen[m.label] = seen.get(m.label, 0) + 1
        if seen[m.label] > 1:
            m.label = f"{m.label}-{seen[m.label]}"
    return models


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
        source = f"{_weights_word(use_ema)} {weights_path}"
    else:
        cfg = model.pretrained_cfg
        source = f"pretrained weights {cfg.get('architecture', name)}.{cfg.get('tag') or ''}"
    arch = name.partition(".")[0]
    return _finish(
        model, arch + ("-ema" if use_ema else ""), spec, "ema" if use_ema else "raw", f"timm {name}, {source}"
    )


def _create_timm(name: str, overrides: dict[str, Any], pretrained: bool) -> nn.Module:
    """``timm.create_model`` with ``dynamic_img_size=True`` where the family takes it; hub errors
    explained."""
    import timm
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    overrides = {
        k: v for k, v in overrides.items() if k != "max_params"
    }  # vit5's size limit; timm names its own
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
        raise InputError(f"timm has no model {name!r}" + (f"; similar: {', '.join(close)}" if close else ""))
    if pretrained and not timm.is_model_pretrained(name):
        raise InputError(
            f"timm has no pretrained weights for {name} (tagged ones: "
            f"{', '.join(timm.list_pretrained(name + '*')[:8]) or 'none'}): "
            "add @CHECKPOINT, name a tag, or ask for an untrained model with --random-init"
        )
    if pretrained:  # the weights through vit5's download (cache first) and reader, not timm's
        overlay = pretrained_overlay(
            timm.models.get_pretrained_cfg(name), overrides.get("pretrained_cfg_overlay")
        )
        overrides = {**overrides, "pretrained_cfg_overlay": overlay} if overlay else overrides
    try:
        try:
            return timm.create_model(name, pretrained=pretrained, **{"dynamic_img_size": True, **overrides})
        except TypeError:  # a family without dynamic sizes: build it as asked
            return timm.create_model(name, pretrained=pretrained, **overrides)
    except TypeError as err:
        raise InputError(f"cannot build timm model {name} with {overrides}: {err}") from err
    except (EntryNotFoundError, HfHubHTTPError):
        cfg = timm.models.get_pretrained_cfg(name)
        repo, revision = hub.split_revision(cfg.hf_hub_id or "")
        with hub.clear_hub_errors(repo, cfg.hf_hub_filename or "model.safetensors", revision):
            raise


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
        class_names=_label_names(model),
    )


def _label_names(model: nn.Module) -> tuple[str, ...] | None:
    """timm's ``pretrained_cfg["label_names"]`` (vit5 checkpoints and hub models record them), when
    it names every output; a list or an ``{index: name}`` mapping."""
    names = (getattr(model, "pretrained_cfg", None) or {}).get("label_names")
    if isinstance(names, Mapping):
        names = [names.get(i, names.get(str(i))) for i in range(len(names))]
    if (
        not names
        or len(names) != getattr(model, "num_classes", None)
        or not all(isinstance(n, str) for n in names)
    ):
        return None
    return tuple(names)
