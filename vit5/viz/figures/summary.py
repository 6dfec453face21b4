"""Summary grid for a set of images: one row per image, one column per view, one scale per column."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from vit5.viz.figures.base import MapStyle, Panel, panel_grid
from vit5.viz.images import LoadedImage
from vit5.viz.maps import cls_maps, norm_map, rollout_map
from vit5.viz.stats import TokenStats


def summary_figure(
    stats: TokenStats,
    images: Sequence[LoadedImage],
    views: Sequence[str],
    attention_layer: int,
    norm_layer: int,
    style: MapStyle,
    pca: np.ndarray | None = None,
    renormalise: bool = False,
    notes: Sequence[str] = (),
) -> Figure:
    """``views`` among ``attention`` (CLS head mean), ``rollout``, ``norms``, ``pca`` (``pca [B, h, w, 3]``).

    Layers are block indices (-1: the last). Images follow ``stats`` order (image ``i`` is row ``i``).
    """
    p = stats.patch_size
    at_attention = stats.layers[stats.layer_position(attention_layer)]
    at_norm = stats.layers[stats.layer_position(norm_layer)]
    rows = []
    for i, image in enumerate(images):
        row = [Panel(image.name, image=image.rgb, patch=p)]
        if "attention" in views and stats.cls_attn is not None:
            row.append(
                Panel(
                    f"CLS attention, layer {at_attention}",
                    cls_maps(stats, i, attention_layer, renormalise).mean(0),
                    image.rgb,
                    group="CLS attention",
                    patch=p,
                )
            )
        if "rollout" in views:
            row.append(Panel("rollout", rollout_map(stats, i), image.rgb, group="rollout", patch=p))
        if "norms" in views:
            row.append(
                Panel(
                    f"norms, layer {at_norm}",
                    norm_map(stats, i, norm_layer),
                    image.rgb,
                    group="norms",
                    patch=p,
                )
            )
        if "pca" in views and pca is not None:
            row.append(Panel("PCA RGB", rgb=pca[i], patch=p))
        rows.append(row)
    return panel_grid(
        rows, style, f"{stats.model}: summary of {len(images)} images (one colour scale per column)", notes
    )
