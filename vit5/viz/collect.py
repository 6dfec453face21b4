"""One capture for vit5 (:func:`vit5.record`) and timm ``VisionTransformer`` / ``Eva`` models, and
:func:`collect`: a model run over images in batches, each block's attention summarised as it runs.

Every backbone feeds :func:`vit5.model.capture.summarise_attention` the queries and keys after
QK-norm and RoPE and keeps its fused kernel for the output: vit5's attention hands them to its
``recorder``; a timm block's ``q_norm`` and ``k_norm`` outputs are hooked, and an ``Eva`` block's
RoPE (the ``rope`` argument of its attention) is applied to them with timm's own
``apply_rot_embed_cat``, as its forward does. Block outputs are taken before the final norm
(Darcet et al., arXiv 2309.16588). :func:`figure_keep` is what the figures read, so memory holds
one query chunk of one block's attention, never ``N x N`` (``full_attention`` keeps it all)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from timm.layers import apply_rot_embed_cat
from torch import nn
from tqdm.auto import tqdm

from vit5.errors import InputError
from vit5.introspect import ModelInfo, describe
from vit5.introspect.hf import record_transformers
from vit5.model import Recording, TokenLayout, record, take_indices
from vit5.model.capture import AttentionKeep, AttentionSummary, received_from, summarise_attention
from vit5.model.vit import unwrap
from vit5.viz.images import LoadedImage, to_batch
from vit5.viz.stats import TokenStats, patch_content

LayerCallback = Callable[[int, "AttentionSummary | None", "torch.Tensor | None"], None]
"""``on_layer(block_index, attention summary or None, tokens [B, N, C] or None)``."""


def recordable(model: nn.Module, info: ModelInfo | None = None) -> ModelInfo:
    """The description of a model whose attention can be recorded (``info``, the loader's, or
    described now); an InputError for other models and for timm blocks without the ``q_norm``
    and ``k_norm`` modules the capture hooks."""
    info = info or describe(model)
    if info.unrecordable:
        raise InputError(info.unrecordable)
    return info


def figure_keep(layout: TokenLayout, rollout: bool = True) -> AttentionKeep:
    """What the figures and metrics read of each block (:func:`layer_rows`): the CLS and
    register rows, the attention each key receives, each query's mass on the registers, per-query
    entropy and largest weight, and (``rollout``) q and k for :func:`rollout_row`, the only
    thing kept whose size grows with the depth times the width. The query chunk fits
    :data:`vit5.model.capture.CHUNK_BYTES`."""
    registers = range(layout.register_slice.start, layout.register_slice.stop)
    cls = [] if layout.cls_index is None else [layout.cls_index]
    return AttentionKeep(
        rows=(*cls, *registers),
        mass_to=tuple(registers),
        inputs=rollout,
    )


def _hook_timm_attention(
    stack: ExitStack,
    attn: nn.Module,
    done: Callable[[torch.Tensor, torch.Tensor, float], None],
) -> None:
    """Hand ``done(q, k, scale)`` the queries and keys of a timm attention module after its
    ``q_norm`` / ``k_norm`` and RoPE (an ``Eva``'s ``rope`` argument, rotated as in its forward:
    the first ``num_prefix_tokens`` unrotated, ``rotate_half`` as set)."""
    seen = {}

    def remember(name: str):
        def keep(module, inputs, output) -> None:
            seen[name] = output

        return keep

    def on_call(module, args, kwargs) -> None:
        seen["rope"] = kwargs.get("rope", args[1] if len(args) > 1 else None)

    def on_return(module, args, output) -> None:
        q = seen.pop("q")
        k = seen.pop("k")
        rope = seen.pop("rope", None)
        if rope is not None:
            q = _rotate(attn, q, rope)
            k = _rotate(attn, k, rope)
        done(q, k, attn.scale)

    stack.callback(attn.q_norm.register_forward_hook(remember("q")).remove)
    stack.callback(attn.k_norm.register_forward_hook(remember("k")).remove)
    pre = attn.register_forward_pre_hook(on_call, with_kwargs=True)
    stack.callback(pre.remove)
    stack.callback(attn.register_forward_hook(on_return).remove)


def _rotate(attn: nn.Module, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """timm Eva's RoPE on ``x [B, H, N, d]`` (``timm/models/eva.py``, ``EvaAttention.forward``)."""
    prefix = attn.num_prefix_tokens
    half = getattr(attn, "rotate_half", False)
    rotated = apply_rot_embed_cat(x[:, :, prefix:], rope, half=half)
    return torch.cat([x[:, :, :prefix], rotated], dim=2)


