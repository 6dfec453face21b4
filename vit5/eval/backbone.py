"""Dense features of one batch through timm's ``forward_intermediates`` contract (vit5 and timm ViTs alike):
per block ``i``, ``blocks.{i}.patches`` ``[B, C, H/p, W/p]``, ``blocks.{i}.cls`` ``[B, C]`` and
``blocks.{i}.registers`` ``[B, R, C]`` (timm returns the prefix as ``[CLS | registers]``, whatever the
token order)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import nn

from vit5.introspect import ModelInfo
from vit5.model.footprint import BIG_TOKEN_COUNT, forward_bytes
from vit5.runtime import check_fits

EVAL_FIX = "use e.g. {h}x{w}"  # the fix a size error names in eval (it takes --size HxW)


class LargeInputWarning(UserWarning):
    """An input of so many tokens that a forward takes long (attention cost grows with their square)."""


def check_forward_memory(
    patch_size: int, width: int, batch: int, size: tuple[int, int], device: torch.device | str
) -> None:
    """Refuse a forward whose activations cannot fit on ``device``; warn (once per size) for inputs of
    more than :data:`~vit5.model.footprint.BIG_TOKEN_COUNT` tokens."""
    tokens = (size[0] // patch_size) * (size[1] // patch_size)
    check_fits(
        forward_bytes(batch, tokens, width),
        device,
        f"a forward of {batch} image(s) at {size[0]}x{size[1]} ({tokens:,} tokens each)",
        "use a smaller size (--size, or --max-side for images at their own size) or a smaller batch",
    )
    if tokens > BIG_TOKEN_COUNT and size not in _WARNED_SIZES:
        _WARNED_SIZES.add(size)
        message = (
            f"input {size[0]}x{size[1]} has {tokens:,} tokens: attention cost grows with their square, so "
            "this is slow (minutes per image on a CPU); --max-side or --size limits it"
        )
        warnings.warn(message, LargeInputWarning, stacklevel=3)


_WARNED_SIZES: set[tuple[int, int]] = set()


def feature_names(info: ModelInfo, blocks: Sequence[int]) -> list[str]:
    kinds = [k for k, n in (("patches", 1), ("cls", info.num_cls), ("registers", info.num_registers)) if n]
    return [f"blocks.{b}.{kind}" for b in blocks for kind in kinds]


@torch.inference_mode()
def dense_features(
    model: nn.Module, images: torch.Tensor, info: ModelInfo, blocks: Sequence[int], norm: bool = False
) -> dict[str, torch.Tensor]:
    """``{name: [B, ...]}`` for the (absolute, sorted) ``blocks``; ``norm`` applies the final norm."""
    info.grid(tuple(images.shape[-2:]), EVAL_FIX)
    check_forward_memory(
        info.patch_size, info.embed_dim, images.shape[0], tuple(images.shape[-2:]), images.device
    )
    outputs = model.forward_intermediates(
        images,
        indices=list(blocks),
        return_prefix_tokens=True,
        norm=norm,
        stop_early=True,
        output_fmt="NCHW",
        intermediates_only=True,
    )
    features = {}
    for b, (spatial, prefix) in zip(blocks, outputs):
        features[f"blocks.{b}.patches"] = spatial
        if info.num_cls:
            features[f"blocks.{b}.cls"] = prefix[:, 0]
        if info.num_registers:
            features[f"blocks.{b}.registers"] = prefix[:, info.num_cls :]
    return features
