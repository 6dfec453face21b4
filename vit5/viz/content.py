"""Where high-norm outliers sit relative to the image's content. Darcet et al. (arXiv 2309.16588, sec. 2.1,
Fig. 5) find true artifacts on patches redundant with their neighbours, so an outlier is *artifact-like*
when its input patch is flat (pixel-variance percentile <= ``FLAT_PERCENTILE``) and like its 4-neighbours
(mean cosine of centred pixels >= ``REDUNDANT_COSINE``), *content-like* otherwise."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLAT_PERCENTILE = 0.5  # in the flatter half of its image's patches
REDUNDANT_COSINE = 0.5  # and similar to its neighbours
_EPS = 1e-6  # pixel-vector norm (in [0, 1] units) below which a centred patch counts as the mean colour


@dataclass(frozen=True)
class PatchContent:
    """Per image and patch ``[B, P]`` (row-major over the patch grid): the input's local information."""

    variance: np.ndarray  # pixel variance, pixels in [0, 1]
    variance_percentile: np.ndarray  # rank among the image's patches, in [0, 1]
    neighbour_cosine: np.ndarray  # mean cosine of the centred pixel vector to its 4-neighbours

    @property
    def artifact_like(self) -> np.ndarray:
        """``[B, P]`` flat, neighbour-redundant patches: where an outlier is artifact-like."""
        return (self.variance_percentile <= FLAT_PERCENTILE) & (self.neighbour_cosine >= REDUNDANT_COSINE)


def patch_content(rgb: np.ndarray, patch: int) -> PatchContent:
    """``rgb [B, H, W, 3]`` (uint8, the pixels the model saw; H, W multiples of ``patch``)."""
    x = np.asarray(rgb, dtype=np.float64) / 255.0
    b, height, width, c = x.shape
    h, w = height // patch, width // patch
    patches = x.reshape(b, h, patch, w, patch, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, h, w, -1)
    variance = patches.var(axis=-1)  # [B, h, w]
    flat = np.round(variance.reshape(b, -1), 12)  # float noise of constant patches is a tie, not an order
    # percentile rank with ties at their mean rank, 0 for the flattest, 1 for the most varied
    order = flat.argsort(axis=1, kind="stable").argsort(axis=1).astype(np.float64)
    ranks = np.stack([_tie_mean(flat[i], order[i]) for i in range(b)])
    percentile = ranks / max(1, flat.shape[1] - 1)
    mean_colour = x.mean(axis=(1, 2))[:, None, None, :]  # [B, 1, 1, 3]; a patch vector is (row, col, rgb)
    centred = patches - np.tile(mean_colour, (1, 1, 1, patch * patch))
    norms = np.linalg.norm(centred, axis=-1)
    cosine_sum, count = np.zeros((b, h, w)), np.zeros((1, h, w))
    for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        rows = slice(max(0, -dr), h - max(0, dr))
        cols = slice(max(0, -dc), w - max(0, dc))
        nrows = slice(max(0, dr), h - max(0, -dr))
        ncols = slice(max(0, dc), w - max(0, -dc))
        cosine_sum[:, rows, cols] += _cosine(
            centred[:, rows, cols], centred[:, nrows, ncols], norms[:, rows, cols], norms[:, nrows, ncols]
        )
        count[:, rows, cols] += 1
    cosine = cosine_sum / np.maximum(count, 1)
    return PatchContent(flat, percentile, cosine.reshape(b, -1))


def _tie_mean(values: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Ranks of equal values replaced by their mean (a constant image ranks every patch 0.5)."""
    out = ranks.copy()
    unique, inverse = np.unique(values, return_inverse=True)
    if unique.size < values.size:
        sums = np.bincount(inverse, weights=ranks)
        out = (sums / np.bincount(inverse))[inverse]
    return out


def _cosine(a: np.ndarray, b: np.ndarray, na: np.ndarray, nb: np.ndarray) -> np.ndarray:
    """Cosine of centred pixel vectors; two patches both at the mean colour are identical (1), one at the
    mean and one not are unrelated (0)."""
    both_flat = (na < _EPS) & (nb < _EPS)
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = (a * b).sum(axis=-1) / (na * nb)
    cos = np.where((na < _EPS) | (nb < _EPS), 0.0, cos)
    return np.where(both_flat, 1.0, cos)


def outlier_artifact_share(outliers: np.ndarray, content: PatchContent) -> np.ndarray:
    """``outliers [B, L, P]`` -> ``[B, L]``: share of an image's outliers that are artifact-like (NaN
    where it has none)."""
    count = outliers.sum(axis=-1)
    artifact = (outliers & content.artifact_like[:, None, :]).sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(count > 0, artifact / count, np.nan)


def classify_outliers(outliers: np.ndarray, content: PatchContent, layers: list[int]) -> list[dict]:
    """Per layer, pooled over images: the outlier count, how many are artifact-like / content-like, and the
    median variance percentile and neighbour cosine of their input patches."""
    found = []
    for pos, layer in enumerate(layers):
        mask = outliers[:, pos]
        n = int(mask.sum())
        artifact = int((mask & content.artifact_like).sum())
        found.append(
            dict(
                layer=layer,
                outliers=n,
                artifact_like=artifact,
                content_like=n - artifact,
                artifact_share=artifact / n if n else None,
                median_variance_percentile=float(np.median(content.variance_percentile[mask])) if n else None,
                median_neighbour_cosine=float(np.median(content.neighbour_cosine[mask])) if n else None,
            )
        )
    return found