@contextmanager
def capture(
    model: nn.Module,
    layers: int | Sequence[int] | None = None,
    attention: bool = True,
    tokens: bool = True,
    on_layer: LayerCallback | None = None,
    info: ModelInfo | None = None,
    keep: AttentionKeep | None = None,
) -> Iterator[Recording]:
    """Record the attention (an :class:`AttentionSummary` per block, as ``keep`` says; default
    the full ``[B, heads, N, N]`` probabilities) and block outputs ``[B, N, C]`` of ``layers``;
    with ``on_layer`` each block's results are handed over as soon as the block has run, then
    dropped. Call ``model.eval()`` first (timm's attention dropout in training mode)."""
    info = recordable(model, info)
    wanted = take_indices(info.depth, layers, unique=True)
    net = unwrap(model)
    keep = keep or AttentionKeep.full()
    with ExitStack() as stack:

        def hook(module: nn.Module, fn: Callable) -> None:
            # fn's result is dropped: it must not replace output
            def run(module, inputs, output) -> None:
                fn(inputs, output)

            stack.callback(module.register_forward_hook(run).remove)

        def summariser(i: int) -> Callable[[torch.Tensor, torch.Tensor, float], None]:
            def summarise(q: torch.Tensor, k: torch.Tensor, scale: float) -> None:
                with torch.no_grad():
                    rec.summaries[i] = summarise_attention(q, k, scale, keep)

            return summarise

        if info.family == "vit5":
            recording = record(net, wanted, attention, tokens, token_layers=wanted, keep=keep)
            rec = stack.enter_context(recording)
        elif (
            info.family == "transformers"
        ):  # q and k from its attention interface (vit5.introspect.hf)
            recording = record_transformers(net, wanted, attention, tokens, info.layout, summariser)
            rec = stack.enter_context(recording)
        else:
            attention_layers = wanted if attention else []
            token_layers = wanted if tokens else []
            rec = Recording(info.depth, attention_layers, token_layers)
            for i in attention_layers:
                _hook_timm_attention(stack, net.blocks[i].attn, summariser(i))
            for i in token_layers:
                hook(net.blocks[i], lambda a, out, i=i: rec.tokens.update({i: out.detach()}))
        # after record's own: the blocks' longer sequence
        if info.family == "timm" or info.test_registers:

            def on_patches(args, out) -> None:
                rec.layout = info.layout(tuple(args[0].shape[-2:]))

            hook(net.patch_embed, on_patches)
        # after the recording hooks: hand over what the block produced, then drop it
        if on_layer is not None:
            for i in wanted:

                def hand_over(args, out, i=i) -> None:
                    summary = rec.summaries.pop(i, None)
                    on_layer(i, summary, rec.tokens.pop(i, None))

                hook(net.blocks[i], hand_over)
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
    # keep final-norm patch features of the last block for the first N images (PCA)
    keep_features: int = 0
    progress: bool = True
    # record every block's whole N x N attention (memory grows as N squared): for comparisons
    full_attention: bool = False
    # the attention-rollout row (TokenStats.rollout); it keeps q and k of every block (lean) or
    # the N x N product (full_attention) until the batch has run; off: rollout is None
    rollout: bool = True

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
    """Record all blocks of ``model`` (put in eval mode on ``cfg.device``) on ``images`` (all of
    one size, normalised with the model's own mean / std) into :class:`TokenStats`. Each block
    keeps :func:`figure_keep`; with ``cfg.rollout`` the rollout row comes from the kept q and k
    (:func:`rollout_row`), or with ``full_attention`` from the whole matrices
    (:func:`rollout_step`); each block's summary is reduced and dropped as soon as it has run."""
    sizes = {img.rgb.shape[:2] for img in images}
    if len(sizes) != 1:
        raise InputError(
            "all images of a run must share one size (metrics compare equal resolutions), got "
            f"{sorted(sizes)}"
        )
    info = recordable(model, info)
    layout = info.layout(sizes.pop())
    net = unwrap(model).eval().to(cfg.device)
    keep = figure_keep(layout, rollout=cfg.rollout and not cfg.full_attention)
    if cfg.full_attention:
        keep = AttentionKeep(rows=None, mass_to=keep.mass_to)
    arrays: dict[str, list[np.ndarray]] = {}  # name -> per batch
    starts = range(0, len(images), cfg.batch_size)
    rows: dict[str, list[torch.Tensor]] = {}  # of the current batch, block by block
    blocks: list[tuple[torch.Tensor, torch.Tensor, float]] = []
    product = None

    def reduce(block: int, summary: AttentionSummary, tokens: torch.Tensor) -> None:
        nonlocal product
        for key, value in layer_rows(summary, tokens, layout).items():
            rows.setdefault(key, []).append(value)
        if not cfg.rollout:
            return
        if cfg.full_attention:
            product = rollout_step(product, summary.full())
        else:
            blocks.append((summary.q, summary.k, summary.scale))

    progress = tqdm(starts, desc=f"recording {label}", unit="batch", disable=not cfg.progress)
    for start in progress:
        batch = images[start : start + cfg.batch_size]
        x = to_batch(batch, info.mean, info.std).to(cfg.device)
        with torch.no_grad(), capture(net, on_layer=reduce, info=info, keep=keep):
            out = net.forward_features(x)
        kept = max(0, min(len(batch), cfg.keep_features - start))
        found = {k: torch.stack(v, dim=1) for k, v in rows.items()}
        rows.clear()
        if cfg.rollout:
            found["rollout"] = _rollout(layout, len(batch), x.device, product, blocks)
        blocks.clear()
        product = None
        content = patch_content(np.stack([img.rgb for img in batch]), info.patch_size)
        if kept:
            found["features"] = layout.patches(out[:kept]).float()
        found = {k: v.cpu().numpy() for k, v in found.items()}
        found["pixel_variance"] = content.variance
        found["variance_percentile"] = content.variance_percentile
        found["neighbour_cosine"] = content.neighbour_cosine
        for name, values in found.items():
            arrays.setdefault(name, []).append(values)
    names = [img.name for img in images]
    joined = {k: np.concatenate(v) for k, v in arrays.items()}
    joined.setdefault("rollout", None)
    return TokenStats(label, layout, list(range(info.depth)), names, info.patch_size, **joined)


