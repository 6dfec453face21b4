"""Artifact metrics (M1-M3, M5-M8, M10) as pure functions of :class:`~vit5.viz.stats.TokenStats` arrays.

Every metric returns per-image, per-layer values ``[B, L]``, so intervals are bootstrapped over images.
Thresholds are relative (robust statistics of log-norms), never Darcet's absolute 150 (DINOv2 ViT-g).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation


def log_mad_threshold(norms: np.ndarray, k: float = 5.0) -> float:
    """``tau = exp(median(u) + k * 1.4826 * MAD(u))`` with ``u = log(norms)`` pooled over all values."""
    u = np.log(np.asarray(norms, dtype=np.float64)[np.asarray(norms) > 0])
    if u.size == 0:
        return float("nan")
    median = np.median(u)
    return float(np.exp(median + k * MAD_TO_SIGMA * np.median(np.abs(u - median))))


def layer_thresholds(patch_norms: np.ndarray, k: float = 5.0) -> np.ndarray:
    """One :func:`log_mad_threshold` per layer, pooled over images and patches: ``[B, L, P] -> [L]``."""
    return np.array([log_mad_threshold(patch_norms[:, layer], k) for layer in range(patch_norms.shape[1])])


def outlier_ratio(norms: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """M1: share of the given tokens ``[B, L, T]`` above their layer's threshold ``[L]``."""
    return (norms > np.asarray(thresholds)[None, :, None]).mean(axis=-1)


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


def _entropy(cls_to_patches: np.ndarray) -> np.ndarray:
    """Entropy ``[B, L, H]`` of CLS attention renormalised over the patches."""
    p = cls_to_patches / cls_to_patches.sum(axis=-1, keepdims=True)
    return -(p * np.log(np.clip(p, 1e-30, None))).sum(axis=-1)


def cls_entropy(cls_to_patches: np.ndarray) -> np.ndarray:
    """M5: ``[B, L, H, P] -> [B, L]`` entropy of the renormalised CLS attention / ``log P``, head mean
    (1 = uniform over patches, 0 = one patch)."""
    num_patches = cls_to_patches.shape[-1]
    if num_patches < 2:
        return np.full(cls_to_patches.shape[:2], np.nan)
    return (_entropy(cls_to_patches) / np.log(num_patches)).mean(axis=-1)


def cls_effective_tokens(cls_to_patches: np.ndarray) -> np.ndarray:
    """M5 companion: ``exp(entropy)`` of the renormalised CLS attention, averaged over heads."""
    return np.exp(_entropy(cls_to_patches)).mean(axis=-1)


def outlier_attention_mass(cls_to_patches: np.ndarray, patch_outliers: np.ndarray) -> np.ndarray:
    """M6: raw attention rows ``[B, L, H, P]`` summed over the outlier patches ``[B, L, P]`` *entering* each
    block (block ``l`` attends over block ``l - 1``'s outputs; block 0's input is not recorded: NaN),
    head mean."""
    mass = np.full(cls_to_patches.shape[:2], np.nan)
    mass[:, 1:] = (cls_to_patches[:, 1:] * patch_outliers[:, :-1, None, :]).sum(axis=-1).mean(axis=-1)
    return mass


def topk_received(received: np.ndarray, keys: Sequence[int], k: int) -> tuple[np.ndarray, np.ndarray]:
    """M7 ``S_topK``: of ``received [B, L, H, N]``, the summed mass ``[B, L]`` (head mean) of the ``k`` keys
    (among ``keys``) receiving most attention per head, and their token indices ``[B, L, H, k]``."""
    keys = np.asarray(keys)
    sub = received[..., keys]
    order = np.argsort(-sub, axis=-1)[..., :k]
    return np.take_along_axis(sub, order, axis=-1).sum(axis=-1).mean(axis=-1), keys[order]


def sink_heads(received: np.ndarray, eps: float = 0.3) -> np.ndarray:
    """``[B, L, H]`` heads in which one key receives more than ``eps`` of the average attention."""
    return received.max(axis=-1) > eps


def sink_rate_by_type(
    received: np.ndarray, token_types: Sequence[str], eps: float = 0.3
) -> dict[str, np.ndarray]:
    """M8 (after Gu et al.): share of heads with a sink, split by the type of the sink key (``cls`` /
    ``register`` / ``patch``); the types add up to the share of all sinks."""
    sink_type = np.asarray(token_types)[received.argmax(axis=-1)]  # [B, L, H]
    has_sink = sink_heads(received, eps)
    return {t: (has_sink & (sink_type == t)).mean(axis=-1) for t in ("cls", "register", "patch")}


def massive_ratio(top1: np.ndarray, median: np.ndarray) -> np.ndarray:
    """M10 (Sun et al., arXiv 2402.17762, section 2): largest over median ``|activation|`` of a hidden state
    (NaN where the median is 0); the LLM rule "> 100 and ~1000x the median" is not applied."""
    top1, median = np.asarray(top1, dtype=np.float64), np.asarray(median, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(median > 0, top1 / median, np.nan)


def massive_location(token: np.ndarray, channel: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Per layer of the top-1 ``token``, ``channel [B, L]``: the (token, channel) most often holding the
    largest activation, in how many images, and how many pairs share that count (1: a unique mode; among
    tied pairs the lowest token, then channel, is returned, so callers must report the tie)."""
    found = []
    for layer in range(token.shape[1]):
        pairs, counts = np.unique(
            np.stack([token[:, layer], channel[:, layer]], axis=1), axis=0, return_counts=True
        )
        best = int(np.argmax(counts))
        found.append(
            (int(pairs[best, 0]), int(pairs[best, 1]), int(counts[best]), int((counts == counts[best]).sum()))
        )
    return found
