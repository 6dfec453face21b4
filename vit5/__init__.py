"""vit5: ViT-5 ("Vision Transformers for the Mid-2020s", arXiv 2602.08071) backbones with every
modern component switchable, plus training, evaluation and visualisation.

    import vit5
    model = vit5.create_model("vit5_small", pretrained=True)  # the official 224 weights, from the Hub
    feats = model.forward_intermediates(images, indices=[-1], intermediates_only=True)
    with vit5.record(model, layers=[-1]) as rec:
        model(images)
    vit5.fuse_for_inference(model)   # eval only: LayerScale and norm gains folded into the linears
    vit5.compile_blocks(model)       # regional torch.compile: one block compiled, shared by all

Importing the package registers every preset in timm (``timm.create_model("vit5_small")``).
"""

from vit5.errors import Vit5Error
from vit5.model import (
    PRESETS,
    ConfigError,
    Recording,
    TokenLayout,
    ViT5,
    ViT5Config,
    compile_blocks,
    fuse_for_inference,
    list_presets,
    preset_config,
    record,
)
from vit5.weights import (
    CheckpointError,
    LoadReport,
    create_model,
    load_model,
    push_to_hub,
    read_checkpoint,
    save_pretrained,
)
from vit5.weights.registry import register_presets

__version__ = "0.1.0"

register_presets()


def __getattr__(name: str):
    """``vit5.export_onnx`` / ``vit5.export_program``, imported on first use (onnx is an optional extra)."""
    if name in ("export_onnx", "export_program"):
        from vit5.weights import export

        return getattr(export, name)
    raise AttributeError(f"module 'vit5' has no attribute {name!r}")


__all__ = [
    "PRESETS",
    "CheckpointError",
    "ConfigError",
    "LoadReport",
    "Recording",
    "TokenLayout",
    "ViT5",
    "ViT5Config",
    "Vit5Error",
    "compile_blocks",
    "create_model",
    "export_onnx",
    "export_program",
    "fuse_for_inference",
    "list_presets",
    "load_model",
    "preset_config",
    "push_to_hub",
    "read_checkpoint",
    "record",
    "save_pretrained",
]
