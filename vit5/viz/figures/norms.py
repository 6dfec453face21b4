"""Token-norm figures: norm maps, per-layer norm histograms and the layer profile."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter

from vit5 import plotstyle as S
from vit5.plotstyle import metric_label
from vit5.viz.artifacts import MetricReport
from vit5.viz.content import classify_outliers, describe_layer
from vit5.viz.figures.base import MapStyle, Panel, figure_title, panel_grid
from vit5.viz.images import LoadedImage
from vit5.viz.maps import norm_map, outlier_map
from vit5.viz.stats import TokenStats

NORM_KIND = "L2 norms of block outputs, before the final norm"
TOKEN_COLOURS = {kind: S.ROLE_COLOURS[kind] for kind in ("patch", "register", "cls")}
_ARTIFACT_MARKS = "red: artifact-like outliers (flat patch, like its neighbours)"
_CONTENT_MARKS = "white dashed: content-like outliers"


def norm_map_figure(
    stats: TokenStats,
    index: int,
    image: LoadedImage,
    layers: Sequence[int],
    style: MapStyle,
    outliers: np.ndarray | None = None,
    notes: Sequence[str] = (),
) -> Figure:
    """One panel per layer, each with its own colour scale (norms grow with depth); outliers outlined,
    red where artifact-like, dashed white where content-like (:mod:`vit5.viz.content`)."""
    panels, drawn = [], set()
    content = stats.content
    artifact_cells = stats.to_grid(content.artifact_like[index]) if content is not None else None
    for layer in layers:
        marks = second = None
        title = f"block {stats.layers[stats.layer_position(layer)]}"
        if outliers is not None:
            found = outlier_map(outliers, stats, index, layer)
            if artifact_cells is not None:
                marks, second = found & artifact_cells, found & ~artifact_cells
            else:
                marks = found
            title += f": {_count(int(found.sum()), None if second is None else int(marks.sum()))}"
            drawn |= {
                "artifact" if marks.any() else "",
                "content" if second is not None and second.any() else "",
            }
        panels.append(
            Panel(
                title,
                norm_map(stats, index, layer),
                image.rgb,
                group=f"layer {layer}",
                patch=stats.patch_size,
                marks=marks,
                second_marks=second,
            )
        )
    captions = [c for key, c in (("artifact", _ARTIFACT_MARKS), ("content", _CONTENT_MARKS)) if key in drawn]
    if "artifact" in drawn and artifact_cells is None:
        captions = ["red: tokens above the outlier threshold of their block"]
    return panel_grid(
        [panels], style, f"{stats.model} | {image.name}: patch-token norms", [NORM_KIND, *notes, *captions]
    )


def _count(outliers: int, artifact: int | None) -> str:
    if not outliers:
        return "no outliers"
    text = f"{outliers} outlier{'s' if outliers > 1 else ''}"
    return text if artifact is None else f"{text}, {artifact} artifact-like"


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
    title = f"{stats.model}: images with an outlier token at each position ({stats.num_images} images)"
    placement = _placement_note(stats, outliers, layers)
    return panel_grid([panels], style, title, [*notes, *placement], fixed_limits={"share": (0.0, 1.0)})


def _placement_note(stats: TokenStats, outliers: np.ndarray, layers: Sequence[int]) -> list[str]:
    """``["block 11: 3 of 4 outliers artifact-like ..."]`` beside an outlier figure, when the images'
    content was recorded."""
    content = stats.content
    if content is None:
        return []
    positions = [stats.layer_position(layer) for layer in layers]
    entries = classify_outliers(outliers[:, positions], content, [stats.layers[p] for p in positions])
    return [f"block {e['layer']}: {describe_layer(e)}" for e in entries]


def norm_histogram_figure(
    stats: TokenStats, thresholds: np.ndarray, style: MapStyle, columns: int = 4, notes: Sequence[str] = ()
) -> Figure:
    """Small multiples, one per layer: norms of patch, register and CLS tokens over all images.

    Linear norm axis, log count axis, the outlier threshold as a dashed line (VTNR Fig. 4a).
    """
    num = len(stats.layers)
    cols = min(columns, num)
    rows = math.ceil(num / cols)
    width = min(S.TEXT_WIDTH, max(cols * 1.75, S.MIN_WIDTH))
    fig = Figure(figsize=(width, rows * 1.6 + 0.9), dpi=style.dpi, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    types = np.asarray(stats.layout.token_types())
    for pos, layer in enumerate(stats.layers):
        ax = axes.flat[pos]
        norms = stats.norms[:, pos]
        bins = np.linspace(0.0, max(float(norms.max()), float(thresholds[pos])) * 1.05, 41)
        for kind, colour in TOKEN_COLOURS.items():
            values = norms[:, types == kind].ravel()
            if values.size:
                ax.hist(
                    values,
                    bins=bins,
                    color=colour,
                    alpha=0.6,
                    label=f"{'CLS' if kind == 'cls' else kind} tokens",
                )
        ax.axvline(thresholds[pos], color="black", linestyle="--", linewidth=1, label="outlier threshold")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.xaxis.set_major_locator(MaxNLocator(3))
        S.style_axes(ax, f"block {layer}")
        ax.grid(False)
    for ax in axes[-1]:
        ax.set_xlabel("token norm", fontsize=S.FONT)
    for ax in axes[:, 0]:
        ax.set_ylabel("count", fontsize=S.FONT)
    for ax in axes.flat[num:]:
        ax.set_axis_off()
    title = figure_title(style, f"{stats.model}: token norms per block ({stats.num_images} images)")
    if title:
        fig.suptitle(title, fontsize=S.FONT_TITLE)
    S.finish(fig, [NORM_KIND, *notes], axes.flat[:1], ncol=4)
    return fig


PROFILE_PANELS = (
    ("max / median patch norm", ("max_median_ratio",)),
    ("attention mass on registers", ("cls_register_mass", "patch_register_mass")),
    ("outliers and sinks (share)", ("outlier_ratio", "outlier_artifact_share", "sink_rate")),
)


def layer_profile_figure(
    reports: Mapping[str, MetricReport], style: MapStyle, notes: Sequence[str] = ()
) -> Figure:
    """Per-layer curves with bootstrap bands (TTR Fig. 2): colour = model, line style and marker = metric;
    one legend below the panels. Bands only with enough images for a bootstrap (the note says so)."""
    fig = Figure(figsize=(S.TEXT_WIDTH, 2.9), dpi=style.dpi, layout="constrained")
    axes = fig.subplots(1, len(PROFILE_PANELS), squeeze=False)[0]
    several = len(reports) > 1
    order = [name for _, names in PROFILE_PANELS for name in names]  # one line style per metric, everywhere
    for ax, (title, names) in zip(axes, PROFILE_PANELS):
        for m, (label, report) in enumerate(reports.items()):
            for name in names:
                k = order.index(name)
                if name not in report.summary:
                    continue
                s = report.summary[name]
                layers = report.layers
                n = len(layers)
                text = f"{label}: {metric_label(name)}" if several else metric_label(name)
                ax.plot(layers, s["value"][:n], label=text, **S.line_kwargs(m, k))
                if report.intervals:
                    ax.fill_between(
                        layers, s["ci_low"][:n], s["ci_high"][:n], color=S.model_colour(m), alpha=0.15
                    )
        if not ax.lines:
            ax.text(
                0.5,
                0.5,
                "not applicable\n(no registers)",
                ha="center",
                va="center",
                transform=ax.transAxes,
                fontsize=S.FONT,
            )
        S.style_axes(ax, title, "block")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    first = next(iter(reports.values()))
    default = f"Layer profile: {', '.join(reports)}"
    title = figure_title(style, default)
    if title:
        fig.suptitle(title, fontsize=S.FONT_TITLE)
    bands = (
        f"bands: {int(first.config.ci * 100)}% bootstrap over images"
        if first.intervals
        else first.interval_note()
    )
    S.finish(fig, [bands, *notes], axes, ncol=2 if several else 3)
    return fig


def massive_activation_figure(
    models: Mapping[str, tuple[TokenStats, MetricReport]], style: MapStyle, notes: Sequence[str] = ()
) -> Figure:
    """Per block, the top-3 ``|activation|`` of the block output and its median, averaged over images
    (Sun et al., arXiv 2402.17762, Fig. 1 / their ViT code), one panel per model, one shared log y axis.

    Where the top 1 sits (token and channel) is written where it changes from the block before, and
    at the first block; a tie among images is written as a tie, not as a place.
    """
    n = len(models)
    fig = Figure(
        figsize=(min(S.TEXT_WIDTH, max(3.5 * n, S.MIN_WIDTH)), 3.0), dpi=style.dpi, layout="constrained"
    )
    axes = fig.subplots(1, n, squeeze=False, sharey=True)[0]
    for m, (ax, (label, (stats, report))) in enumerate(zip(axes, models.items())):
        if stats.massive_top is None:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
            continue
        layers = stats.layers
        top = stats.massive_top.mean(axis=0)  # [L, 3]
        colour = S.model_colour(m)
        for k in range(top.shape[1]):
            kwargs = S.line_kwargs(0, k, colour)
            kwargs.update(alpha=1.0 - 0.25 * k)
            ax.plot(layers, top[:, k], label=f"top {k + 1}", **kwargs)
        ax.plot(layers, stats.massive_median.mean(axis=0), label="median", **S.line_kwargs(0, 3, "#555555"))
        previous = None
        for where, y in zip(report.massive or [], top[:, 0]):
            text = _massive_tag(where)
            if text == previous:
                continue
            previous = text
            late = where["layer"] > (layers[0] + layers[-1]) / 2
            ax.annotate(
                text,
                (where["layer"], y),
                fontsize=S.FONT_SMALL,
                xytext=(-3 if late else 3, 6),
                textcoords="offset points",
                ha="right" if late else "left",
                annotation_clip=True,
            )
        ax.set_yscale("log")
        S.log_ticks(ax)
        S.style_axes(ax, label, "block", "|activation|, mean over images" if m == 0 else "")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.margins(y=0.15)
    title = figure_title(style, "Massive activations per block")
    if title:
        fig.suptitle(title, fontsize=S.FONT_TITLE)
    S.finish(fig, ["labels: where the top 1 sits most often (written where it changes)", *notes], axes[:1], 4)
    return fig


def _massive_tag(where: dict) -> str:
    if where["tied_locations"] > 1:
        return f"top 1 varies ({where['tied_locations']}-way tie)"
    tag = {"cls": "CLS", "register": "register", "patch": "patch"}[where["token_type"]]
    return f"{tag} {where['token']}, ch {where['channel']}: {where['count']}/{where['n_images']} images"
