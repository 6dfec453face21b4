"""The "garbage collector" figure: two models side by side on the same images, shared scales.

Rows are CLS-to-patch attention (head mean) and patch-token norms; one colour scale per row for
both models, so a model whose attention or norms concentrate on a few background tokens stands
out against its twin (Darcet et al. 2023, Fig. 1 and 7). A model without CLS token shows instead
the attention each patch receives, averaged over all queries and heads (its sinks), on a scale of
its own kind. Models may differ in patch size as long as both grids tile the same image.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from vit5.viz.figures.base import MapStyle, Panel, panel_grid
from vit5.viz.images import LoadedImage
from vit5.viz.maps import cls_maps, norm_map, received_map
from vit5.viz.stats import TokenStats


def _model_panels(
    stats: TokenStats,
    index: int,
    image: LoadedImage,
    attention_layer: int,
    norm_layer: int,
    renormalise: bool,
) -> tuple[Panel, Panel]:
    at_attention = stats.layers[stats.layer_position(attention_layer)]
    if stats.cls_attn is not None:
        attention, kind = cls_maps(stats, index, attention_layer, renormalise).mean(axis=0), "CLS attention"
    else:
        attention, kind = received_map(stats, index, attention_layer), "attention received"
    norms = norm_map(stats, index, norm_layer)
    at_norm = stats.layers[stats.layer_position(norm_layer)]
    return (
        Panel(
            f"{stats.model}: {kind}, layer {at_attention}",
            attention,
            image.rgb,
            group=kind,
            patch=stats.patch_size,
        ),
        Panel(
            f"{stats.model}: norms, layer {at_norm}", norms, image.rgb, group="norms", patch=stats.patch_size
        ),
    )


def compare_figure(
    models: Sequence[TokenStats],
    index: int,
    image: LoadedImage,
    attention_layer: int,
    norm_layer: int,
    style: MapStyle,
    renormalise: bool = False,
    notes: Sequence[str] = (),
) -> Figure:
    """Columns: the image then each model; rows: attention and norms. Layers are block indices (-1: each
    model's last)."""
    panels = [_model_panels(s, index, image, attention_layer, norm_layer, renormalise) for s in models]
    rows = [
        [Panel("image", image=image.rgb, patch=models[0].patch_size), *(p[0] for p in panels)],
        [None, *(p[1] for p in panels)],
    ]
    names = " vs ".join(s.model for s in models)
    return panel_grid(rows, style, f"{image.name}: {names} (shared colour scale per row)", notes)


def compare_summary_figure(
    models: Sequence[TokenStats],
    images: Sequence[LoadedImage],
    attention_layer: int,
    norm_layer: int,
    style: MapStyle,
    renormalise: bool = False,
    notes: Sequence[str] = (),
) -> Figure:
    """One row per image: the image, every model's attention, every model's norms; one scale per kind over
    all rows."""
    rows = []
    for index, image in enumerate(images):
        panels = [_model_panels(s, index, image, attention_layer, norm_layer, renormalise) for s in models]
        rows.append(
            [
                Panel(image.name, image=image.rgb, patch=models[0].patch_size),
                *(p[0] for p in panels),
                *(p[1] for p in panels),
            ]
        )
    names = " vs ".join(s.model for s in models)
    return panel_grid(
        rows, style, f"{names}: attention and token norms (shared colour scale per kind)", notes
    )
