"""One capture for vit5 (:func:`vit5.record`) and timm ``VisionTransformer`` / ``Eva`` models: timm blocks run
their explicit attention path (``fused_attn = False``, restored on exit) and ``attn.attn_drop``'s output, the
softmax probabilities, is hooked. Block outputs are taken before the final norm (Darcet et al. 2023)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager

import torch
from torch import nn

from vit5.errors import InputError
from vit5.introspect import ModelInfo, describe
from vit5.model import Recording, record, take_indices
from vit5.model.vit import unwrap

LayerCallback = Callable[[int, "torch.Tensor | None", "torch.Tensor | None"], None]
"""``on_layer(block_index, attention [B, heads, N, N] fp32 or None, tokens [B, N, C] or None)``."""


def recordable(model: nn.Module) -> ModelInfo:
    """The :class:`~vit5.model.ModelInfo` of a model whose attention can be recorded; an InputError
    for other models and for timm blocks without timm's explicit softmax path (nothing to hook)."""
    info = describe(model)
    if info.family == "vit5":
        return info
    for i, block in enumerate(unwrap(model).blocks):
        attn = getattr(block, "attn", None)
        if not (hasattr(attn, "fused_attn") and isinstance(getattr(attn, "attn_drop", None), nn.Module)):
            raise InputError(
                f"block {i} of this {type(model).__name__} has an attention module ({type(attn).__name__}) "
                "without timm's explicit softmax path (fused_attn / attn_drop); its attention cannot be "
                "recorded"
            )
    return info


@contextmanager
def capture(
    model: nn.Module,
    layers: int | Sequence[int] | None = None,
    attention: bool = True,
    tokens: bool = True,
    on_layer: LayerCallback | None = None,
) -> Iterator[Recording]:
    """Record softmax attention ``[B, heads, N, N]`` (fp32) and block outputs ``[B, N, C]`` of ``layers``.

    With ``on_layer`` each block's results are handed over as soon as the block has run, in block order,
    and then dropped, so memory holds one block's attention whatever the depth. Call ``model.eval()``
    first: in training mode timm's attention dropout would alter the recorded probabilities.
    """
    info = recordable(model)
    wanted = take_indices(info.depth, layers, unique=True)
    net = unwrap(model)
    with ExitStack() as stack:

        def hook(module: nn.Module, fn: Callable) -> None:
            """``fn(inputs, output)`` after ``module`` runs; what it returns is dropped."""

            def run(module, inputs, output) -> None:
                fn(inputs, output)

            stack.callback(module.register_forward_hook(run).remove)

        if info.family == "vit5":
            rec = stack.enter_context(record(net, wanted, attention, tokens, token_layers=wanted))
        else:
            rec = Recording(info.depth, wanted if attention else [], wanted if tokens else [])
            for i in wanted:
                block = net.blocks[i]
                if attention:
                    stack.callback(setattr, block.attn, "fused_attn", block.attn.fused_attn)
                    block.attn.fused_attn = False
                    hook(
                        block.attn.attn_drop,
                        lambda a, out, i=i: rec.attentions.update({i: out.detach().float()}),
                    )
                if tokens:
                    hook(block, lambda a, out, i=i: rec.tokens.update({i: out.detach()}))
        if info.family == "timm" or info.test_registers:  # after record's own: the blocks' longer sequence
            hook(net.patch_embed, lambda a, out: setattr(rec, "layout", info.layout(tuple(a[0].shape[-2:]))))
        if on_layer is not None:  # after the recording hooks: hand over what the block produced, then drop it
            for i in wanted:
                hook(
                    net.blocks[i],
                    lambda a, out, i=i: on_layer(i, rec.attentions.pop(i, None), rec.tokens.pop(i, None)),
                )
        yield rec
