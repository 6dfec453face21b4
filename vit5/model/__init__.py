"""The ViT-5 model: config, presets, the backbone, capture, checkpoints, converters and the Hub."""

from vit5.model.capture import Recording, record
from vit5.model.checkpoint import (
    Checkpoint,
    LoadReport,
    create_model,
    load_model,
    load_weights,
    push_to_hub,
    read_checkpoint,
    save_pretrained,
)
from vit5.model.config import ConfigError, ViT5Config
from vit5.model.convert import CheckpointError, detect_source, infer_config
from vit5.model.info import ModelInfo, block_indices, describe, patch_size_of, unwrap, unwrap_model
from vit5.model.layout import TokenLayout
from vit5.model.optimize import compile_blocks, fuse_for_inference
from vit5.model.presets import PRESETS, list_presets, preset_config
from vit5.model.vit import IMAGENET_MEAN, IMAGENET_STD, ViT5, take_indices

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "PRESETS",
    "Checkpoint",
    "CheckpointError",
    "ConfigError",
    "LoadReport",
    "ModelInfo",
    "Recording",
    "TokenLayout",
    "ViT5",
    "ViT5Config",
    "block_indices",
    "compile_blocks",
    "create_model",
    "describe",
    "detect_source",
    "fuse_for_inference",
    "infer_config",
    "list_presets",
    "load_model",
    "load_weights",
    "patch_size_of",
    "preset_config",
    "push_to_hub",
    "read_checkpoint",
    "record",
    "save_pretrained",
    "take_indices",
    "unwrap",
    "unwrap_model",
]
