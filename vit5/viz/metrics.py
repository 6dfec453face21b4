"""Artifact metrics (M1-M3, M5-M8, M10) as pure functions of stored arrays.

Inputs are the arrays of :class:`~vit5.viz.stats.TokenStats` (B images, L consecutive blocks,
H heads, P patches, R registers, N tokens); every metric returns per-image, per-layer values
``[B, L]`` so that intervals can be bootstrapped over images (``report.py``). Norms are L2 norms
of block outputs before the final norm. Thresholds are relative (robust statistics of log-norms),
never Darcet's absolute 150, which is specific to DINOv2 ViT-g.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation


# ---------------------------------------------------------------------------- M1 outlier tokens
def log_mad_threshold(norms: np.ndarray, k: float = 5.0) -> float:
    """``tau = exp(median(u) + k * 1.4826 * MAD(u))`` with ``u = log(norms)`` pooled over all values."""
    u = np.log(np.asarray(norms, dtype=np.float64)[np.asarray(norms) > 0])
    if u.size == 0:
        return float("nan")
    median = np.median(u)
    mad = np.median(np.abs(u - median))
    return float(np.exp(median + k * MAD_TO_SIGMA * mad))


def layer_thresholds(patch_norms: np.ndarray, k: float = 5.0) -> np.ndarray:
    """One :func:`log_mad_threshold` per layer, pooled over images and patches: ``[B, L, P] -> [L]``."""
    return np.array([log_mad_threshold(patch_norms[:, layer], k) for layer in range(patch_norms.shape[1])])


def outlier_mask(norms: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """``[B, L, T]`` tokens whose norm exceeds their layer's threshold ``[L]``."""
    return norms > np.asarray(thresholds)[None, :, None]


