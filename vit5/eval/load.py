"""Model specs for evaluation (:mod:`vit5.introspect.spec`: presets, released weights, checkpoint and run
directories, official ``.pth`` files, ``hf-hub:``, ``timm:``), expanded to raw and EMA weights."""

from __future__ import annotations

from typing import Any, Literal

from vit5.errors import InputError
from vit5.introspect.spec import LoadedModel, distinct_labels, has_ema_weights, load_spec
from vit5.introspect.spec import parse_model_args as parse_overrides

__all__ = ["LoadedModel", "distinct_labels", "load_models", "parse_overrides"]

WeightChoice = Literal["auto", "raw", "ema"]


def load_models(
    spec: str, weights: WeightChoice = "auto", random_init: bool = False, **overrides: Any
) -> list[LoadedModel]:
    """The models a spec names: ``weights="auto"`` gives raw and EMA weights when a checkpoint
    directory holds both (an official ``.pth`` needs ``"ema"`` to pick its ``model_ema``).
    A name means its pretrained weights; ``random_init=True`` an untrained model (labelled so).
    ``overrides`` are ViT5Config fields for vit5 models, ``timm.create_model`` arguments for timm."""
    if weights not in ("auto", "raw", "ema"):
        raise InputError(f"weights must be 'auto', 'raw' or 'ema', got {weights!r}")
    kinds = [False, True] if weights == "auto" and has_ema_weights(spec) else [weights == "ema"]
    return [load_spec(spec, overrides, use_ema=use_ema, random_init=random_init) for use_ema in kinds]
