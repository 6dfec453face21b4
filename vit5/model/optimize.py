"""Make a built ViT-5 faster without changing what it computes: inference folding, regional compile.

:func:`fuse_for_inference` folds the per-channel gains that sit next to a linear layer into that
layer's weights, so an eval forward skips their multiplies (exact algebra; the results differ
only by float rounding):

- LayerScale ``gamma * (W o + b)`` becomes ``(diag(gamma) W) o + gamma b``: folded into the
  branch's output projection (``attn.proj``, ``mlp.fc2`` of the GELU MLP or of SwiGLU).
- A pre-norm gain (and LayerNorm's bias) before a linear layer: ``W (g * n + beta) + b`` becomes
  ``(W diag(g)) n + (W beta + b)``: folded into ``attn.qkv`` and ``mlp.fc1`` (SwiGLU's packed
  gate/up matrix alike); the norm keeps only its normalisation (``RMSNorm(affine=False)`` /
  ``LayerNorm(elementwise_affine=False)``). A LayerNorm bias gives a bias-free qkv a bias.

Not folded: QK-norm gains (the normalisation and RoPE come between them and any weight), the
final norm (its output is the features that ``forward_features``, ``forward_intermediates(norm=
True)`` and ``get_intermediate_layers`` return), and, in a post-norm block, the norm gains (a
post-norm output feeds the residual stream as well as the next linear layer; LayerScale is folded
there too). Block outputs, attention maps and logits are those of the unfused model; the output
of ``norm1`` / ``norm2`` is not (it lacks the gain), so a hook on those modules sees other values.

The fused model is for inference only: ``.train()`` raises, its parameters no longer require
gradients, and :func:`~vit5.weights.checkpoint.save_pretrained` refuses it (its tensors no longer
follow the ViT-5 layout; save before fusing, or reload the checkpoint).

:func:`compile_blocks` is regional compilation (PyTorch recipe "Reducing torch.compile cold start
compilation time with regional compilation"): each transformer block is compiled in place with
``torch.compile``; since every block runs the same code on the same shapes, the first block's
compiled code is reused by the others (one compilation instead of one per block, and much less
than compiling the whole model), while the embedding, the RoPE table and the head stay eager.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vit5.layers import LayerScale, RMSNorm
from vit5.model.vit import ViT5, unwrap_model


@torch.no_grad()
def fuse_for_inference(model: ViT5) -> ViT5:
    """Fold LayerScale and pre-norm gains into the adjacent linear layers, in place; returns ``model``.

    The model is put in eval mode and refuses ``.train()`` afterwards. Fusing twice is a no-op.
    Fuse before ``torch.compile`` / :func:`compile_blocks` (a compiled wrapper is refused).
    """
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
    if gain is None and shift is None:
        return norm
    weight = linear.weight.double()
    if shift is not None:
        folded_bias = weight @ shift.double() + (linear.bias.double() if linear.bias is not None else 0.0)
        if linear.bias is None:
            linear.bias = nn.Parameter(torch.empty_like(linear.weight[:, 0]))
        linear.bias.copy_(folded_bias)
    if gain is not None:
        linear.weight.copy_(weight * gain.double()[None, :])
    return plain.to(linear.weight.device)


def compile_blocks(model: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Regional compilation: ``torch.compile`` each block of ``model`` in place; returns ``model``.

    ``compile_kwargs`` go to ``nn.Module.compile`` (``backend``, ``mode``, ``dynamic``, ...). The
    model's own ``forward`` stays eager, its state-dict keys unchanged (no ``_orig_mod.`` prefix),
    so checkpoints, EMA and ``vit5.record`` work as before. The first call per input shape
    compiles one block; the others reuse it.
    """
    vit = unwrap_model(model)
    for block in vit.blocks:
        block.compile(**compile_kwargs)
    return model
