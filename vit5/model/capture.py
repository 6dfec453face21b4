"""Record attention probabilities and block outputs of a ViT5 forward pass (the most recent one). The chosen
blocks run the explicit fp32 path (after QK-Norm and RoPE), as fused kernels return no weights; block outputs
are the residual stream before the final norm, where high-norm artifacts are measured."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from vit5.model.layout import TokenLayout
from vit5.model.vit import take_indices, unwrap_model


@dataclass
class Recording:
    """What :func:`record` captured in the last forward pass (tensors detached, on the model's device)."""

    depth: int
    attention_layers: list[int]
    token_layers: list[int]
    layout: TokenLayout | None = None
    attentions: dict[int, torch.Tensor] = field(default_factory=dict)  # [B, heads, N, N], fp32
    tokens: dict[int, torch.Tensor] = field(default_factory=dict)  # [B, N, C] block outputs

    def attention(self, layer: int) -> torch.Tensor:
        """Attention probabilities ``[B, heads, N, N]`` of block ``layer`` (negative counts from the end)."""
        return _get(self.attentions, self._index(layer), "attention")

    def block_output(self, layer: int) -> torch.Tensor:
        """Block ``layer``'s output tokens ``[B, N, C]`` before the final norm (negative allowed)."""
        return _get(self.tokens, self._index(layer), "token")

    def patch_norms(self, layer: int) -> torch.Tensor:
        """L2 norm of each patch token at ``layer`` as a map ``[B, h, w]``."""
        return self._layout().to_grid(self._layout().patches(self.block_output(layer)).float().norm(dim=-1))

    def cls_attention(self, layer: int) -> torch.Tensor:
        """Raw CLS-to-patch attention at ``layer`` as maps ``[B, heads, h, w]`` (not renormalised)."""
        layout = self._layout()
        if layout.cls_index is None:
            raise ValueError("this model has no CLS token")
        return layout.to_grid(layout.patches(self.attention(layer)[:, :, 0], dim=-1))

    def _index(self, layer: int) -> int:
        return take_indices(self.depth, [layer])[0]  # out of range is an error, not a wrap-around

    def _layout(self) -> TokenLayout:
        if self.layout is None:
            raise RuntimeError("nothing recorded yet: run the model inside `with vit5.record(model) as rec:`")
        return self.layout


def _get(store: dict[int, torch.Tensor], layer: int, kind: str) -> torch.Tensor:
    if layer not in store:
        raise KeyError(
            f"no {kind} recorded for block {layer}: recorded {sorted(store)} (pass layers=... to record)"
        )
    return store[layer]


def _keeper(store: dict[int, torch.Tensor], i: int) -> Callable[..., None]:
    def keep(*args: torch.Tensor) -> None:  # the probabilities, or a forward hook's (module, inputs, output)
        store[i] = args[-1].detach()

    return keep


@contextmanager
def record(
    model: nn.Module,
    layers: int | Sequence[int] | None = None,
    attention: bool = True,
    tokens: bool = True,
    token_layers: int | Sequence[int] | None = None,
) -> Iterator[Recording]:
    """Record attention of ``layers`` and outputs of ``token_layers`` (:func:`take_indices`; default all)."""
    vit = unwrap_model(model)
    depth = len(vit.blocks)
    rec = Recording(
        depth=depth,
        attention_layers=take_indices(depth, layers) if attention else [],
        token_layers=take_indices(depth, token_layers) if tokens else [],
    )

    def on_patches(module, inputs, output) -> None:
        rec.layout = vit.token_layout((output.shape[-2], output.shape[-1]))

    handles = [vit.patch_embed.register_forward_hook(on_patches)]
    handles += [vit.blocks[i].register_forward_hook(_keeper(rec.tokens, i)) for i in rec.token_layers]
    for i in rec.attention_layers:
        vit.blocks[i].attn.recorder = _keeper(rec.attentions, i)
    try:
        yield rec
    finally:
        for handle in handles:
            handle.remove()
        for i in rec.attention_layers:
            vit.blocks[i].attn.recorder = None
