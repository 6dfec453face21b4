"""Make a built ViT-5 faster without changing what it computes (up to float rounding): fold LayerScale and
pre-norm gains into the adjacent linears for inference (``docs/speed.md``), and regional compilation (PyTorch
recipe "Reducing torch.compile cold start compilation time with regional compilation")."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vit5.layers import LayerScale, RMSNorm
from vit5.model.vit import ViT5, unwrap_model


@torch.no_grad()
def fuse_for_inference(model: ViT5) -> ViT5:
    """Fold LayerScale and pre-norm gains into the adjacent linear layers, in place; returns ``model`` in
    eval mode, refusing ``.train()``. Fusing twice is a no-op; fuse before compiling (no wrappers)."""
    if not isinstance(model, ViT5):
        raise TypeError(
            f"fuse_for_inference takes a vit5 ViT5 model, got {type(model).__name__}: fuse the model "
            "before wrapping it (torch.compile, DDP)"
        )
    if model.fused_for_inference:
        return model
    model.eval()
    for block in model.blocks:
        block.ls1 = _fold_layer_scale(block.ls1, block.attn.proj)
        block.ls2 = _fold_layer_scale(block.ls2, block.mlp.fc2)
        if block.pre_norm:
            block.norm1 = _fold_norm(block.norm1, block.attn.qkv)
            block.norm2 = _fold_norm(block.norm2, block.mlp.fc1)
    model.requires_grad_(False)
    model.fused_for_inference = True
    return model


def _fold_layer_scale(ls: nn.Module, linear: nn.Linear) -> nn.Module:
    """``gamma * linear(o)``: scale the rows (outputs) of ``linear``; the LayerScale becomes Identity."""
    if not isinstance(ls, LayerScale):
        return ls
    gamma = ls.gamma.double()
    linear.weight.copy_(linear.weight.double() * gamma[:, None])
    if linear.bias is not None:
        linear.bias.copy_(linear.bias.double() * gamma)
    return nn.Identity()


def _fold_norm(norm: nn.Module, linear: nn.Linear) -> nn.Module:
    """``linear(g * n + beta)``: scale the columns (inputs) of ``linear`` by ``g`` and add ``W beta``
    to its bias; returns the norm without gain and bias."""
    if isinstance(norm, RMSNorm):
        gain, shift, plain = norm.weight, None, RMSNorm(norm.dim, norm.eps, affine=False)
    elif isinstance(norm, nn.LayerNorm):
        gain, shift = norm.weight, norm.bias
        plain = nn.LayerNorm(norm.normalized_shape, norm.eps, elementwise_affine=False)
    else:
        return norm
    weight = linear.weight.double()
    if shift is not None:
        folded_bias = weight @ shift.double() + (linear.bias.double() if linear.bias is not None else 0.0)
        if linear.bias is None:
            linear.bias = nn.Parameter(torch.empty_like(linear.weight[:, 0]))
        linear.bias.copy_(folded_bias)
    linear.weight.copy_(weight * gain.double()[None, :])
    return plain.to(linear.weight.device)


def compile_blocks(model: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """``nn.Module.compile(**compile_kwargs)`` each block in place; returns ``model``. State-dict keys stay
    unchanged (no ``_orig_mod.``), so checkpoints, EMA and ``vit5.record`` work as before."""
    vit = unwrap_model(model)
    for block in vit.blocks:
        block.compile(**compile_kwargs)
    return model
