"""Attention figures: CLS-to-patch maps per head and head mean, register-to-patch maps, rollout."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from vit5.viz.figures.base import MapStyle, Panel, panel_grid
from vit5.viz.images import LoadedImage
from vit5.viz.maps import cls_maps, register_maps, rollout_map
from vit5.viz.stats import TokenStats

RAW = "raw: share of all tokens, so CLS and registers hold the rest"
RENORMALISED = "renormalised over the patches"


def _kind(renormalise: bool) -> tuple[str, str]:
    """(short word for the title, the sentence for the note)."""
    return ("renormalised", RENORMALISED) if renormalise else ("raw", RAW)


def cls_attention_figure(
    stats: TokenStats,
    index: int,
    image: LoadedImage,
    layers: Sequence[int],
    style: MapStyle,
    renormalise: bool = False,
    notes: Sequence[str] = (),
) -> Figure:
    """One row per layer: every head and the head mean; one colour scale per layer (shared by its heads)."""
    rows = []
    for layer in layers:
        maps = cls_maps(stats, index, layer, renormalise)
        group = f"layer {layer}"
        row = [
            Panel(f"layer {layer} head {h}", m, image.rgb, group=group, patch=stats.patch_size)
            for h, m in enumerate(maps)
        ]
        row.append(
            Panel(
                f"layer {layer} head mean", maps.mean(axis=0), image.rgb, group=group, patch=stats.patch_size
            )
        )
        rows.append(row)
    word, sentence = _kind(renormalise)
    return panel_grid(
        rows, style, f"{stats.model} | {image.name}: CLS-to-patch attention ({word})", [sentence, *notes]
    )


def register_attention_figure(
    stats: TokenStats,
    index: int,
    image: LoadedImage,
    layers: Sequence[int],
    style: MapStyle,
    notes: Sequence[str] = (),
) -> Figure:
    """One row per layer, one panel per register (head mean, raw); one colour scale per layer."""
    rows = []
    for layer in layers:
        maps = register_maps(stats, index, layer)
        rows.append(
            [
                Panel(
                    f"layer {layer} register {r}",
                    m,
                    image.rgb,
                    group=f"layer {layer}",
                    patch=stats.patch_size,
                )
                for r, m in enumerate(maps)
            ]
        )
    return panel_grid(
        rows, style, f"{stats.model} | {image.name}: register-to-patch attention (head mean)", [RAW, *notes]
    )


def rollout_figure(
    stats: TokenStats, index: int, image: LoadedImage, style: MapStyle, notes: Sequence[str] = ()
) -> Figure:
    """Attention rollout over all blocks, on the image and alone (one colour scale)."""
    values = rollout_map(stats, index)
    source = "CLS" if stats.layout.cls_index is not None else "mean patch"
    panels = [
        Panel("on the image", values, image.rgb, group="rollout", patch=stats.patch_size),
        Panel("map", values, group="rollout", patch=stats.patch_size),
    ]
    title = f"{stats.model} | {image.name}: attention rollout"
    how = f"{source} row, head mean, 0.5 identity (Abnar & Zuidema 2020)"
    return panel_grid([panels], style, title, [how, *notes])
