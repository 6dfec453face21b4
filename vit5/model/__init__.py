"""The ViT-5 model: config, presets, the backbone, capture, checkpoints, converters and the Hub."""

from .capture import Recording, record, unwrap_model
from .checkpoint import (
    Checkpoint,
    LoadReport,
    create_model,
    load_model,
    load_weights,
    push_to_hub,
    read_checkpoint,
    save_pretrained,
)
from .config import ConfigError, ViT5Config
from .convert import CheckpointError, detect_source, infer_config
from .layout import TokenLayout
from .optimize import compile_blocks, fuse_for_inference
from .presets import PRESETS, list_presets, preset_config
from .vit import IMAGENET_MEAN, IMAGENET_STD, ViT5, take_indices

__all__ = [
    "IMAGENET_MEAN", "IMAGENET_STD", "PRESETS", "Checkpoint", "CheckpointError", "ConfigError", "LoadReport",
    "Recording", "TokenLayout", "ViT5", "ViT5Config", "compile_blocks", "create_model", "detect_source",
    "fuse_for_inference", "infer_config", "list_presets", "load_model", "load_weights", "preset_config",
    "push_to_hub", "read_checkpoint", "record", "save_pretrained", "take_indices", "unwrap_model",
]
