"""The outlier rule of the artifact metrics (log-norm median + k MAD, robust to the outliers it
finds), shared by the viz metrics (:mod:`vit5.viz.artifacts`, which re-exports it) and the dense
features (per-image artifact score, ``--clean drop-outliers``). It sits in eval because eval is
below viz (docs/architecture.md)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

# MAD of a normal distribution times this is its standard deviation
MAD_TO_SIGMA = 1.4826


def log_mad_threshold(norms: np.ndarray, k: float = 5.0) -> float:
    """``tau = exp(median(u) + k * 1.4826 * MAD(u))`` with ``u = log(norms)`` pooled over all values."""
    u = np.log(np.asarray(norms, dtype=np.float64)[np.asarray(norms) > 0])
    if u.size == 0:
        return float("nan")
    median = np.median(u)
    return float(np.exp(median + k * MAD_TO_SIGMA * np.median(np.abs(u - median))))


def outlier_ratio(norms: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """M1: share of the given tokens ``[B, L, T]`` above their layer's threshold ``[L]``."""
    return (norms > np.asarray(thresholds)[None, :, None]).mean(axis=-1)


def max_median_ratio(patch_norms: np.ndarray) -> np.ndarray:
    """M2: max / median patch norm over the last axis."""
    return patch_norms.max(axis=-1) / np.median(patch_norms, axis=-1)


def artifact_score(patch_norms: np.ndarray, k: float = 5.0) -> dict[str, float]:
    """One image's artifact score from its patch norms ``[P]`` (one block, before the final
    norm): its own log-MAD threshold, the share of patches above it (M1) and max / median (M2)."""
    tau = log_mad_threshold(patch_norms, k)
    share = outlier_ratio(patch_norms[None, None], np.array([tau]))[0, 0]
    return {
        "threshold": tau,
        "outlier_share": float(share),
        "max_median": float(max_median_ratio(patch_norms)),
    }


def fill_outliers(grid: torch.Tensor, outliers: torch.Tensor) -> torch.Tensor:
    """``grid [C, h, w]`` with each outlier cell (``outliers [h, w]`` True) replaced by the mean
    of its non-outlier 3x3 neighbours; one without any keeps its value."""
    keep = (~outliers).to(torch.float64)[None, None]  # [1, 1, h, w]
    values = grid.to(torch.float64)[None]
    ones = torch.ones(1, 1, 3, 3, dtype=torch.float64)
    counts = F.conv2d(keep, ones, padding=1)
    sums = F.conv2d((values * keep).transpose(0, 1), ones, padding=1).transpose(
        0, 1
    )  # [1, C, h, w], channel by channel
    filled = torch.where(counts > 0, sums / counts.clamp_min(1), values)
    out = torch.where(outliers[None, None], filled, values)[0]
    return out.to(grid.dtype)
