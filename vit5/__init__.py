"""vit5: ViT-5 ("Vision Transformers for the Mid-2020s", arXiv 2602.08071) backbones with every modern
component switchable, plus training, evaluation and visualisation. The package root is lazy (PEP 562): it
loads neither torch nor timm; every preset is registered in timm once both are imported, in either order."""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from typing import Any

from vit5.errors import Vit5Error

__version__ = "0.1.0"

_MODEL = "PRESETS ConfigError Recording TokenLayout ViT5 ViT5Config compile_blocks"
_WEIGHTS = "CheckpointError LoadReport create_model load_model push_to_hub read_checkpoint save_pretrained"
_PUBLIC = {  # public name -> the module that defines it
    **dict.fromkeys((*_MODEL.split(), "list_presets", "preset_config", "record"), "vit5.model"),
    **dict.fromkeys(_WEIGHTS.split(), "vit5.weights"),
    "register_presets": "vit5.weights.factory",
    "export_onnx": "vit5.weights.export",  # onnx is an optional extra: imported only when asked for
    "export_program": "vit5.weights.export",
}


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'vit5' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(module), name)
    _register_in_timm()
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


class _TimmHook(importlib.abc.MetaPathFinder):
    """Registers the presets after timm's import, or, when a vit5 module imports timm, once the outermost
    vit5 module being imported is complete (registering earlier would meet it half-built)."""

    importing = 0  # vit5 modules being executed now

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "timm" and not fullname.startswith("vit5."):
            return None
        finders = (f for f in sys.meta_path if f is not self and hasattr(f, "find_spec"))
        spec = next((spec for f in finders if (spec := f.find_spec(fullname, path, target))), None)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, counted = spec.loader.exec_module, fullname != "timm"

        def exec_then_register(module: Any) -> None:
            self.importing += counted
            try:
                exec_module(module)
            finally:
                self.importing -= counted
            _register_in_timm()

        spec.loader.exec_module = exec_then_register  # this module's own loader object
        return spec


_HOOK = _TimmHook()
_registered = False


def _register_in_timm() -> None:
    """Register every preset in timm, unless done, timm is not imported yet or a vit5 import is under way."""
    global _registered
    if _registered or "timm" not in sys.modules or _HOOK.importing:
        return
    _registered = True
    if _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)
    from vit5.weights.factory import register_presets

    register_presets()


if "timm" in sys.modules:
    _register_in_timm()
else:
    sys.meta_path.insert(0, _HOOK)


__all__ = ["Vit5Error", "__version__", *_PUBLIC]
