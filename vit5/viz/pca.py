"""PCA of dense patch features, first three components as RGB (the DINOv2 README figure).

One PCA is fitted on the patch tokens of all images together, so a colour means the same feature
direction in every image. Each component is scaled to [0, 1] between its 1st and 99th
percentiles over all images and clipped; the figures state this clipping.
"""

from __future__ import annotations

import numpy as np
from sklearn.decomposition import PCA

from vit5.errors import InputError

CLIP_PERCENTILES = (1.0, 99.0)


def pca_rgb(
    features: np.ndarray, grid: tuple[int, int], percentiles: tuple[float, float] = CLIP_PERCENTILES
) -> tuple[np.ndarray, np.ndarray]:
    """``features [B, P, C]`` (P = h * w) to RGB maps ``[B, h, w, 3]`` in [0, 1] and the explained variance
    ratios ``[3]``."""
    b, p, c = features.shape
    if p != grid[0] * grid[1]:
        raise InputError(f"{p} patch features do not fill a {grid[0]}x{grid[1]} grid")
    flat = features.reshape(b * p, c).astype(np.float64)
    if flat.shape[0] < 3 or c < 3:
        raise InputError(
            f"PCA to RGB needs at least 3 patch tokens and 3 channels, got {flat.shape[0]} tokens of {c} "
            "channels"
        )
    pca = PCA(n_components=3, svd_solver="full", random_state=0)
    comps = pca.fit_transform(flat)
    lo, hi = np.percentile(comps, percentiles, axis=0)
    scaled = np.clip((comps - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0, 1.0)
    return scaled.reshape(b, *grid, 3), pca.explained_variance_ratio_
