"""Dense features of one batch through the timm ``forward_intermediates`` contract.

vit5 models and timm ViTs (``VisionTransformer``, ``Eva``) share that contract, so one function
serves both: per chosen block, the patch grid ``[B, C, H/p, W/p]`` and the prefix tokens split
into the CLS token ``[B, C]`` and the registers ``[B, R, C]`` (timm returns its prefix as
``[CLS | registers]`` whatever the sequence order, so no layout bookkeeping is needed here).
Feature names are ``blocks.{i}.patches``, ``blocks.{i}.cls`` and ``blocks.{i}.registers`` with
``i`` the absolute block index.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from vit5.eval.errors import EvalError
from vit5.model import ViT5, unwrap_model
from vit5.model.footprint import BIG_TOKEN_COUNT, forward_bytes
from vit5.runtime import check_fits


@dataclass(frozen=True)
class BackboneInfo:
    depth: int
    patch_size: int
    embed_dim: int
    num_cls: int  # 0 or 1
    num_registers: int
    dynamic_size: bool  # takes any patch-multiple input size
    img_size: tuple[int, int]


def describe(model: nn.Module) -> BackboneInfo:
    """What dense extraction needs to know about a vit5 or timm ViT (clear error for other models)."""
    try:
        vit = unwrap_model(model)
    except TypeError:
        vit = None
    if isinstance(vit, ViT5):
        cfg = vit.cfg
        return BackboneInfo(
            len(vit.blocks),
            cfg.patch_size,
            cfg.embed_dim,
            int(cfg.class_token),
            cfg.num_registers,
            True,
            tuple(cfg.img_size),
        )
    blocks, patch_embed = getattr(model, "blocks", None), getattr(model, "patch_embed", None)
    if not hasattr(model, "forward_intermediates") or blocks is None or patch_embed is None:
        raise EvalError(
            f"{type(model).__name__} is not a ViT with forward_intermediates (vit5 models and timm "
            "VisionTransformer / Eva models are supported)"
        )
    patch = tuple(patch_embed.patch_size)
    if patch[0] != patch[1]:
        raise EvalError(f"non-square patches {patch} are not supported")
    num_cls = int(getattr(model, "cls_token", None) is not None)
    return BackboneInfo(
        len(blocks),
        patch[0],
        model.embed_dim,
        num_cls,
        model.num_prefix_tokens - num_cls,
        bool(getattr(model, "dynamic_img_size", False)),
        tuple(patch_embed.img_size or (0, 0)),
    )


def patch_size_of(model: nn.Module) -> int | None:
    """The patch size of a vit5 or timm ViT; None for other models (e.g. a timm CNN)."""
    try:
        return describe(model).patch_size
    except EvalError:
        return None


def block_indices(info: BackboneInfo, layers: Sequence[int]) -> list[int]:
    """Absolute, sorted, unique block indices for ``layers`` (negative counts from the end)."""
    if not layers:
        raise EvalError("choose at least one layer (e.g. -1 for the last block)")
    bad = [i for i in layers if not -info.depth <= i < info.depth]
    if bad:
        raise EvalError(
            f"layer(s) {bad} out of range for a model with {info.depth} blocks (use 0..{info.depth - 1} or "
            f"-1..-{info.depth})"
        )
    return sorted({i % info.depth for i in layers})


def check_input(info: BackboneInfo, size: tuple[int, int]) -> None:
    if size[0] % info.patch_size or size[1] % info.patch_size:
        raise EvalError(f"input {size[0]}x{size[1]} is not a multiple of the patch size {info.patch_size}")
    if not info.dynamic_size and tuple(size) != tuple(info.img_size):
        raise EvalError(
            f"this timm model takes only {info.img_size[0]}x{info.img_size[1]} inputs; build it with "
            "dynamic_img_size=True (load_models does) or use that size"
        )


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
        warnings.warn(
            f"input {size[0]}x{size[1]} has {tokens:,} tokens: attention cost grows with their square, so "
            "this "
            f"is slow (minutes per image on a CPU); --max-side or --size limits it",
            LargeInputWarning,
            stacklevel=3,
        )


_WARNED_SIZES: set[tuple[int, int]] = set()


def feature_names(info: BackboneInfo, blocks: Sequence[int]) -> list[str]:
    names = []
    for b in blocks:
        names.append(f"blocks.{b}.patches")
        if info.num_cls:
            names.append(f"blocks.{b}.cls")
        if info.num_registers:
            names.append(f"blocks.{b}.registers")
    return names


@torch.inference_mode()
def dense_features(
    model: nn.Module, images: torch.Tensor, info: BackboneInfo, blocks: Sequence[int], norm: bool = False
) -> dict[str, torch.Tensor]:
    """``{name: [B, ...]}`` for the (absolute, sorted) ``blocks``; ``norm`` applies the final norm."""
    check_input(info, tuple(images.shape[-2:]))
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
