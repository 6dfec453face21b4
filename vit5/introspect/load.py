"""The one loader: a model spec, one string per model and its weights for every command-line tool
(docs/model.md), turned into a :class:`LoadedModel` that carries its description. The forms: a
preset (its released weights), a released name, ``PRESET@CHECKPOINT``, a checkpoint (or run)
directory or file, ``hf-hub:USER/REPO[@REVISION]``, ``timm:NAME[.TAG]``,
``timm:NAME@CHECKPOINT``, ``transformers:USER/REPO`` or ``transformers:FOLDER`` (a
``save_pretrained`` folder; :mod:`vit5.introspect.hf`); untrained only if asked
(``--random-init``). :func:`load_spec` loads one spec; :func:`load_models` a command's
:class:`ModelRequest` (several specs, raw and EMA weights)."""

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

from vit5.errors import InputError, Rule, rule_problems
from vit5.introspect.describe import ModelInfo, Preprocessing, describe, preprocessing_of
from vit5.introspect.hf import load_transformers
from vit5.model.config import ConfigError
from vit5.model.presets import PRESETS
from vit5.weights import catalog
from vit5.weights.checkpoint import EMA_WEIGHTS_NAME, checkpoint_dir
from vit5.weights.convert import CheckpointError
from vit5.weights.factory import create_model, load_model, pretrained_overlay

TIMM_PREFIX = "timm:"
HF_PREFIX = "transformers:"
# the prefixes of specs that name weights outside vit5's own
FOREIGN = (TIMM_PREFIX, HF_PREFIX, catalog.HF_HUB_PREFIX)
GENERIC_DIRS = frozenset({"final", "best", "last", "latest", "model"})
Weights = Literal["raw", "ema", "random"]
# what a command needs of its models: any model timm can build (classify, predict, export), a ViT
# the tools can describe (features, probes), or a ViT whose attention can be recorded (viz)
Require = Literal["any", "vit", "recording"]
REQUIRES = ("any", "vit", "recording")
WEIGHT_CHOICES = ("auto", "raw", "ema")


@dataclass
class LoadedModel:
    """A model in eval mode, where it came from, and what it is (computed once, at load)."""

    model: nn.Module
    label: str  # short name for tables, titles and file names
    spec: str
    weights: Weights
    description: str  # what was loaded from where
    preprocessing: Preprocessing  # size, mean, std and crop it expects
    info: ModelInfo | None  # None: not a ViT the tools can describe (a timm CNN)
    class_names: tuple[str, ...] | None = None  # what each output means, if the weights say

    @property
    def random_init(self) -> bool:
        return self.weights == "random"

    @property
    def input_size(self) -> tuple[int, int]:
        return self.preprocessing.input_size

    @property
    def mean(self) -> tuple[float, ...]:
        return self.preprocessing.mean

    @property
    def std(self) -> tuple[float, ...]:
        return self.preprocessing.std

    @property
    def crop_pct(self) -> float:
        return self.preprocessing.crop_pct


_REQUEST_RULES = (
    Rule("weights", lambda v: v in WEIGHT_CHOICES, f"one of {', '.join(WEIGHT_CHOICES)}"),
    Rule("require", lambda v: v in REQUIRES, f"one of {', '.join(REQUIRES)}"),
    Rule("specs", lambda v: len(v) > 0, "at least one model spec"),
)


@dataclass(frozen=True)
class ModelRequest:
    """The models a command asks for: ``specs`` with their ``overrides`` (ViT5Config fields or
    ``timm.create_model`` arguments; none, or one mapping per spec) and ``labels`` (none, or one
    per spec, ``None`` for the spec's own). ``weights="auto"`` gives raw and EMA weights when a
    checkpoint directory holds both (an official ``.pth`` needs ``"ema"`` for its
    ``model_ema``); ``random_init`` builds the bare architecture names untrained;
    ``max_params`` refuses larger vit5 models before they are built."""

    specs: tuple[str, ...]
    overrides: tuple[Mapping[str, Any], ...] = ()
    labels: tuple[str | None, ...] = ()
    weights: Literal["auto", "raw", "ema"] = "raw"
    random_init: bool = False
    max_params: float | None = None
    require: Require = "any"

    def __post_init__(self) -> None:
        values = {"weights": self.weights, "require": self.require, "specs": self.specs}
        problems = rule_problems(values, _REQUEST_RULES)
        count = len(self.specs)
        for name in ("overrides", "labels"):
            given = len(getattr(self, name))
            if given not in (0, count):
                problems.append(f"{name} must be empty or one per spec ({count}), got {given}")
        if problems:
            raise InputError(problems[0])


