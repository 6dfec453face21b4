"""Artifact metrics (M1-M3, M5-M8, M10) of one model on one image set: per image and layer ``[B, L]``, with
bootstrap intervals over images (not tokens: the tokens of one image are not independent). The outlier
threshold is, by precedence: per-layer values of a reference model (``thresholds``, read with
:func:`load_thresholds`), one norm (``threshold``), or this model's log-norm median + k * MAD (never
Darcet's absolute 150, which is DINOv2 ViT-g's)."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from scipy.stats import entropy

from vit5.errors import InputError
from vit5.eval.outliers import log_mad_threshold, max_median_ratio, outlier_ratio
from vit5.outputs import format_table, write_csv, write_json
from vit5.viz.stats import (
    FLAT_PERCENTILE,
    REDUNDANT_COSINE,
    PatchContent,
    TokenStats,
    classify_outliers,
)

PLACEMENT_RULE = (
    f"artifact-like = input patch in its image's flattest {FLAT_PERCENTILE:.0%} by pixel variance "
    f"and mean cosine >= {REDUNDANT_COSINE:g} to its 4-neighbours (redundant, Darcet et al. 2023 "
    "sec. 2.1); "
    "content-like = the rest"
)


@dataclass(frozen=True)
class MetricConfig:
    k: float = 5.0  # MAD multiplier of the log-norm threshold
    # one explicit norm threshold for every layer
    threshold: float | None = None
    # per-layer thresholds of a reference model
    thresholds: tuple[float, ...] | None = None
    # where ``thresholds`` came from (for the report)
    threshold_source: str = ""
    eps: float = 0.3  # sink-rate epsilon
    # S_topK keys; default: the model's register count, or 4 without registers
    top_k: int | None = None
    n_boot: int = 1000
    ci: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        if self.k <= 0:
            raise InputError(f"the MAD multiplier k must be positive, got {self.k}")
        if self.threshold is not None and self.threshold <= 0:
            raise InputError(f"an explicit norm threshold must be positive, got {self.threshold}")
        if not 0 < self.eps < 1:
            raise InputError(f"the sink epsilon is a share of attention in (0, 1), got {self.eps}")
        if not 0 < self.ci < 1 or self.n_boot < 1:
            raise InputError(
                f"bootstrap needs 0 < ci < 1 and n_boot >= 1, got ci={self.ci}, n_boot={self.n_boot}"
            )


# fewer images: no interval is printed (and the table says why)
MIN_BOOTSTRAP_IMAGES = 10
# the statistic over images is the median for these; every other metric takes the mean
MEDIAN_OVER_IMAGES = {"max_median_ratio"}
METRICS: dict[str, str] = {
    "outlier_ratio": "M1 share of patch tokens whose norm exceeds the layer threshold",
    "outlier_ratio_registers": "M1 share of register tokens above the same threshold",
    "max_median_ratio": "M2 max / median patch norm (median over images)",
    "share_max_median_over_3": "M2 share of images whose max / median patch norm exceeds 3",
    "norm_kurtosis": "M3 excess kurtosis of the patch norms of an image",
    "cls_entropy": "M5 entropy of CLS attention renormalised over patches / log(#patches), head mean",
    "cls_effective_tokens": "M5 exp(entropy) of the renormalised CLS attention, head mean",
    "cls_outlier_mass": "M6 raw CLS attention on the previous block's outlier patches, head mean",
    "cls_max_patch_attention": "M6 max over heads and patches of CLS-to-patch attention",
    "received_outlier_mass": (
        "M6 attention the previous block's outlier patches receive, mean over all queries, head mean"
    ),
    "cls_register_mass": "M7 CLS attention mass on all registers, head mean",
    "patch_register_mass": "M7 patch-to-register attention mass, mean over patch queries and heads",
    "topk_sink_mass": "M7 received attention of the top-K keys other than CLS, head mean",
    "topk_register_share": "M7 share of those top-K keys that are registers",
    "sink_rate": "M8 share of heads where one key receives more than eps of the average attention",
    "sink_rate_cls": "M8 share of heads whose sink is the CLS token",
    "sink_rate_register": "M8 share of heads whose sink is a register",
    "sink_rate_patch": "M8 share of heads whose sink is a patch",
    "massive_top1": "M10 largest |activation| of the block output over tokens and channels",
    "massive_ratio": "M10 largest |activation| / median |activation| of the block output",
    "massive_on_cls": "M10 share of images whose largest |activation| is on the CLS token",
    "massive_on_register": "M10 share of images whose largest |activation| is on a register",
    "massive_on_patch": "M10 share of images whose largest |activation| is on a patch",
    "outlier_artifact_share": (
        "share of an image's outlier patches that are artifact-like: flat input patches like their "
        "4-neighbours (Darcet et al. 2023, sec. 2.1); the rest are content-like"
    ),
}
TABLE_COLUMNS = {  # the metrics of the printed table and their column heads
    "outlier_ratio": "OTR",
    "max_median_ratio": "max/med",
    "norm_kurtosis": "kurt",
    "cls_entropy": "CLS H",
    "cls_outlier_mass": "CLS>out",
    "cls_register_mass": "CLS>reg",
    "patch_register_mass": "patch>reg",
    "sink_rate": "sink",
    "massive_ratio": "MA top/med",
}


@dataclass
class MetricReport:
    model: str
    num_images: int
    layers: list[int]
    thresholds: np.ndarray  # [L] norm threshold of each layer
    threshold_source: str
    config: MetricConfig
    per_image: dict[str, np.ndarray]  # name -> [B, L]
    # name -> {"value", "ci_low", "ci_high"} per layer
    summary: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    outliers: np.ndarray | None = None  # [B, L, P] outlier patches (for maps)
    # per layer: where the largest activation sits most often (M10)
    massive: list[dict] | None = None
    # per layer: artifact-like / content-like outliers
    placement: list[dict] | None = None

    @property
    def intervals(self) -> bool:
        return self.num_images >= MIN_BOOTSTRAP_IMAGES

    def interval_note(self) -> str:
        if self.intervals:
            return f"{int(self.config.ci * 100)}% bootstrap intervals over images"
        return (
            f"no intervals: {self.num_images} images, a bootstrap over images needs at least "
            f"{MIN_BOOTSTRAP_IMAGES}"
        )

    def rows(self) -> list[dict]:
        """One row per metric and layer (plus layer ``"all"`` for the sink rate over all layer-heads)."""
        rows = []
        n = self.num_images
        for name, values in self.summary.items():
            statistic = "median" if name in MEDIAN_OVER_IMAGES else "mean"
            layers = self.layers + ["all"] if name == "sink_rate" else self.layers
            for i, layer in enumerate(layers):
                cells = {key: _num(values[key][i]) for key in ("value", "ci_low", "ci_high")}
                row = {"metric": name, "layer": layer, **cells}
                rows.append(row | {"statistic": statistic, "n_images": n})
        return rows

    def write(self, base: str | Path) -> list[Path]:
        """``base.json`` (every number, the config and the rules) and ``base.csv`` (:meth:`rows`)."""
        rows = self.rows()
        doc = {
            "model": self.model,
            "num_images": self.num_images,
            "layers": self.layers,
            "thresholds": [_num(t) for t in self.thresholds],
            "threshold_source": self.threshold_source,
            "confidence": self.config.ci,
            "config": asdict(self.config),
            "descriptions": {name: METRICS[name] for name in self.summary},
            "metrics": rows,
            "massive_activations": self.massive,
            "intervals": self.interval_note(),
            "outlier_placement": self.placement,
            "placement_rule": PLACEMENT_RULE,
        }
        json_file = write_json(f"{base}.json", doc)
        return [json_file, write_csv(f"{base}.csv", rows)]

    def table(self) -> str:
        """Per-layer table of the main metrics: value +- half the bootstrap interval (value alone when there
        are too few images for one), the outliers' placement and where the largest activation sits."""
        names = [n for n in TABLE_COLUMNS if n in self.summary]
        header = ["layer", "tau", *(TABLE_COLUMNS[n] for n in names)]
        if self.placement:
            header.append("outliers art/cont")
        lines = []
        for i, layer in enumerate(self.layers):
            cells = [str(layer), f"{self.thresholds[i]:.3g}"]
            for n in names:
                s = self.summary[n]
                value = s["value"][i]
                half = (s["ci_high"][i] - s["ci_low"][i]) / 2
                interval = "" if math.isnan(half) else f"±{half:.2g}"
                cells.append("n/a" if math.isnan(value) else f"{value:.3g}{interval}")
            if self.placement:
                p = self.placement[i]
                cells.append(f"{p['artifact_like']}/{p['content_like']}" if p["outliers"] else "0")
            lines.append(cells)
        extra = f"\noutliers art/cont: {PLACEMENT_RULE}" if self.placement else ""
        if self.massive:
            runs = []  # consecutive blocks with the same place merged
            for where, group in itertools.groupby(self.massive, key=massive_where):
                blocks = [m["layer"] for m in group]
                runs.append(f"{blocks[0]}{'' if len(blocks) == 1 else f'-{blocks[-1]}'}: {where}")
            extra += "\nlargest activation (blocks: token, channel, images): " + ", ".join(runs)
        table = format_table(header, lines, header_rule=False, label_column=False)
        sink_rate = self.summary["sink_rate"]["value"][-1]
        return (
            f"{self.model}: {self.num_images} images, {self.interval_note()} "
            f"(threshold: {self.threshold_source})\n{table}\n"
            f"sink rate over all layer-heads: {sink_rate:.3g}{extra}"
        )


