"""vit5: ViT-5 ("Vision Transformers for the Mid-2020s", arXiv 2602.08071) backbones with every
modern component switchable, plus training, evaluation and visualisation.

    import vit5
    model = vit5.create_model("vit5_small", pretrained=True)  # the official 224 weights, from the Hub
    feats = model.forward_intermediates(images, indices=[-1], intermediates_only=True)
    with vit5.record(model, layers=[-1]) as rec:
        model(images)
    vit5.fuse_for_inference(model)   # eval only: LayerScale and norm gains folded into the linears
    vit5.compile_blocks(model)       # regional torch.compile: one block compiled, shared by all

The package root is lazy (PEP 562 module ``__getattr__``): ``import vit5`` loads neither torch nor
timm, so the ``vit5`` command answers ``--help`` and argument errors at once; the public names below
are imported on first use. Every preset is registered in timm (``timm.create_model("vit5_small")``)
as soon as both vit5 and timm are imported, in either order.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from typing import Any

from vit5.errors import Vit5Error

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC = {
    **dict.fromkeys(
        (
            "PRESETS",
            "ConfigError",
            "Recording",
            "TokenLayout",
            "ViT5",
            "ViT5Config",
            "compile_blocks",
            "fuse_for_inference",
            "list_presets",
            "preset_config",
            "record",
        ),
        "vit5.model",
    ),
    **dict.fromkeys(
        (
            "CheckpointError",
            "LoadReport",
            "create_model",
            "load_model",
            "push_to_hub",
            "read_checkpoint",
            "save_pretrained",
        ),
        "vit5.weights",
    ),
    "register_presets": "vit5.weights.registry",
    "export_onnx": "vit5.weights.export",  # onnx is an optional extra: imported only when asked for
    "export_program": "vit5.weights.export",
}


def __getattr__(name: str) -> Any:
    """The public names, imported on first use (and the presets registered in timm with them)."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'vit5' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    _register_in_timm()
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


def _importing_vit5(finished: str = "") -> bool:
    """Whether a vit5 module (other than ``finished``) is being imported: registering then could meet
    it half-built."""
    return any(
        getattr(getattr(module, "__spec__", None), "_initializing", False)
        for name, module in list(sys.modules.items())
        if name.startswith("vit5.") and name != finished
    )


class _TimmHook(importlib.abc.MetaPathFinder):
    """An import hook (:mod:`importlib`) that registers the presets once timm and vit5 are both
    imported: after timm's import, or, when timm is first imported from inside a vit5 module, after
    the outermost vit5 module being imported is complete."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "timm" and not fullname.startswith("vit5."):
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if finder is not self and find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_register(module: Any) -> None:
            exec_module(module)
            _register_in_timm(finished=fullname)

        loader.exec_module = exec_then_register  # this module's own loader object
        return spec


_HOOK = _TimmHook()
_registered = False


def _register_in_timm(finished: str = "") -> None:
    """Register every preset in timm, unless done, timm is not imported yet, or a vit5 import is
    under way (the hook then calls again when it completes)."""
    global _registered
    if _registered or "timm" not in sys.modules or _importing_vit5(finished):
        return
    _registered = True
    if _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)
    from vit5.weights.registry import register_presets

    register_presets()


if "timm" in sys.modules:
    _register_in_timm()
else:
    sys.meta_path.insert(0, _HOOK)


__all__ = ["Vit5Error", "__version__", *_PUBLIC]