def _rollout(
    layout: TokenLayout,
    batch: int,
    device: torch.device,
    product: torch.Tensor | None,
    blocks: Sequence[tuple[torch.Tensor, torch.Tensor, float]],
) -> torch.Tensor:
    """The drawn rollout row ``[B, N]``: :func:`rollout_start` times the full product of a full
    capture (``product``), else :func:`rollout_row` over the blocks' kept q and k."""
    with torch.no_grad():
        first = rollout_start(layout, batch, device)
        if product is not None:
            return (first[:, None] @ product)[:, 0]
        return rollout_row(first, blocks)


def layer_rows(
    summary: AttentionSummary, tokens: torch.Tensor, layout: TokenLayout
) -> dict[str, torch.Tensor]:
    """What is kept of one block's attention ``summary`` (:func:`figure_keep`) and ``tokens
    [B, N, C]``: ``norms [B, N]``, ``received [B, H, N]`` (mean over all queries),
    ``head_entropy`` / ``head_peak [B, H]`` (means over queries of each row's entropy and
    largest weight), the :func:`massive_activations`, and with CLS / registers
    ``cls_attn [B, H, N]``, ``reg_attn [B, H, R, N]`` (register queries' rows) and
    ``patch_to_reg [B, H]`` (register mass of each patch query, averaged over patch queries)."""
    rows = {
        "norms": tokens.float().norm(dim=-1),
        "received": summary.received,
        "head_entropy": summary.entropy.mean(dim=-1),
        "head_peak": summary.peak.mean(dim=-1),
        **massive_activations(tokens),
    }
    if layout.cls_index is not None:
        # a copy: the row of a full capture would keep the whole N x N matrix alive
        rows["cls_attn"] = summary.row(layout.cls_index).clone()
    if layout.num_registers:
        registers = range(layout.register_slice.start, layout.register_slice.stop)
        rows["reg_attn"] = torch.stack([summary.row(r) for r in registers], dim=2)
        rows["patch_to_reg"] = layout.patches(summary.mass_to, dim=2).mean(dim=-1)
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
    """One layer of attention rollout (Abnar and Zuidema, ACL 2020) on a full capture:
    ``[B, heads, N, N]`` averaged over heads, mixed half and half with the identity for the
    residual path, renormalised per row and multiplied onto ``acc [B, N, N]`` (None at the
    start). Registers are ordinary columns, sliced off by the layout."""
    fused = attention.float().mean(dim=1)
    eye = torch.eye(fused.shape[-1], device=fused.device, dtype=fused.dtype)
    mixed = 0.5 * eye + 0.5 * fused
    mixed = mixed / mixed.sum(dim=-1, keepdim=True)
    return mixed if acc is None else mixed @ acc


def rollout_start(layout: TokenLayout, batch: int, device: torch.device) -> torch.Tensor:
    """The row of the rollout product that is drawn ``[B, N]``: CLS's (one-hot), or without
    CLS the mean of the patch rows (uniform over the patches)."""
    start = torch.zeros(batch, layout.num_tokens, device=device)
    if layout.cls_index is not None:
        start[:, layout.cls_index] = 1.0
    else:
        start[:, layout.patch_slice] = 1.0 / layout.num_patches
    return start


def rollout_row(
    start: torch.Tensor,
    blocks: Sequence[tuple[torch.Tensor, torch.Tensor, float]],
    chunk: int | None = None,
) -> torch.Tensor:
    """``start [B, N]`` times the rollout product ``M_L ... M_1`` (:func:`rollout_step`'s, with
    ``M = 0.5 I + 0.5 mean_h A``) from each block's ``(q, k, scale)``: walking from the last
    block back, ``r <- 0.5 r + 0.5 mean_h(r A_h)`` with :func:`received_from` (``chunk`` query
    rows at a time; None: :func:`vit5.model.capture.query_chunk`), so no ``N x N`` is held.
    Softmax rows sum to one, so ``M``'s rows do too and the renormalisation of
    :func:`rollout_step` is the identity (up to rounding)."""
    row = start.float()
    for q, k, scale in reversed(blocks):
        mixed = received_from(q, k, scale, row, chunk).mean(dim=1)
        row = 0.5 * row + 0.5 * mixed
    return row
