"""One capture for every supported model: attention, block outputs and the token layout.

Supported models:

- vit5 :class:`~vit5.ViT5` (any preset or checkpoint), recorded through :func:`vit5.record`;
  order ``[CLS | patches | registers]``;
- timm ``VisionTransformer`` (DeiT-III, DINOv2 with and without registers, ``vit_*_reg4_*``) and
  timm ``Eva`` (RoPE, e.g. ``vit_*_rope_*``, EVA02); order ``[CLS | registers | patches]``.

Fused attention kernels (SDPA) return no weights, so for timm the recorded blocks are switched to
timm's own explicit path (``attn.fused_attn = False``) and the output of ``attn.attn_drop`` (the
post-softmax probabilities, after QK-norm and RoPE) is hooked; the flag is restored on exit, and
no environment variable is involved (timm reads ``TIMM_FUSED_ATTN`` only at construction).
Block outputs are the residual stream *before* the final norm, where Darcet et al. (2023) measure
token norms. The patch grid is ``(H / p, W / p)`` row-major, never ``sqrt(N)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager

import torch
from torch import nn

from vit5.errors import InputError
from vit5.introspect import describe
from vit5.introspect.info import ModelInfo
from vit5.model import Recording, record, take_indices
from vit5.model.vit import unwrap, unwrap_model

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

    Without ``on_layer`` the results stay in the returned :class:`~vit5.Recording` (``attentions``,
    ``tokens``, ``layout``), as with :func:`vit5.record`. With ``on_layer`` each block's results
    are handed over as soon as the block has run, in block order, and then dropped, so memory
    stays at one block's attention whatever the depth. Call ``model.eval()`` first: in training
    mode timm's attention dropout would alter the recorded probabilities.
    """
    info = recordable(model)
    wanted = take_indices(info.depth, layers, unique=True)
    if info.family == "vit5":
        context = _record_vit5(model, wanted, attention, tokens, on_layer)
    else:
        context = _record_timm(unwrap(model), info, wanted, attention, tokens, on_layer)
    with context as rec:
        yield rec


@contextmanager
def _record_vit5(model, layers, attention, tokens, on_layer) -> Iterator[Recording]:
    vit = unwrap_model(model)
    info = describe(vit)
    with record(vit, layers=layers, attention=attention, tokens=tokens, token_layers=layers) as rec:
        handles = []
        if info.test_registers:  # runs after record's own layout hook: the blocks see the longer sequence

            def test_layout(module, inputs, output) -> None:
                rec.layout = info.layout(tuple(inputs[0].shape[-2:]))

            handles.append(vit.patch_embed.register_forward_hook(test_layout))
        if on_layer is not None:
            for i in layers:  # runs after record's own hooks: hand over what the block produced, then drop it

                def hand_over(module, inputs, output, i=i):
                    on_layer(i, rec.attentions.pop(i, None), rec.tokens.pop(i, None))

                handles.append(vit.blocks[i].register_forward_hook(hand_over))
        try:
            yield rec
        finally:
            for handle in handles:
                handle.remove()


@contextmanager
def _record_timm(model, info: ModelInfo, layers, attention, tokens, on_layer) -> Iterator[Recording]:
    rec = Recording(
        info.depth, attention_layers=layers if attention else [], token_layers=layers if tokens else []
    )
    probs: dict[int, torch.Tensor] = {}

    def set_layout(module, args) -> None:
        rec.layout = info.layout(tuple(args[0].shape[-2:]))

    def keep_probs(i: int):
        def hook(module, inputs, output) -> None:
            probs[i] = output.detach().float()

        return hook

    def block_done(i: int):
        def hook(module, inputs, output) -> None:
            attn = probs.pop(i, None)
            out = output.detach() if tokens else None
            if on_layer is not None:
                on_layer(i, attn, out)
                return
            if attn is not None:
                rec.attentions[i] = attn
            if out is not None:
                rec.tokens[i] = out

        return hook

    handles = [model.patch_embed.register_forward_pre_hook(set_layout)]
    with ExitStack() as stack:
        stack.callback(_remove_all, handles)
        for i in layers:
            block = model.blocks[i]
            if attention:
                _use_explicit_attention(stack, block.attn)
                handles.append(block.attn.attn_drop.register_forward_hook(keep_probs(i)))
            handles.append(block.register_forward_hook(block_done(i)))
        yield rec


def _use_explicit_attention(stack: ExitStack, attn: nn.Module) -> None:
    fused = attn.fused_attn
    attn.fused_attn = False
    stack.callback(setattr, attn, "fused_attn", fused)


def _remove_all(handles: list) -> None:
    for handle in handles:
        handle.remove()
