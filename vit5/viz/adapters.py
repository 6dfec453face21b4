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
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from vit5.model import Recording, TokenLayout, ViT5, record, take_indices, unwrap_model
from vit5.viz.errors import VizError
from vit5.viz.images import check_size

SUPPORTED = "vit5 models and timm VisionTransformer (DeiT-III, DINOv2, vit_*_reg4_*) or Eva (RoPE) models"
TEST_REGISTERS_ATTR = (
    "_viz_test_registers"  # set on the model by vit5.viz.ttr while test-time registers are active
)

LayerCallback = Callable[[int, "torch.Tensor | None", "torch.Tensor | None"], None]
"""``on_layer(block_index, attention [B, heads, N, N] fp32 or None, tokens [B, N, C] or None)``."""


@dataclass(frozen=True)
class ModelInfo:
    """What the visualisation tools need to know about a model, whatever its family."""

    family: Literal["vit5", "timm"]
    name: str
    depth: int
    num_heads: int
    patch_size: int
    img_size: tuple[int, int]  # the size the model was built for
    dynamic_size: bool  # accepts any patch-multiple input size
    num_registers: int
    has_cls: bool
    registers_first: bool
    mean: tuple[float, ...]
    std: tuple[float, ...]
    test_registers: int = 0  # untrained tokens appended at the end by vit5.viz.ttr (model without registers)

    def layout(self, image_hw: tuple[int, int]) -> TokenLayout:
        """The token layout inside the blocks; test-time registers sit after everything else, so a model
        without trained registers reads ``[CLS | patches | test-time registers]`` in either family."""
        check_input_size(self, image_hw)
        grid = (image_hw[0] // self.patch_size, image_hw[1] // self.patch_size)
        if self.test_registers:
            return TokenLayout(grid, int(self.has_cls), self.test_registers, registers_first=False)
        return TokenLayout(grid, int(self.has_cls), self.num_registers, self.registers_first)


def _as_vit5(model: nn.Module) -> ViT5 | None:
    try:
        return unwrap_model(model)
    except TypeError:
        return None


def _timm_model(model: nn.Module) -> nn.Module:
    from timm.models.eva import Eva
    from timm.models.vision_transformer import VisionTransformer

    inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
    if inner is not None and not isinstance(model, (VisionTransformer, Eva)):
        return _timm_model(inner)
    if not isinstance(model, (VisionTransformer, Eva)):
        raise VizError(f"cannot visualise a {type(model).__name__}: supported are {SUPPORTED}")
    for i, block in enumerate(model.blocks):
        attn = getattr(block, "attn", None)
        if not (hasattr(attn, "fused_attn") and isinstance(getattr(attn, "attn_drop", None), nn.Module)):
            raise VizError(
                f"block {i} of this {type(model).__name__} has an attention module ({type(attn).__name__}) "
                "without timm's explicit softmax path (fused_attn / attn_drop); its attention cannot be "
                "recorded"
            )
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The vit5 or timm model inside a torch.compile / DDP / Accelerate wrapper."""
    return _as_vit5(model) or _timm_model(model)


def describe(model: nn.Module) -> ModelInfo:
    """The :class:`ModelInfo` of a vit5 or timm model (raises :class:`VizError` for other models)."""
    vit = _as_vit5(model)
    if vit is not None:
        cfg = vit.cfg
        return ModelInfo(
            "vit5",
            type(vit).__name__,
            cfg.depth,
            cfg.num_heads,
            cfg.patch_size,
            tuple(cfg.img_size),
            True,
            cfg.num_registers,
            cfg.class_token,
            False,
            tuple(vit.pretrained_cfg["mean"]),
            tuple(vit.pretrained_cfg["std"]),
            getattr(vit, TEST_REGISTERS_ATTR, 0),
        )
    tm = _timm_model(model)
    patch = tuple(tm.patch_embed.patch_size)
    if patch[0] != patch[1]:
        raise VizError(f"non-square patches {patch} are not supported")
    data_cfg = tm.pretrained_cfg or {}
    img_size = tm.patch_embed.img_size or tuple(data_cfg.get("input_size", (3, 224, 224))[1:])
    has_cls = tm.cls_token is not None
    return ModelInfo(
        "timm",
        type(tm).__name__,
        len(tm.blocks),
        tm.blocks[0].attn.num_heads,
        patch[0],
        tuple(img_size),
        bool(tm.dynamic_img_size),
        tm.num_prefix_tokens - int(has_cls),
        has_cls,
        True,
        tuple(data_cfg.get("mean", (0.485, 0.456, 0.406))),
        tuple(data_cfg.get("std", (0.229, 0.224, 0.225))),
        getattr(tm, TEST_REGISTERS_ATTR, 0),
    )


def check_input_size(info: ModelInfo, image_hw: tuple[int, int]) -> None:
    """Raise a :class:`VizError` naming the fix when the model cannot take images of ``image_hw``."""
    check_size(image_hw, info.patch_size)
    if not info.dynamic_size and tuple(image_hw) != tuple(info.img_size):
        raise VizError(
            f"this {info.name} was built for {info.img_size[0]}x{info.img_size[1]} inputs only "
            f"(dynamic_img_size=False): use --size {info.img_size[0]} {info.img_size[1]}, or build it with "
            "dynamic_img_size=True (the viz command does this for timm: model specs)"
        )


def resolve_layers(depth: int, layers: int | Sequence[int] | None) -> list[int]:
    """Sorted block indices, as :func:`vit5.record` and timm read them (``None`` all blocks, an int
    ``n`` the last n, a list absolute or negative), with a message naming the valid range."""
    for i in [] if layers is None or isinstance(layers, int) else layers:
        if not -depth <= i < depth:
            raise VizError(
                f"layer {i} is out of range: this model has {depth} blocks, valid layers are "
                f"0..{depth - 1} (or -{depth}..-1 counting from the end)"
            )
    try:
        return sorted(set(take_indices(depth, layers)))
    except ValueError as err:
        raise VizError(str(err)) from None


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
    info = describe(model)
    wanted = resolve_layers(info.depth, layers)
    if info.family == "vit5":
        context = _record_vit5(model, wanted, attention, tokens, on_layer)
    else:
        context = _record_timm(_timm_model(model), info, wanted, attention, tokens, on_layer)
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
