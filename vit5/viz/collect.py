"""Run a model over images in batches and reduce what it records into :class:`TokenStats`.

Every block is recorded. Each block's ``[B, heads, N, N]`` attention is reduced the moment the
block has run (CLS and register rows, attention received per key, patch-to-register mass, one
rollout step), so memory holds one block's attention at a time, whatever the depth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from vit5.errors import InputError
from vit5.introspect import describe
from vit5.model import TokenLayout
from vit5.model.vit import unwrap
from vit5.viz.capture import capture
from vit5.viz.content import patch_content
from vit5.viz.images import LoadedImage, to_batch
from vit5.viz.rollout import HeadFusion, rollout_source_row, rollout_step
from vit5.viz.stats import TokenStats


@dataclass(frozen=True)
class CollectConfig:
    batch_size: int = 8
    device: str = "cpu"
    keep_features: int = 0  # keep final-norm patch features of the last block for the first N images (PCA)
    head_fusion: HeadFusion = "mean"  # rollout
    progress: bool = True

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise InputError(f"batch size must be at least 1, got {self.batch_size}")


def collect(
    model: nn.Module, images: Sequence[LoadedImage], label: str, cfg: CollectConfig = CollectConfig()
) -> TokenStats:
    """Record all blocks of ``model`` on ``images`` (all of one size) into :class:`TokenStats`.

    The model is put in eval mode on ``cfg.device``; images are normalised with its own mean / std.
    """
    sizes = {img.rgb.shape[:2] for img in images}
    if len(sizes) != 1:
        raise InputError(
            "all images of a run must share one size (metrics compare equal resolutions), got "
            f"{sorted(sizes)}"
        )
    info = describe(model)
    layout = info.layout(sizes.pop())
    net = unwrap(model).eval().to(cfg.device)
    parts = []
    starts = range(0, len(images), cfg.batch_size)
    for start in tqdm(starts, desc=f"recording {label}", unit="batch", disable=not cfg.progress):
        batch = images[start : start + cfg.batch_size]
        reducer = _BatchReducer(layout, cfg.head_fusion)
        x = to_batch(batch, info.mean, info.std).to(cfg.device)
        with torch.no_grad(), capture(net, on_layer=reducer) as rec:
            out = net.forward_features(x)
        if rec.layout != layout:
            raise RuntimeError(f"recorded layout {rec.layout} differs from the expected {layout}")
        kept = max(0, min(len(batch), cfg.keep_features - start))
        features = layout.patches(out[:kept]).float().cpu().numpy() if kept else None
        names = [img.name for img in batch]
        part = reducer.stats(label, list(range(info.depth)), names, info.patch_size, features)
        content = patch_content(np.stack([img.rgb for img in batch]), info.patch_size)
        part.pixel_variance, part.variance_percentile = content.variance, content.variance_percentile
        part.neighbour_cosine = content.neighbour_cosine
        parts.append(part)
    return TokenStats.concat(parts)


def layer_rows(attention: torch.Tensor, tokens: torch.Tensor, layout: TokenLayout) -> dict[str, torch.Tensor]:
    """What is kept of one block: ``attention [B, H, N, N]`` and ``tokens [B, N, C]`` reduced per image.

    ``norms [B, N]``, ``received [B, H, N]`` (mean over queries), the :func:`massive_activations`,
    ``cls_attn [B, H, N]`` (the CLS query's row), ``reg_attn [B, H, R, N]`` (register queries' rows)
    and ``patch_to_reg [B, H]`` (register mass of each patch query, averaged over patch queries);
    the last three only when the layout has CLS / registers.
    """
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


MASSIVE_TOP = 3
ROW_KEYS = (
    "norms",
    "received",
    "cls_attn",
    "reg_attn",
    "patch_to_reg",
    "massive_top",
    "massive_token",
    "massive_channel",
    "massive_median",
)


def massive_activations(tokens: torch.Tensor, top: int = MASSIVE_TOP) -> dict[str, torch.Tensor]:
    """Massive activations of one block output ``[B, N, C]`` (Sun et al., arXiv 2402.17762, section 2, and
    their ViT code, locuslab/massive-activations ``main_vit.py``: the top magnitudes of the hidden state
    against its median magnitude).

    ``massive_top [B, top]`` the largest ``|x|`` over all tokens and channels, ``massive_token`` /
    ``massive_channel [B, top]`` where they sit, and ``massive_median [B]`` the median ``|x|``
    (the mean of the two middle values for an even count, as numpy's median).
    """
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


class _BatchReducer:
    """``on_layer`` callback: keeps :func:`layer_rows` of every block of one batch, in block order."""

    def __init__(self, layout: TokenLayout, head_fusion: HeadFusion) -> None:
        self.layout = layout
        self.head_fusion = head_fusion
        self.rows: dict[str, list[torch.Tensor]] = {k: [] for k in ROW_KEYS}
        self.rollout: torch.Tensor | None = None

    def __call__(self, block: int, attention: torch.Tensor | None, tokens: torch.Tensor | None) -> None:
        for key, value in layer_rows(attention, tokens, self.layout).items():
            self.rows[key].append(value)
        self.rollout = rollout_step(self.rollout, attention, self.head_fusion)

    def stats(
        self, label: str, layers: list[int], names: list[str], patch: int, features: np.ndarray | None
    ) -> TokenStats:
        arrays = {k: torch.stack(v, dim=1).cpu().numpy() if v else None for k, v in self.rows.items()}
        rollout = rollout_source_row(self.rollout, self.layout).cpu().numpy()
        return TokenStats(
            label, self.layout, layers, names, patch, rollout=rollout, features=features, **arrays
        )
