"""One capture for vit5 (:func:`vit5.record`) and timm ``VisionTransformer`` / ``Eva`` models (timm blocks run
their explicit attention path, ``fused_attn = False``, restored on exit, and ``attn.attn_drop``'s output, the
softmax probabilities, is hooked; block outputs are taken before the final norm, Darcet et al. 2023), and
:func:`collect`: a model run over images in batches, each block's ``[B, heads, N, N]`` attention reduced into
:class:`TokenStats` as soon as the block has run, so memory holds one block's attention whatever the depth."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from vit5.errors import InputError
from vit5.introspect import ModelInfo, describe
from vit5.introspect.hf import record_transformers
from vit5.model import Recording, TokenLayout, record, take_indices
from vit5.model.vit import unwrap
from vit5.viz.images import LoadedImage, to_batch
from vit5.viz.stats import TokenStats, patch_content

LayerCallback = Callable[[int, "torch.Tensor | None", "torch.Tensor | None"], None]
"""``on_layer(block_index, attention [B, heads, N, N] fp32 or None, tokens [B, N, C] or None)``."""


def recordable(model: nn.Module, info: ModelInfo | None = None) -> ModelInfo:
    """The description of a model whose attention can be recorded (``info``, the loader's, or
    described now); an InputError for other models and for timm blocks without timm's explicit
    softmax path (nothing to hook)."""
    info = info or describe(model)
    if info.unrecordable:
        raise InputError(info.unrecordable)
    return info


@contextmanager
def capture(
    model: nn.Module,
    layers: int | Sequence[int] | None = None,
    attention: bool = True,
    tokens: bool = True,
    on_layer: LayerCallback | None = None,
    info: ModelInfo | None = None,
) -> Iterator[Recording]:
    """Record softmax attention ``[B, heads, N, N]`` (fp32) and block outputs ``[B, N, C]`` of ``layers``;
    with ``on_layer`` each block's results are handed over as soon as the block has run, then dropped. Call
    ``model.eval()`` first: in training mode timm's attention dropout would alter the probabilities."""
    info = recordable(model, info)
    wanted = take_indices(info.depth, layers, unique=True)
    net = unwrap(model)
    with ExitStack() as stack:

        def hook(module: nn.Module, fn: Callable) -> None:
            def run(module, inputs, output) -> None:  # fn's result is dropped: it must not replace output
                fn(inputs, output)

            stack.callback(module.register_forward_hook(run).remove)

        if info.family == "vit5":
            rec = stack.enter_context(record(net, wanted, attention, tokens, token_layers=wanted))
        elif info.family == "transformers":  # q and k from its attention interface (vit5.introspect.hf)
            rec = stack.enter_context(record_transformers(net, wanted, attention, tokens, info.layout))
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


@contextmanager
def edit_tokens(
    model: nn.Module,
    edit: Callable[[int, torch.Tensor, TokenLayout], torch.Tensor | None],
    info: ModelInfo | None = None,
) -> Iterator[None]:
    """Call ``edit(position, tokens [B, N, C], layout)`` on the first block's input (position 0) and every
    block's output (position ``d + 1``) before any other hook; a returned tensor replaces the tokens."""
    info = info or describe(model)
    net = unwrap(model)
    state = {}

    def remember_size(module, args) -> None:
        state["layout"] = info.layout(tuple(args[0].shape[-2:]))

    def on_input(module, args):
        new = edit(0, args[0], state["layout"])
        return None if new is None else (new, *args[1:])

    def on_output(position: int):
        return lambda module, args, output: edit(position, output, state["layout"])

    with ExitStack() as stack:
        stack.callback(net.patch_embed.register_forward_pre_hook(remember_size).remove)
        stack.callback(net.blocks[0].register_forward_pre_hook(on_input, prepend=True).remove)
        for d, block in enumerate(net.blocks):
            stack.callback(block.register_forward_hook(on_output(d + 1), prepend=True).remove)
        yield


@dataclass(frozen=True)
class CollectConfig:
    batch_size: int = 8
    device: str = "cpu"
    keep_features: int = 0  # keep final-norm patch features of the last block for the first N images (PCA)
    progress: bool = True

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise InputError(f"batch size must be at least 1, got {self.batch_size}")


