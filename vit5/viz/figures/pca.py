"""PCA figure: the first three components of the patch features as RGB, next to the image."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from vit5.viz.figures.base import MapStyle, Panel, panel_grid
from vit5.viz.images import LoadedImage
from vit5.viz.pca import CLIP_PERCENTILES


def pca_note(variance: np.ndarray) -> str:
    lo, hi = CLIP_PERCENTILES
    shares = ", ".join(f"PC{i + 1} {v:.0%}" for i, v in enumerate(variance))
    return (
        "RGB = PC1, PC2, PC3 of the final-norm patch features, one PCA over all images (variance: "
        f"{shares}); "
        f"each component clipped to its {lo:g}-{hi:g}th percentiles (no colorbar: a 3-channel map)"
    )


def pca_figure(
    model: str,
    image: LoadedImage,
    rgb: np.ndarray,
    variance: np.ndarray,
    patch: int,
    style: MapStyle,
    notes: Sequence[str] = (),
) -> Figure:
    panels = [
        Panel("image", image=image.rgb, patch=patch),
        Panel("PCA of patch features", rgb=rgb, patch=patch),
    ]
    return panel_grid(
        [panels], style, f"{model} | {image.name}: PCA of dense features", [*notes, pca_note(variance)]
    )