def load_models(request: ModelRequest) -> list[LoadedModel]:
    """The models of ``request``, in order (raw before EMA for one spec)."""
    untrained = random_init_flags(request.specs, request.random_init)
    models = []
    for index, spec in enumerate(request.specs):
        overrides = dict(request.overrides[index]) if request.overrides else {}
        if request.max_params is not None:
            overrides["max_params"] = request.max_params
        label = request.labels[index] if request.labels else None
        for use_ema in _weight_kinds(spec, request.weights):
            loaded = load_spec(
                spec,
                overrides,
                use_ema=use_ema,
                random_init=untrained[index],
                require=request.require,
            )
            loaded.label = label or loaded.label
            models.append(loaded)
    return models


def _weight_kinds(spec: str, weights: str) -> list[bool]:
    """``use_ema`` of each model a spec gives: auto is raw, plus EMA where a directory has it."""
    if weights == "auto" and has_ema_weights(spec):
        return [False, True]
    return [weights == "ema"]


def load_spec(
    spec: str,
    overrides: Mapping[str, Any] | None = None,
    use_ema: bool = False,
    random_init: bool = False,
    require: Require = "any",
) -> LoadedModel:
    """Build the model a spec names, in eval mode, and describe it once (``random_init``:
    untrained, for a bare architecture name; ``overrides``: ViT5Config fields, ``max_params``,
    or ``timm.create_model`` arguments; ``require``: fail now on a model the command cannot
    use). Failures: one :class:`InputError`."""
    overrides = dict(overrides or {})
    if random_init:
        build = _load_random
    elif spec.startswith(TIMM_PREFIX):
        build = _load_timm
    elif spec.startswith(HF_PREFIX):
        build = _load_transformers
    else:
        build = _load_vit5
    try:
        model, label, description = build(spec, overrides, use_ema)
    except (CheckpointError, ConfigError) as err:
        raise InputError(_load_failure(spec, err)) from err
    model.eval()
    info = _describe(model, require)
    if random_init:
        weights = "random"
    else:
        weights = "ema" if use_ema else "raw"
    return LoadedModel(
        model=model,
        label=label + ("-ema" if use_ema else ""),
        spec=spec,
        weights=weights,
        description=description,
        preprocessing=info.preprocessing if info else preprocessing_of(model),
        info=info,
        class_names=_label_names(model),
    )


def _load_failure(spec: str, err: Exception) -> str:
    """The message of a checkpoint or config error, with the local form of this spec."""
    name = spec.partition("@")[0]  # how a spec names a local copy of the weights it would download
    if spec.startswith(catalog.HF_HUB_PREFIX):
        form = "the model (the folder holding its config.json and weights)"
    elif name.startswith(TIMM_PREFIX):
        form = f"{name}@PATH"
    else:
        form = f"{name.partition('.')[0]}@PATH"
    return f"cannot load {spec}: {str(err).replace(catalog.LOCAL_FORM, form)}"


def _describe(model: nn.Module, require: Require) -> ModelInfo | None:
    """The model's description, or None for a model that is no ViT where ``require`` allows."""
    try:
        info = describe(model)
    except InputError:
        if require == "any":
            return None
        raise
    if require == "recording" and info.unrecordable:
        raise InputError(info.unrecordable)
    return info


def parse_model_args(items: Sequence[str]) -> dict[str, Any]:
    """``["depth=2", "img_size=64", "norm=layernorm"]`` to a dict (Python literals, else
    strings)."""
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise InputError(
                f"model argument {item!r} is not KEY=VALUE (e.g. depth=2 or img_size=64)",
            )
        try:
            out[key.strip()] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key.strip()] = raw
    return out


def has_ema_weights(spec: str) -> bool:
    """Whether a spec names a vit5 checkpoint directory that also holds EMA weights."""
    prefixed = spec.startswith(FOREIGN)
    if prefixed or "@" in spec or not Path(spec).is_dir():
        return False
    return (checkpoint_dir(Path(spec)) / EMA_WEIGHTS_NAME).is_file()


