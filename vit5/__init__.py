"""vit5: ViT-5 ("Vision Transformers for the Mid-2020s", arXiv 2602.08071) backbones with every
modern component switchable, plus training, evaluation and visualisation.

The package root is lazy (PEP 562): ``import vit5`` loads neither torch nor timm, so the command
line starts at once. The first public name used (``vit5.create_model``, ``vit5.ViT5``, ...)
imports its module and :mod:`vit5.weights.factory`, which registers every preset in timm; so does
``import vit5.weights``. A timm user writes ``import vit5.weights`` before
``timm.create_model("vit5_small")``.
"""

from __future__ import annotations

import importlib
from typing import Any

from vit5.errors import Vit5Error

__version__ = "0.1.0"

_MODEL_NAMES = (
    "PRESETS",
    "AttentionKeep",
    "ConfigError",
    "Recording",
    "TokenLayout",
    "ViT5",
    "ViT5Config",
    "compile_blocks",
    "list_presets",
    "preset_config",
    "record",
    "summarise_attention",
)
_WEIGHTS_NAMES = (
    "CheckpointError",
    "LoadReport",
    "create_model",
    "load_model",
    "push_to_hub",
    "read_checkpoint",
    "save_pretrained",
)
# public name -> the module that defines it
_PUBLIC = dict.fromkeys(_MODEL_NAMES, "vit5.model")
_PUBLIC.update(dict.fromkeys(_WEIGHTS_NAMES, "vit5.weights"))
_PUBLIC["register_presets"] = "vit5.weights.factory"
# onnx is an optional extra: imported only when asked for
_PUBLIC["export_onnx"] = "vit5.weights.export"
_PUBLIC["export_program"] = "vit5.weights.export"
_REGISTRY = "vit5.weights.factory"  # importing it registers every preset in timm


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'vit5' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    importlib.import_module(_REGISTRY)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


__all__ = ["Vit5Error", "__version__", *_PUBLIC]