def massive_where(m: dict) -> str:
    """``"patch 50 ch 119 (4/5 images)"``, or the tie when no (token, channel) is the unique mode."""
    if m["tied_locations"] > 1:
        tied = f"{m['tied_locations']} tied at {m['count']}/{m['n_images']} images"
        return f"no single place ({tied})"
    images = f"{m['count']}/{m['n_images']} images"
    return f"{m['token_type']} {m['token']} ch {m['channel']} ({images})"


def _num(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def bootstrap_ci(
    values: np.ndarray,
    statistic: str = "mean",
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(statistic, low, high) of per-image ``values [B]``; percentile bootstrap resampling images.
    NaN-aware. Fewer than :data:`MIN_BOOTSTRAP_IMAGES` finite values give the statistic with a NaN
    interval: resampling 2 or 5 images yields a few distinct means, not a 95 % interval."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return float("nan"), float("nan"), float("nan")
    stat = np.mean if statistic == "mean" else np.median
    if values.size < MIN_BOOTSTRAP_IMAGES:
        return float(stat(values)), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, values.size, size=(n_boot, values.size))
    draws = stat(values[picks], axis=1)
    lo, hi = np.quantile(draws, [(1 - ci) / 2, (1 + ci) / 2])
    return float(stat(values)), float(lo), float(hi)


def layer_thresholds(patch_norms: np.ndarray, k: float = 5.0) -> np.ndarray:
    """One :func:`log_mad_threshold` per layer, pooled over images and patches: ``[B, L, P] -> [L]``."""
    layers = range(patch_norms.shape[1])
    return np.array([log_mad_threshold(patch_norms[:, layer], k) for layer in layers])


def excess_kurtosis(patch_norms: np.ndarray) -> np.ndarray:
    """M3: ``E[(n - mu)^4] / sigma^4 - 3`` over the patches of each image and layer (NaN if constant)."""
    centred = patch_norms - patch_norms.mean(axis=-1, keepdims=True)
    m2 = (centred**2).mean(axis=-1)
    m4 = (centred**4).mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(m2 > 0, m4 / m2**2 - 3.0, np.nan)


def cls_entropy(cls_to_patches: np.ndarray) -> np.ndarray:
    """M5: ``[B, L, H, P] -> [B, L]`` entropy of the renormalised CLS attention / ``log P``, head mean
    (1 = uniform over patches, 0 = one patch)."""
    if cls_to_patches.shape[-1] < 2:
        return np.full(cls_to_patches.shape[:2], np.nan)
    return (entropy(cls_to_patches, axis=-1) / np.log(cls_to_patches.shape[-1])).mean(axis=-1)


def cls_effective_tokens(cls_to_patches: np.ndarray) -> np.ndarray:
    """M5 companion: ``exp(entropy)`` of the renormalised CLS attention, averaged over heads."""
    return np.exp(entropy(cls_to_patches, axis=-1)).mean(axis=-1)


def outlier_attention_mass(cls_to_patches: np.ndarray, patch_outliers: np.ndarray) -> np.ndarray:
    """M6: raw attention rows ``[B, L, H, P]`` summed over the outlier patches ``[B, L, P]`` *entering* each
    block (block ``l`` attends over block ``l - 1``'s outputs; block 0's input is not recorded: NaN),
    head mean."""
    mass = np.full(cls_to_patches.shape[:2], np.nan)
    on_outliers = cls_to_patches[:, 1:] * patch_outliers[:, :-1, None, :]
    mass[:, 1:] = on_outliers.sum(axis=-1).mean(axis=-1)
    return mass


def outlier_artifact_share(outliers: np.ndarray, content: PatchContent) -> np.ndarray:
    """``outliers [B, L, P]`` -> ``[B, L]``: share of an image's outliers that are artifact-like (NaN
    where it has none)."""
    count = outliers.sum(axis=-1)
    artifact = (outliers & content.artifact_like[:, None, :]).sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(count > 0, artifact / count, np.nan)


def sink_heads(received: np.ndarray, eps: float = 0.3) -> np.ndarray:
    """``[B, L, H]`` heads in which one key receives more than ``eps`` of the average attention."""
    return received.max(axis=-1) > eps


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
            (
                int(pairs[best, 0]),
                int(pairs[best, 1]),
                int(counts[best]),
                int((counts == counts[best]).sum()),
            )
        )
    return found