def _load_vit5(spec: str, overrides: dict[str, Any], use_ema: bool) -> tuple[nn.Module, str, str]:
    weights = "EMA weights" if use_ema else "weights"
    if spec.startswith(catalog.HF_HUB_PREFIX):
        repo = spec[len(catalog.HF_HUB_PREFIX) :].partition("@")[0]
        model = load_model(spec, use_ema=use_ema, **overrides)
        return model, repo.split("/")[-1], f"vit5 model {spec} ({weights})"
    name, _, weights_path = spec.partition("@")
    if name in PRESETS or (catalog.is_weights_name(name) and not Path(spec).exists()):
        pretrained = weights_path or _released(name)
        model = create_model(name, pretrained=pretrained, use_ema=use_ema, **overrides)
        arch = name.partition(".")[0]
        return model, arch, f"vit5 {arch}, {weights} {pretrained}"
    if not Path(spec).exists():
        _unknown(spec)
    resolved = checkpoint_dir(Path(spec))
    model = load_model(resolved, use_ema=use_ema, **overrides)
    # runs name their model folders generically: runs/demo/final
    path = Path(os.path.abspath(resolved))
    label = path.stem if path.is_file() else path.name
    if path.is_dir() and (label in GENERIC_DIRS or label.startswith("checkpoint")):
        label = f"{path.parent.name}-{label}"
    return model, label, f"vit5 checkpoint {resolved} ({weights})"


def _released(name: str) -> str:
    """The released weights of a preset or a released name, or the error that says there are
    none."""
    if catalog.is_weights_name(name):
        return name
    release = catalog.default_release(name)
    if release is None:
        raise InputError(
            f"{name} has no released weights (released: {catalog.RELEASED_NAMES}): add "
            "@CHECKPOINT for your own weights, or ask for an untrained model with --random-init",
        )
    return release.name


def _unknown(spec: str) -> None:
    name = spec.partition("@")[0]
    close = difflib.get_close_matches(name, list(PRESETS), n=4, cutoff=0.5)
    raise InputError(
        f"model {spec!r} is neither an existing checkpoint path nor a vit5 preset "
        f"({', '.join(close) or '`vit5 list models` names them'}); timm models are written "
        f"{TIMM_PREFIX}NAME[@CHECKPOINT], transformers ones {HF_PREFIX}USER/REPO or "
        f"{HF_PREFIX}FOLDER",
    )


def names_weights(spec: str) -> bool:
    """Whether ``spec`` names weights: a path, ``@CHECKPOINT``, ``hf-hub:``, a tag
    (``NAME.TAG``)."""
    if is_bare_name(spec):
        return False
    if spec.startswith(FOREIGN) or "@" in spec:
        return True
    return catalog.is_weights_name(spec) or Path(spec).exists()


def is_bare_name(spec: str) -> bool:
    """Whether ``spec`` names an architecture only (``vit5_tiny``,
    ``timm:vit_small_patch16_224``)."""
    if spec.startswith(TIMM_PREFIX):
        return "@" not in spec and "." not in spec
    return spec in PRESETS and not Path(spec).exists()


def random_init_flags(specs: Sequence[str], random_init: bool) -> list[bool]:
    """Which of a command's models ``--random-init`` builds untrained: its bare architecture
    names (the others load as usual, so one command compares trained and untrained; a misspelt
    name fails to load)."""
    if random_init and all(names_weights(spec) for spec in specs):
        verb = "names" if len(specs) == 1 else "name"
        raise InputError(
            "--random-init builds bare architecture names untrained (vit5_tiny, "
            f"{TIMM_PREFIX}NAME), but {', '.join(specs)} {verb} weights: drop --random-init",
        )
    return [random_init and is_bare_name(spec) for spec in specs]


def _load_random(spec: str, overrides: dict[str, Any], use_ema: bool) -> tuple[nn.Module, str, str]:
    """An untrained model of the architecture ``spec`` names, labelled as such everywhere."""
    if names_weights(spec):
        raise InputError(
            f"--random-init asks for an untrained model, but {spec} names weights: give a bare "
            f"architecture (a vit5 preset, or {TIMM_PREFIX}NAME), or drop --random-init",
        )
    if not is_bare_name(spec):
        _unknown(spec)
    if use_ema:
        raise InputError(f"{spec} with --random-init has no EMA weights: drop the EMA option")
    if spec.startswith(TIMM_PREFIX):
        name = spec[len(TIMM_PREFIX) :]
        kind = "timm"
        model = _create_timm(name, overrides, pretrained=False)
    else:
        name = spec
        kind = "vit5 preset"
        model = create_model(spec, **overrides)
    description = f"{kind} {name}, RANDOM INIT (--random-init: no weights)"
    return model, name + "-random-init", description


