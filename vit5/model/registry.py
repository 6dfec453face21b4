"""Register every preset in timm's model registry, so ``timm.create_model("vit5_small")`` works.

Entry points are generated from the preset table (presets are data, not one function each).
``pretrained`` takes a path; timm's ``features_only=True`` wraps the model in timm's
``FeatureGetterNet`` over ``forward_intermediates``.
"""

from __future__ import annotations

from typing import Any, Callable

from timm.models import register_model

from .checkpoint import create_model
from .presets import PRESETS

_TIMM_ONLY_KWARGS = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")


def _entrypoint(name: str) -> Callable[..., Any]:
    def build(pretrained: Any = False, **kwargs: Any):
        for key in _TIMM_ONLY_KWARGS:
            kwargs.pop(key, None)
        features_only = kwargs.pop("features_only", False)
        out_indices = kwargs.pop("out_indices", 3)
        model = create_model(name, pretrained=pretrained or None, **kwargs)
        if features_only:
            from timm.models._features import FeatureGetterNet

            return FeatureGetterNet(model, out_indices=out_indices, output_fmt="NCHW")
        return model

    build.__name__ = build.__qualname__ = name
    build.__module__ = __name__
    build.__doc__ = f"vit5 preset {name!r}: {PRESETS[name]}"
    return build


def register_presets() -> None:
    for name in PRESETS:
        register_model(_entrypoint(name))
