"""Token-norm figures: norm maps, per-layer norm histograms and the layer profile."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter

from vit5.viz.artifacts import MetricReport
from vit5.viz.figures.base import MapStyle, Panel, panel_grid
from vit5.viz.images import LoadedImage
from vit5.viz.maps import norm_map, outlier_map
from vit5.viz.stats import TokenStats

NORM_KIND = "L2 norm of block outputs before the final norm"
TOKEN_COLOURS = {"patch": "tab:blue", "register": "tab:orange", "cls": "tab:green"}


def norm_map_figure(
    stats: TokenStats,
    index: int,
    image: LoadedImage,
    layers: Sequence[int],
    style: MapStyle,
    outliers: np.ndarray | None = None,
    notes: Sequence[str] = (),
) -> Figure:
    """One panel per layer, each with its own colour scale (norms grow with depth); outliers outlined in
    red."""
    panels = []
    for layer in layers:
        marks = outlier_map(outliers, stats, index, layer) if outliers is not None else None
        count = f", {int(marks.sum())} above threshold" if marks is not None else ""
        panels.append(
            Panel(
                f"layer {layer}{count}",
                norm_map(stats, index, layer),
                image.rgb,
                group=f"layer {layer}",
                patch=stats.patch_size,
                marks=marks,
            )
        )
    extra = ["red squares: tokens above the outlier threshold of their layer"] if outliers is not None else []
    return panel_grid(
        [panels], style, f"{stats.model} | {image.name}: patch-token norms ({NORM_KIND})", [*notes, *extra]
    )


def outlier_frequency_figure(
    stats: TokenStats, outliers: np.ndarray, layers: Sequence[int], style: MapStyle, notes: Sequence[str] = ()
) -> Figure:
    """Per grid position, the share of images whose token there is an outlier (VTNR Fig. 10); one scale,
    0 to 1.

    Shows border bias and stripes from position-embedding interpolation.
    """
    panels = [
        Panel(
            f"layer {layer}",
            stats.to_grid(outliers[:, stats.layer_position(layer)].mean(axis=0)),
            group="share",
            patch=stats.patch_size,
        )
        for layer in layers
    ]
    title = f"{stats.model}: share of {stats.num_images} images with an outlier token at each position"
    return panel_grid([panels], style, title, notes, fixed_limits={"share": (0.0, 1.0)})


def norm_histogram_figure(
    stats: TokenStats, thresholds: np.ndarray, style: MapStyle, columns: int = 4, notes: Sequence[str] = ()
) -> Figure:
    """Small multiples, one per layer: norms of patch, register and CLS tokens over all images.

    Linear norm axis, log count axis, the outlier threshold as a dashed line (VTNR Fig. 4a).
    """
    num = len(stats.layers)
    cols = min(columns, num)
    rows = math.ceil(num / cols)
    fig = Figure(figsize=(max(cols * 3.0, 7.0), rows * 2.4 + 0.8), dpi=style.dpi, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    types = np.asarray(stats.layout.token_types())
    for pos, layer in enumerate(stats.layers):
        ax = axes.flat[pos]
        norms = stats.norms[:, pos]
        bins = np.linspace(0.0, max(float(norms.max()), float(thresholds[pos])) * 1.05, 41)
        for kind, colour in TOKEN_COLOURS.items():
            values = norms[:, types == kind].ravel()
            if values.size:
                ax.hist(values, bins=bins, color=colour, alpha=0.6, label=f"{kind} ({values.size})")
        ax.axvline(
            thresholds[pos],
            color="red",
            linestyle="--",
            linewidth=1,
            label=f"threshold {thresholds[pos]:.3g}",
        )
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.set_xlabel("token norm", fontsize=8)
        ax.set_ylabel("count", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    for ax in axes.flat[num:]:
        ax.set_axis_off()
    fig.suptitle(
        f"{stats.model}: token norms per layer, {stats.num_images} images ({NORM_KIND})", fontsize=10
    )
    if notes:
        fig.supxlabel("\n".join(notes), fontsize=8)
    return fig


PROFILE_PANELS = (
    ("max/median patch norm", ("max_median_ratio",)),
    ("attention mass on registers", ("cls_register_mass", "patch_register_mass")),
    ("outlier tokens and sinks", ("outlier_ratio", "sink_rate")),
)


def layer_profile_figure(
    reports: Mapping[str, MetricReport], style: MapStyle, notes: Sequence[str] = ()
) -> Figure:
    """Per-layer curves with bootstrap bands, one line per model: where artifacts start (TTR Fig. 2)."""
    fig = Figure(figsize=(4.0 * len(PROFILE_PANELS), 3.4), dpi=style.dpi, layout="constrained")
    axes = fig.subplots(1, len(PROFILE_PANELS), squeeze=False)[0]
    styles = ("-", "--", ":", "-.")
    for ax, (title, names) in zip(axes, PROFILE_PANELS):
        for m, (label, report) in enumerate(reports.items()):
            for name in names:
                if name not in report.summary:
                    continue
                s = report.summary[name]
                layers = report.layers
                n = len(layers)
                (line,) = ax.plot(
                    layers,
                    s["value"][:n],
                    styles[m % len(styles)],
                    marker="o",
                    markersize=3,
                    label=f"{label}: {name}",
                )
                ax.fill_between(layers, s["ci_low"][:n], s["ci_high"][:n], color=line.get_color(), alpha=0.2)
        if not ax.lines:
            ax.text(
                0.5, 0.5, "not applicable\n(no registers)", ha="center", va="center", transform=ax.transAxes
            )
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("layer (block index)", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
        if ax.lines:
            ax.legend(fontsize=6)
    ci = int(next(iter(reports.values())).config.ci * 100)
    fig.suptitle(f"Layer profile: {', '.join(reports)} (bands: {ci}% bootstrap over images)", fontsize=10)
    if notes:
        fig.supxlabel("\n".join(notes), fontsize=8)
    return fig


def massive_activation_figure(
    models: Mapping[str, tuple[TokenStats, MetricReport]], style: MapStyle, notes: Sequence[str] = ()
) -> Figure:
    """Per block, the top-3 ``|activation|`` of the block output and its median, averaged over images
    (Sun et al., arXiv 2402.17762, Fig. 1 / their ViT code), one panel per model, log scale.

    Each top-1 point is labelled with the token type and channel holding it most often.
    """
    fig = Figure(figsize=(max(4.6 * len(models), 6.5), 3.8), dpi=style.dpi, layout="constrained")
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    for ax, (label, (stats, report)) in zip(axes, models.items()):
        if stats.massive_top is None:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
            continue
        layers = stats.layers
        top = stats.massive_top.mean(axis=0)  # [L, 3]
        for k in range(top.shape[1]):
            ax.plot(layers, top[:, k], marker="o", markersize=3, label=f"top {k + 1}")
        ax.plot(layers, stats.massive_median.mean(axis=0), "k--", marker="s", markersize=3, label="median")
        for where, y in zip(report.massive or [], top[:, 0]):
            tag = {"cls": "CLS", "register": "reg", "patch": "patch"}[where["token_type"]]
            ax.annotate(
                f"{tag} c{where['channel']}",
                (where["layer"], y),
                fontsize=6,
                xytext=(2, 4),
                textcoords="offset points",
            )
        ax.set_yscale("log")
        ax.set_title(f"{label}", fontsize=9)
        ax.set_xlabel("layer (block index)", fontsize=8)
        ax.set_ylabel("|activation| (mean over images)", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    fig.suptitle(
        "Massive activations: largest |activation| of each block output vs its median\n"
        "(labels: token and channel holding the top 1 most often)",
        fontsize=9,
    )
    if notes:
        fig.supxlabel("\n".join(notes), fontsize=8)
    return fig