def collect(
    model: nn.Module,
    images: Sequence[LoadedImage],
    label: str,
    cfg: CollectConfig = CollectConfig(),
    info: ModelInfo | None = None,
) -> TokenStats:
    """Record all blocks of ``model`` (put in eval mode on ``cfg.device``) on ``images`` (all of one size,
    normalised with the model's own mean / std) into :class:`TokenStats`."""
    sizes = {img.rgb.shape[:2] for img in images}
    if len(sizes) != 1:
        raise InputError(
            "all images of a run must share one size (metrics compare equal resolutions), got "
            f"{sorted(sizes)}"
        )
    info = recordable(model, info)
    layout = info.layout(sizes.pop())
    net = unwrap(model).eval().to(cfg.device)
    arrays: dict[str, list[np.ndarray]] = {}  # name -> per batch
    starts = range(0, len(images), cfg.batch_size)
    rows: dict[str, list[torch.Tensor]] = {}  # of the current batch, block by block
    rollout = None

    def reduce(block: int, attention: torch.Tensor, tokens: torch.Tensor) -> None:
        nonlocal rollout
        for key, value in layer_rows(attention, tokens, layout).items():
            rows.setdefault(key, []).append(value)
        rollout = rollout_step(rollout, attention)

    for start in tqdm(starts, desc=f"recording {label}", unit="batch", disable=not cfg.progress):
        batch = images[start : start + cfg.batch_size]
        rows.clear()
        rollout = None
        x = to_batch(batch, info.mean, info.std).to(cfg.device)
        with torch.no_grad(), capture(net, on_layer=reduce, info=info):
            out = net.forward_features(x)
        kept = max(0, min(len(batch), cfg.keep_features - start))
        if layout.cls_index is not None:  # the rollout row of CLS, or the mean of the patch rows
            rollout = rollout[:, layout.cls_index]
        else:
            rollout = layout.patches(rollout, dim=1).mean(dim=1)
        content = patch_content(np.stack([img.rgb for img in batch]), info.patch_size)
        found = {k: torch.stack(v, dim=1) for k, v in rows.items()} | {"rollout": rollout}
        found |= {"features": layout.patches(out[:kept]).float()} if kept else {}
        found = {k: v.cpu().numpy() for k, v in found.items()} | {
            "pixel_variance": content.variance,
            "variance_percentile": content.variance_percentile,
            "neighbour_cosine": content.neighbour_cosine,
        }
        for name, values in found.items():
            arrays.setdefault(name, []).append(values)
    names, joined = [img.name for img in images], {k: np.concatenate(v) for k, v in arrays.items()}
    return TokenStats(label, layout, list(range(info.depth)), names, info.patch_size, **joined)


def layer_rows(attention: torch.Tensor, tokens: torch.Tensor, layout: TokenLayout) -> dict[str, torch.Tensor]:
    """What is kept of one block's ``attention [B, H, N, N]`` and ``tokens [B, N, C]``: ``norms [B, N]``,
    ``received [B, H, N]`` (mean over queries), the :func:`massive_activations`, and with CLS / registers
    ``cls_attn [B, H, N]``, ``reg_attn [B, H, R, N]`` (register queries' rows) and ``patch_to_reg [B, H]``
    (register mass of each patch query, averaged over patch queries)."""
    rows = {
        "norms": tokens.float().norm(dim=-1),
        "received": attention.mean(dim=2),
        **massive_activations(tokens),
    }
    if layout.cls_index is not None:
        rows["cls_attn"] = attention[:, :, layout.cls_index]
    if layout.num_registers:
        rows["reg_attn"] = layout.registers(attention, dim=2)
        patch_queries = layout.patches(attention, dim=2)
        rows["patch_to_reg"] = layout.registers(patch_queries, dim=3).sum(dim=-1).mean(dim=-1)
    return rows


def massive_activations(tokens: torch.Tensor, top: int = 3) -> dict[str, torch.Tensor]:
    """Massive activations of one block output ``[B, N, C]`` (Sun et al., arXiv 2402.17762, section 2, and
    their ViT code, locuslab/massive-activations ``main_vit.py``): ``massive_top [B, top]`` the largest
    ``|x|`` over all tokens and channels, ``massive_token`` / ``massive_channel`` where they sit, and
    ``massive_median [B]`` the median ``|x|`` (the mean of the two middle values, as numpy's median)."""
    magnitude = tokens.detach().float().abs().flatten(1)  # [B, N * C], token-major
    largest = magnitude.topk(min(top, magnitude.shape[1]), dim=1)
    n = magnitude.shape[1]
    low = magnitude.kthvalue((n + 1) // 2, dim=1).values
    high = magnitude.kthvalue(n // 2 + 1, dim=1).values
    channels = tokens.shape[-1]
    return {
        "massive_top": largest.values,
        "massive_token": largest.indices // channels,
        "massive_channel": largest.indices % channels,
        "massive_median": (low + high) / 2,
    }


def rollout_step(acc: torch.Tensor | None, attention: torch.Tensor) -> torch.Tensor:
    """One layer of attention rollout (Abnar and Zuidema, ACL 2020): ``[B, heads, N, N]`` averaged over heads,
    mixed half and half with the identity for the residual path, renormalised per row and multiplied onto
    ``acc [B, N, N]`` (None at the start). Registers are ordinary columns, sliced off by the layout."""
    fused = attention.float().mean(dim=1)
    mixed = 0.5 * torch.eye(fused.shape[-1], device=fused.device, dtype=fused.dtype) + 0.5 * fused
    mixed = mixed / mixed.sum(dim=-1, keepdim=True)
    return mixed if acc is None else mixed @ acc
