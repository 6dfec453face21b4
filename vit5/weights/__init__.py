"""Weights in and out, one module per job, each importing only those above it in this list:

- ``convert``: the official and timm state dicts in vit5's names, the architecture of the shapes;
- ``catalog``: the released weights by name and every download from the Hugging Face Hub;
- ``checkpoint``: our directory format, the checked readers, strict loading with a report;
- ``factory``: ``create_model`` / ``load_model``, and every preset in timm's registry (on import);
- ``publish``: stage a folder and push it to the Hub;
- ``export``: ONNX and ``torch.export`` (on its own; imported only when asked for).

Importing this package imports the factory, so every preset is in timm's registry afterwards.
"""
# ruff: noqa: F401 (the re-exports are the public names)

from vit5.weights.checkpoint import (
    Checkpoint,
    LoadReport,
    load_weights,
    read_checkpoint,
    save_pretrained,
)
from vit5.weights.convert import CheckpointError
from vit5.weights.factory import create_model, load_model
from vit5.weights.publish import push_to_hub