def outlier_ratio(norms: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """M1: share of the given tokens ``[B, L, T]`` above the threshold, per image and layer."""
    return outlier_mask(norms, thresholds).mean(axis=-1)


# ---------------------------------------------------------------------------- M2, M3 norm shape
def max_median_ratio(patch_norms: np.ndarray) -> np.ndarray:
    """M2: ``max / median`` of the patch norms of each image and layer."""
    return patch_norms.max(axis=-1) / np.median(patch_norms, axis=-1)


def excess_kurtosis(patch_norms: np.ndarray) -> np.ndarray:
    """M3: ``E[(n - mu)^4] / sigma^4 - 3`` over the patches of each image and layer (NaN if constant)."""
    centred = patch_norms - patch_norms.mean(axis=-1, keepdims=True)
    m2 = (centred**2).mean(axis=-1)
    m4 = (centred**4).mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(m2 > 0, m4 / m2**2 - 3.0, np.nan)


# ---------------------------------------------------------------------------- M5, M6 CLS attention
def _renormalised(cls_to_patches: np.ndarray) -> np.ndarray:
    return cls_to_patches / cls_to_patches.sum(axis=-1, keepdims=True)


def cls_entropy(cls_to_patches: np.ndarray) -> np.ndarray:
    """M5: entropy of CLS attention renormalised over patches, divided by ``log P`` (in [0, 1]).

    ``[B, L, H, P] -> [B, L]``, averaged over heads. 1 = uniform over patches, 0 = one patch.
    """
    p = _renormalised(cls_to_patches)
    entropy = -(p * np.log(np.clip(p, 1e-30, None))).sum(axis=-1)
    num_patches = cls_to_patches.shape[-1]
    return (
        (entropy / np.log(num_patches)).mean(axis=-1)
        if num_patches > 1
        else np.full(entropy.shape[:2], np.nan)
    )


def cls_effective_tokens(cls_to_patches: np.ndarray) -> np.ndarray:
    """M5 companion: ``exp(entropy)`` of the renormalised CLS attention, averaged over heads."""
    p = _renormalised(cls_to_patches)
    return np.exp(-(p * np.log(np.clip(p, 1e-30, None))).sum(axis=-1)).mean(axis=-1)


def outlier_attention_mass(cls_to_patches: np.ndarray, patch_outliers: np.ndarray) -> np.ndarray:
    """M6: raw CLS attention on the outlier patches *entering* each block, averaged over heads.

    ``cls_to_patches [B, L, H, P]`` (raw, not renormalised) and ``patch_outliers [B, L, P]`` of
    consecutive blocks: block ``l`` attends over the outputs of block ``l - 1``, so its outlier set
    is block ``l - 1``'s. Block 0 reads the patch embeddings, which are not recorded: NaN. Any
    attention rows work in place of CLS's, e.g. the attention each patch receives averaged over
    all queries (``received_outlier_mass``, for models without CLS).
    """
    mass = np.full(cls_to_patches.shape[:2], np.nan)
    mass[:, 1:] = (cls_to_patches[:, 1:] * patch_outliers[:, :-1, None, :]).sum(axis=-1).mean(axis=-1)
    return mass


def max_patch_attention(cls_to_patches: np.ndarray) -> np.ndarray:
    """M6 companion (TTR's curve): the largest CLS-to-patch attention over heads and patches."""
    return cls_to_patches.max(axis=(-2, -1))


# ---------------------------------------------------------------------------- M7 register / sink mass
def register_mass(rows_to_registers: np.ndarray) -> np.ndarray:
    """M7: attention mass on all registers ``[B, L, H, R] -> [B, L]``, summed over registers, head mean."""
    return rows_to_registers.sum(axis=-1).mean(axis=-1)


def topk_received(received: np.ndarray, keys: Sequence[int], k: int) -> tuple[np.ndarray, np.ndarray]:
    """M7 ``S_topK``: the ``k`` keys (among ``keys``) receiving most attention per head.

    ``received [B, L, H, N]`` (attention received by each key, averaged over queries). Returns the
    summed mass of the top ``k`` ``[B, L]`` (head mean) and their token indices ``[B, L, H, k]``.
    """
    keys = np.asarray(keys)
    sub = received[..., keys]
    order = np.argsort(-sub, axis=-1)[..., :k]
    mass = np.take_along_axis(sub, order, axis=-1).sum(axis=-1).mean(axis=-1)
    return mass, keys[order]


# ---------------------------------------------------------------------------- M8 sinks
def sink_heads(received: np.ndarray, eps: float = 0.3) -> np.ndarray:
    """``[B, L, H]`` heads in which one key receives more than ``eps`` of the average attention."""
    return received.max(axis=-1) > eps


def sink_rate(received: np.ndarray, eps: float = 0.3) -> np.ndarray:
    """M8 (after Gu et al.): share of heads with a sink, per image and layer."""
    return sink_heads(received, eps).mean(axis=-1)


def sink_rate_by_type(
    received: np.ndarray, token_types: Sequence[str], eps: float = 0.3
) -> dict[str, np.ndarray]:
    """M8 broken down by the type (``cls`` / ``register`` / ``patch``) of each head's sink key.

    The values of all types add up to :func:`sink_rate`.
    """
    types = np.asarray(token_types)
    sink_type = types[received.argmax(axis=-1)]  # [B, L, H]
    has_sink = sink_heads(received, eps)
    return {t: (has_sink & (sink_type == t)).mean(axis=-1) for t in ("cls", "register", "patch")}


# ---------------------------------------------------------------------------- M10 massive activations
def massive_ratio(top1: np.ndarray, median: np.ndarray) -> np.ndarray:
    """M10 (Sun et al., arXiv 2402.17762, section 2): largest ``|activation|`` over the median
    ``|activation|`` of a hidden state, per image and layer (NaN where the median is 0). The LLM
    rule "> 100 and ~1000x the median" is not applied: ViT values are far smaller, so the ratio is reported
    as is."""
    top1, median = np.asarray(top1, dtype=np.float64), np.asarray(median, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(median > 0, top1 / median, np.nan)


def massive_location(token: np.ndarray, channel: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Per layer, the (token, channel) most often holding the largest activation, how many images it
    does, and how many (token, channel) pairs share that count (1: a unique mode).

    ``token``, ``channel [B, L]`` (the top-1 of each image). Among tied pairs the lowest token, then
    channel is returned, so callers must report the tie (a "mode" of 5 images that all differ is none).
    """
    found = []
    for layer in range(token.shape[1]):
        pairs, counts = np.unique(
            np.stack([token[:, layer], channel[:, layer]], axis=1), axis=0, return_counts=True
        )
        best = int(np.argmax(counts))
        tied = int((counts == counts[best]).sum())
        found.append((int(pairs[best, 0]), int(pairs[best, 1]), int(counts[best]), tied))
    return found
