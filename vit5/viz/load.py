"""Model specs for the ``viz`` command: :mod:`vit5.model.spec`, plus a check that viz can record it.

See :mod:`vit5.model.spec` for the spec forms (vit5 presets and released weights, checkpoint and
run directories, official ``.pth`` files, ``hf-hub:USER/REPO``, ``timm:NAME[.TAG][@CHECKPOINT]``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vit5.model.spec import LoadedModel, ModelSpecError, load_spec, parse_model_args
from vit5.viz.adapters import describe
from vit5.viz.errors import VizError

__all__ = ["LoadedModel", "load_model_spec", "parse_overrides"]


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["depth=2", "img_size=64"]`` to a dict (values as Python literals, else strings)."""
    try:
        return parse_model_args(items)
    except ModelSpecError as err:
        raise VizError(str(err)) from err


def load_model_spec(
    spec: str, overrides: Mapping[str, Any] | None = None, use_ema: bool = False, random_init: bool = False
) -> LoadedModel:
    """Build the model a spec names, in eval mode; fail now on an architecture viz cannot record.

    A name means its pretrained weights; ``random_init=True`` an untrained model (labelled so)."""
    try:
        loaded = load_spec(spec, overrides, use_ema, random_init)
    except ModelSpecError as err:
        raise VizError(str(err)) from err
    describe(loaded.model)
    return loaded
