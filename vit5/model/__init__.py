"""The ViT-5 network: config, presets, token layout, the backbone, capture and size estimates. Weights I/O
lives in :mod:`vit5.weights`."""
# ruff: noqa: F401 (the re-exports are the public names)

from vit5.model.capture import (
    AttentionKeep,
    AttentionSummary,
    Recording,
    record,
    summarise_attention,
)
from vit5.model.config import ConfigError, ViT5Config
from vit5.model.layout import TokenLayout
from vit5.model.presets import PRESETS, list_presets, preset_config
from vit5.model.vit import ViT5, compile_blocks, take_indices, unwrap
