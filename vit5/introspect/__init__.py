"""Any model the tools accept, vit5 or timm: what it is (:func:`describe` -> :class:`ModelInfo`), how a
command line names it (model specs: a run directory, a preset, ``timm:NAME``, ``MODEL@PATH``)."""

from vit5.introspect.info import ModelInfo, describe, patch_size_of
from vit5.introspect.spec import LoadedModel, load_spec, parse_model_args

__all__ = [
    "LoadedModel",
    "ModelInfo",
    "describe",
    "load_spec",
    "parse_model_args",
    "patch_size_of",
]