def distinct_labels(models: list[LoadedModel]) -> list[LoadedModel]:
    """Suffix repeated labels (``vit5_tiny``, ``vit5_tiny-2``) so tables and file names keep
    models apart."""
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
        raise InputError(
            f"{spec}: timm's pretrained weights have no separate EMA copy; drop the EMA option",
        )
    model = _create_timm(name, overrides, pretrained=not weights_path)
    if weights_path:
        module = importlib.import_module(type(model).__module__)
        filter_fn = getattr(module, "checkpoint_filter_fn", None)
        try:
            load_checkpoint(model, weights_path, use_ema=use_ema, strict=True, filter_fn=filter_fn)
        except (RuntimeError, KeyError) as err:
            raise InputError(
                f"checkpoint {weights_path} does not fit timm model {name} (strict load): {err}",
            ) from err
        kind = "EMA weights" if use_ema else "weights"
        source = f"{kind} {weights_path}"
    else:
        cfg = model.pretrained_cfg
        source = f"pretrained weights {cfg.get('architecture', name)}.{cfg.get('tag') or ''}"
    return model, name.partition(".")[0], f"timm {name}, {source}"


def _load_transformers(
    spec: str,
    overrides: dict[str, Any],
    use_ema: bool,
) -> tuple[nn.Module, str, str]:
    """A transformers backbone (:func:`vit5.introspect.hf.load_transformers`): its
    architecture is the checkpoint's, so it takes no overrides and has no EMA copy."""
    source = spec[len(HF_PREFIX) :]
    overrides = {k: v for k, v in overrides.items() if k != "max_params"}
    if overrides:
        raise InputError(
            f"{spec}: a transformers model takes no --model-args ({', '.join(overrides)}); "
            "its architecture comes from its config.json",
        )
    if use_ema:
        raise InputError(f"{spec} has no separate EMA weights: drop the EMA option")
    model, description = load_transformers(source)
    label = Path(source.rstrip("/")).name
    return model, label, description


def _create_timm(name: str, overrides: dict[str, Any], pretrained: bool) -> nn.Module:
    """``timm.create_model``, with ``dynamic_img_size=True`` where the family takes it."""
    import timm

    # max_params is vit5's size limit, not a timm argument
    overrides = {k: v for k, v in overrides.items() if k != "max_params"}
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
        similar = f"; similar: {', '.join(close)}" if close else ""
        raise InputError(f"timm has no model {name!r}{similar}")
    if pretrained and not timm.is_model_pretrained(name):
        tagged = ", ".join(timm.list_pretrained(name + "*")[:8]) or "none"
        raise InputError(
            f"timm has no pretrained weights for {name} (tagged ones: {tagged}): add "
            "@CHECKPOINT, name a tag, or ask for an untrained model with --random-init",
        )
    kwargs = dict(overrides)
    if pretrained:  # through vit5's download (cache first) and reader
        cfg = timm.models.get_pretrained_cfg(name)
        overlay = overrides.get("pretrained_cfg_overlay")
        kwargs["pretrained_cfg_overlay"] = pretrained_overlay(cfg, overlay)
    try:
        try:
            dynamic = {"dynamic_img_size": True, **kwargs}
            return timm.create_model(name, pretrained=pretrained, **dynamic)
        except TypeError:  # a family without dynamic sizes: build it as asked
            return timm.create_model(name, pretrained=pretrained, **kwargs)
    except TypeError as err:
        raise InputError(f"cannot build timm model {name} with {overrides}: {err}") from err


def _label_names(model: nn.Module) -> tuple[str, ...] | None:
    """``pretrained_cfg["label_names"]`` (a list or an ``{index: name}`` mapping) if it names
    every output."""
    names = (getattr(model, "pretrained_cfg", None) or {}).get("label_names")
    if isinstance(names, Mapping):
        names = [names.get(i, names.get(str(i))) for i in range(len(names))]
    named = bool(names) and len(names) == getattr(model, "num_classes", None)
    if named and all(isinstance(n, str) for n in names):
        return tuple(names)
    return None
