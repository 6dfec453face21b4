"""Weights in and out: checkpoints, the model factories, converters of the official and timm formats, the
Hugging Face Hub, the timm registry entries and export (ONNX, torch.export)."""
# ruff: noqa: F401 (the re-exports are the public names)

from vit5.weights.checkpoint import Checkpoint, LoadReport, load_weights, read_checkpoint, save_pretrained
from vit5.weights.convert import CheckpointError
from vit5.weights.factory import create_model, load_model
from vit5.weights.hub import push_to_hub