def resolve_thresholds(stats: TokenStats, cfg: MetricConfig) -> tuple[np.ndarray, str]:
    """Per-layer norm thresholds ``[L]`` and a sentence saying where they come from."""
    num_layers = len(stats.layers)
    if cfg.thresholds is not None:
        ref = np.asarray(cfg.thresholds, dtype=np.float64)
        if ref.size == num_layers:
            return ref, cfg.threshold_source or "reused from a reference model"
        # the same relative depth
        at = np.round(np.linspace(0, ref.size - 1, num_layers)).astype(int)
        source = cfg.threshold_source or "reference model"
        return ref[at], f"{source} ({ref.size} layers, mapped by relative depth)"
    if cfg.threshold is not None:
        return np.full(num_layers, cfg.threshold), f"explicit norm {cfg.threshold:g}"
    thresholds = layer_thresholds(stats.patch_values(stats.norms), cfg.k)
    return thresholds, f"log-norm median + {cfg.k:g} MAD of this model"


def per_image_metrics(
    stats: TokenStats, thresholds: np.ndarray, cfg: MetricConfig
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """All metric values ``name -> [B, L]`` and the outlier-patch mask ``[B, L, P]``; M7's ``S_topK`` is the
    summed received mass of the K keys other than CLS receiving most attention per head, M8 (after Gu et
    al.) splits the sink rate by the type of the sink key, M10 is Sun et al.'s (arXiv 2402.17762, sec. 2)
    largest / median ``|activation|`` (the LLM rule "> 100 and ~1000x the median" is not applied)."""
    layout = stats.layout
    types = np.asarray(layout.token_types())
    patch_norms = stats.patch_values(stats.norms)
    outliers = patch_norms > np.asarray(thresholds)[None, :, None]
    max_median = max_median_ratio(patch_norms)
    values = {
        "outlier_ratio": outliers.mean(axis=-1),
        "max_median_ratio": max_median,
        "share_max_median_over_3": (max_median > 3).astype(np.float64),
        "norm_kurtosis": excess_kurtosis(patch_norms),
    }
    if stats.content is not None:
        values["outlier_artifact_share"] = outlier_artifact_share(outliers, stats.content)
    if layout.num_registers:
        register_norms = stats.register_values(stats.norms)
        values["outlier_ratio_registers"] = outlier_ratio(register_norms, thresholds)
    if stats.cls_attn is not None:
        cls_patches = stats.patch_values(stats.cls_attn)
        values["cls_entropy"] = cls_entropy(cls_patches)
        values["cls_effective_tokens"] = cls_effective_tokens(cls_patches)
        values["cls_outlier_mass"] = outlier_attention_mass(cls_patches, outliers)
        values["cls_max_patch_attention"] = cls_patches.max(axis=(-2, -1))
        if layout.num_registers:
            on_registers = stats.register_values(stats.cls_attn)
            values["cls_register_mass"] = on_registers.sum(axis=-1).mean(axis=-1)
    received = stats.patch_values(stats.received)
    values["received_outlier_mass"] = outlier_attention_mass(received, outliers)
    if stats.patch_to_reg is not None:
        values["patch_register_mass"] = stats.patch_to_reg.mean(axis=-1)
    keys = np.flatnonzero(types != "cls")
    top_k = min(cfg.top_k or layout.num_registers or 4, keys.size)
    by_key = stats.received[..., keys]
    # [B, L, H, K] among the keys
    top = np.argsort(-by_key, axis=-1)[..., :top_k]
    values["topk_sink_mass"] = np.take_along_axis(by_key, top, -1).sum(-1).mean(-1)
    if layout.num_registers:
        values["topk_register_share"] = (types[keys[top]] == "register").mean(axis=(-2, -1))
    has_sink = sink_heads(stats.received, cfg.eps)
    sink_type = types[stats.received.argmax(axis=-1)]
    values["sink_rate"] = has_sink.mean(axis=-1)
    if stats.massive_top is not None:
        top1 = stats.massive_top[..., 0].astype(np.float64)
        median = stats.massive_median.astype(np.float64)
        values["massive_top1"] = top1
        with np.errstate(divide="ignore", invalid="ignore"):
            values["massive_ratio"] = np.where(median > 0, top1 / median, np.nan)
    for kind in ("cls", "register", "patch"):
        values[f"sink_rate_{kind}"] = (has_sink & (sink_type == kind)).mean(axis=-1)
        if stats.massive_token is not None:
            on_kind = types[stats.massive_token[..., 0]] == kind
            values[f"massive_on_{kind}"] = on_kind.astype(np.float64)
    return {name: values[name] for name in METRICS if name in values}, outliers


def compute_metrics(stats: TokenStats, cfg: MetricConfig = MetricConfig()) -> MetricReport:
    thresholds, source = resolve_thresholds(stats, cfg)
    values, outliers = per_image_metrics(stats, thresholds, cfg)
    summary = {}
    for name, per_image in values.items():
        columns = list(per_image.T)
        if name == "sink_rate":
            columns.append(per_image.mean(axis=1))  # over all layer-heads
        statistic = "median" if name in MEDIAN_OVER_IMAGES else "mean"
        draws = (cfg.n_boot, cfg.ci, cfg.seed)
        rows = np.array([bootstrap_ci(col, statistic, *draws) for col in columns])
        summary[name] = dict(zip(("value", "ci_low", "ci_high"), rows.T))
    massive = None
    if stats.massive_token is not None:
        types = stats.layout.token_types()
        n = stats.num_images
        places = massive_location(stats.massive_token[..., 0], stats.massive_channel[..., 0])
        keys = (
            "layer",
            "token",
            "token_type",
            "channel",
            "count",
            "n_images",
            "share",
            "tied_locations",
        )
        massive = [
            dict(zip(keys, (layer, token, types[token], channel, count, n, count / n, tied)))
            for layer, (token, channel, count, tied) in zip(stats.layers, places)
        ]
    content = stats.content
    placement = None
    if content is not None:
        placement = classify_outliers(outliers, content, list(stats.layers))
    return MetricReport(
        model=stats.model,
        num_images=stats.num_images,
        layers=stats.layers,
        thresholds=thresholds,
        threshold_source=source,
        config=cfg,
        per_image=values,
        summary=summary,
        outliers=outliers,
        massive=massive,
        placement=placement,
    )


def load_thresholds(path: str | Path) -> tuple[tuple[float, ...], str]:
    """Per-layer thresholds from a ``metrics.json`` written by an earlier run (the reference model)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
        thresholds = tuple(float(t) for t in doc["thresholds"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(
            f"cannot read thresholds from {path}: expected a metrics.json written by `viz metrics` ({err})"
        ) from err
    return thresholds, f"reused from {doc.get('model', 'reference')} ({path})"
