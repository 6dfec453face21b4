"""Figures (matplotlib, no pyplot): every builder returns a Figure, and
:func:`vit5.plotstyle.save_figure` writes it. Maps stay comparable: patch values repeated
``p x p`` (the token grid stays visible), overlays on the pixels the model saw, a colorbar on
every scalar map, one colour scale per *group* of panels, clipping only on request and then
written on the figure; sizes, fonts and the one layout system (constrained layout) from
:mod:`vit5.plotstyle`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import cv2
import matplotlib
import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter
from sklearn.decomposition import PCA

from vit5 import plotstyle as S
from vit5.errors import InputError
from vit5.plotstyle import metric_label
from vit5.viz.artifacts import MetricReport
from vit5.viz.images import LoadedImage
from vit5.viz.stats import TokenStats, cls_maps, norm_map, received_map, register_maps, rollout_map

PCA_CLIP = (1.0, 99.0)  # percentiles each PCA component is scaled between (and clipped at)
RAW = "raw: share of all tokens, so CLS and registers hold the rest"
NORM_KIND = "L2 norms of block outputs, before the final norm"
MARK_CAPTIONS = {
    "artifact": "red: artifact-like outliers (flat patch, like its neighbours)",
    "content": "white dashed: content-like outliers",
}


@dataclass(frozen=True)
class MapStyle:
    cmap: str = "viridis"
    alpha: float = 0.5
    upsample: Literal["nearest", "bilinear"] = "nearest"
    clip_percentile: float | None = None  # clip each colour scale at this percentile of its values
    dpi: int = S.DPI
    panel_inches: float = 2.4  # the widest a map gets; rows of many panels shrink to the text width
    formats: tuple[str, ...] = ("png", "pdf")
    title: str | None = (
        None  # replaces every figure's title ("" for none: a paper sets its own caption)
    )

    def __post_init__(self) -> None:
        if self.cmap not in matplotlib.colormaps:
            raise InputError(f"unknown colormap {self.cmap!r}: try viridis, inferno, magma or jet")
        if not 0.0 <= self.alpha <= 1.0:
            raise InputError(f"overlay alpha must be in [0, 1], got {self.alpha}")
        if self.upsample not in ("nearest", "bilinear"):
            raise InputError(f"upsampling is 'nearest' or 'bilinear', got {self.upsample!r}")
        if self.clip_percentile is not None and not 50.0 < self.clip_percentile <= 100.0:
            raise InputError(
                f"the clipping percentile must be in (50, 100], got {self.clip_percentile}"
            )
        if self.dpi < 50:
            raise InputError(f"a figure needs at least 50 dpi, got {self.dpi} (default {S.DPI})")
        if not self.formats or set(self.formats) - {"png", "pdf", "svg"}:
            raise InputError(f"figure formats are png, pdf or svg, got {list(self.formats)}")

    def title_or(self, default: str) -> str:
        return default if self.title is None else self.title

    def suptitle(self, fig: Figure, default: str) -> None:
        if title := self.title_or(default):
            fig.suptitle(title, fontsize=S.FONT_TITLE)


@dataclass
class Panel:
    """One cell of a figure: a scalar map (optionally over an image), an RGB map, or an image."""

    title: str = ""
    values: np.ndarray | None = None  # [h, w] per-patch scalars
    image: np.ndarray | None = None  # [H, W, 3] uint8 drawn underneath
    rgb: np.ndarray | None = (
        None  # [h, w, 3] in [0, 1], drawn instead of a scalar map (no colorbar)
    )
    group: str = ""  # panels with the same group share one colour scale
    patch: int = 16  # pixels per map cell (the model's patch size)
    marks: np.ndarray | None = (
        None  # [h, w] bool: cells outlined in red (e.g. artifact-like outliers)
    )
    second_marks: np.ndarray | None = (
        None  # [h, w] bool: cells outlined dashed white (content-like ones)
    )

    @property
    def shape(self) -> tuple[int, int]:
        if self.image is not None:
            return self.image.shape[:2]
        grid = self.values if self.values is not None else self.rgb
        return grid.shape[0] * self.patch, grid.shape[1] * self.patch


def upsample(values: np.ndarray, patch: int, mode: str = "nearest") -> np.ndarray:
    """Per-patch ``[h, w]`` to per-pixel ``[h * patch, w * patch]``."""
    flag = (
        cv2.INTER_NEAREST if mode == "nearest" else cv2.INTER_LINEAR
    )  # nearest: each value p x p times
    return cv2.resize(values.astype(np.float32), None, fx=patch, fy=patch, interpolation=flag)


def color_limits(
    arrays: Sequence[np.ndarray], clip_percentile: float | None, label: str = ""
) -> tuple[float, float, str]:
    """One colour scale ``(vmin, vmax, note)`` for all ``arrays``, clipped at a percentile only when asked."""
    values = np.concatenate([np.ravel(a) for a in arrays]).astype(np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return 0.0, 1.0, ""
    vmin = float(values.min())
    vmax = float(values.max())
    note = ""
    if clip_percentile is not None and clip_percentile < 100:
        clipped = float(np.percentile(values, clip_percentile))
        note = (
            f"{label}: " * bool(label)
            + f"colour scale clipped at the {clip_percentile:g}th percentile "
        )
        note += f"({clipped:.3g}; max {vmax:.3g})"
        vmax = clipped
    return vmin, vmax if vmax > vmin else vmin + 1e-12, note


CBAR_INCHES = 0.6  # beside a map: its colorbar and the colorbar's tick labels
CBAR_BOX = (
    1.04,
    0.0,
    0.05,
    1.0,
)  # the colorbar in the map's axes coordinates (x, y, width, height)
TITLE_INCHES = 0.3  # above a map: its title
MIN_MAP = 1.0  # inches: below this a map is unreadable, so wide grids exceed the text width instead


def map_inches(cols: int, style: MapStyle) -> float:
    """One map's width in a row of ``cols``: ``style.panel_inches``, less to fit the text width,
    at least :data:`MIN_MAP`."""
    fitted = S.TEXT_WIDTH / cols - CBAR_INCHES
    return max(MIN_MAP, min(style.panel_inches, fitted))


def panel_grid(
    rows: Sequence[Sequence[Panel | None]],
    style: MapStyle,
    title: str,
    notes: Sequence[str] = (),
    fixed_limits: Mapping[str, tuple[float, float]] | None = None,
) -> Figure:
    """Draw panels row by row (``None``: an empty cell) on a constrained-layout grid, each map at
    its own aspect with its colorbar beside it; panels of one group share a colour scale: their
    joint range, or ``fixed_limits[group]``. The figure is sized so the maps fill it: the text
    width for a long row, at least :data:`vit5.plotstyle.MIN_WIDTH` for one panel."""
    cols = max(len(row) for row in rows)
    panels = [panel for row in rows for panel in row if panel is not None]
    limits = _group_limits(panels, style.clip_percentile)
    for group, bounds in (fixed_limits or {}).items():
        limits[group] = (*bounds, "")
    clipping = sorted({note for _, _, note in limits.values() if note})
    map_h_px, map_w_px = panels[0].shape
    map_w = map_inches(cols, style)
    width = max(cols * (map_w + CBAR_INCHES), S.MIN_WIDTH)
    title = style.title_or(title)
    all_notes = [note for note in [*notes, *clipping] if note]
    height = len(rows) * (map_w * map_h_px / map_w_px + TITLE_INCHES)
    height += S.text_height(title, width, S.FONT_TITLE) + 0.2
    height += S.notes_height("\n".join(all_notes), width)
    fig = S.figure(width, height, style.dpi)
    grid = fig.add_gridspec(len(rows), cols)
    for i, row in enumerate(rows):
        for j, panel in enumerate(row):
            if panel is not None:
                ax = fig.add_subplot(grid[i, j])
                _draw(fig, ax, panel, style, limits.get(panel.group))
    if title:
        fig.suptitle(title, fontsize=S.FONT_TITLE, wrap=True)
    S.finish(fig, all_notes)
    S.settle(fig)
    return fig


def _group_limits(
    panels: Sequence[Panel], clip_percentile: float | None
) -> dict[str, tuple[float, float, str]]:
    """One colour scale per group of scalar maps (:func:`color_limits`)."""
    groups: dict[str, list[np.ndarray]] = {}
    for panel in panels:
        if panel.values is not None:
            groups.setdefault(panel.group, []).append(panel.values)
    return {group: color_limits(arrays, clip_percentile, group) for group, arrays in groups.items()}


def _draw(
    fig: Figure, ax, panel: Panel, style: MapStyle, limits: tuple[float, float, str] | None
) -> None:
    patch = panel.patch
    h, w = panel.shape
    extent = (0, w, h, 0)
    alpha = style.alpha if panel.image is not None else 1.0
    if panel.image is not None:
        ax.imshow(panel.image, extent=extent, interpolation="nearest")
    if panel.rgb is not None:
        channels = [upsample(panel.rgb[..., c], patch, style.upsample) for c in range(3)]
        rgb = np.clip(np.stack(channels, axis=-1), 0, 1)
        ax.imshow(rgb, extent=extent, interpolation="nearest", alpha=alpha)
    if panel.values is not None:
        norm = Normalize(limits[0], limits[1])
        values = upsample(panel.values, patch, style.upsample)
        ax.imshow(
            values,
            extent=extent,
            cmap=style.cmap,
            norm=norm,
            alpha=alpha,
            interpolation="nearest",
        )
        mappable = ScalarMappable(norm=norm, cmap=style.cmap)
        cax = ax.inset_axes(CBAR_BOX)  # follows the map's box, so it is exactly the map's height
        colorbar = fig.colorbar(mappable, cax=cax, ticks=MaxNLocator(4))
        colorbar.ax.tick_params(labelsize=S.FONT_SMALL)
    outlines = ((panel.marks, "red", "-"), (panel.second_marks, "white", "--"))
    for marks, colour, dash in outlines:
        for r, c in zip(*np.nonzero(marks)) if marks is not None else ():
            corner = (c * patch, r * patch)
            box = Rectangle(corner, patch, patch, fill=False, ec=colour, ls=dash, lw=1.2)
            ax.add_patch(box)
    ax.set(xlim=(0, w), ylim=(h, 0), aspect="equal")  # a map keeps its pixels square
    ax.set_axis_off()
    ax.set_title(panel.title, fontsize=S.FONT, pad=3)


def _title(stats: TokenStats, image: LoadedImage, what: str) -> str:
    return f"{stats.model} | {image.name}: {what}"


def _on(
    stats: TokenStats, image: LoadedImage, title: str, values: np.ndarray, group: str, **marks
) -> Panel:
    return Panel(title, values, image.rgb, group=group, patch=stats.patch_size, **marks)


IMAGE_FIGURES = {
    "attention": "cls_attention",
    "registers": "register_attention",
    "rollout": "rollout",
}
IMAGE_FIGURES["norms"] = "norm_map"  # view -> file name of its per-image figure


def image_figure(
    view: str,
    stats: TokenStats,
    index: int,
    image: LoadedImage,
    layers: Sequence[int],
    style: MapStyle,
    renormalise: bool = False,
    outliers: np.ndarray | None = None,
    notes: Sequence[str] = (),
) -> Figure:
    """The figure of one image for a view of :data:`IMAGE_FIGURES`, one colour scale per layer. ``attention``:
    a row per layer of every head's CLS-to-patch map and the head mean; ``registers``: a row per layer, a map
    per register (head mean, raw); ``rollout``: attention rollout over all blocks, on the image and alone;
    ``norms``: a panel per layer, ``outliers`` outlined, red where artifact-like, dashed white where
    content-like (:class:`vit5.viz.stats.PatchContent`)."""
    if view == "attention":
        drawn = _attention_panels(stats, index, image, layers, renormalise)
    elif view == "registers":
        drawn = _register_panels(stats, index, image, layers)
    elif view == "rollout":
        drawn = _rollout_panels(stats, index, image)
    else:
        drawn = _norm_panels(stats, index, image, layers, outliers)
    title = _title(stats, image, drawn.what)
    return panel_grid(drawn.rows, style, title, [drawn.before, *notes, *drawn.after])


@dataclass
class _ImagePanels:
    """The panels of one per-image figure, what it shows, and its notes before and after the caller's."""

    rows: list[list[Panel]]
    what: str
    before: str
    after: list[str] = field(default_factory=list)


def _layer_group(layer: int) -> str:
    return f"layer {layer}"


def _attention_panels(
    stats: TokenStats,
    index: int,
    image: LoadedImage,
    layers: Sequence[int],
    renormalise: bool,
) -> _ImagePanels:
    rows = []
    for layer in layers:
        maps = cls_maps(stats, index, layer, renormalise)
        titles = [f"layer {layer} head {h}" for h in range(len(maps))]
        titles.append(f"layer {layer} head mean")
        values = [*maps, maps.mean(0)]
        group = _layer_group(layer)
        rows.append([_on(stats, image, t, v, group) for t, v in zip(titles, values)])
    if renormalise:
        what = "CLS-to-patch attention (renormalised)"
        return _ImagePanels(rows=rows, what=what, before="renormalised over the patches")
    return _ImagePanels(rows=rows, what="CLS-to-patch attention (raw)", before=RAW)


def _register_panels(
    stats: TokenStats, index: int, image: LoadedImage, layers: Sequence[int]
) -> _ImagePanels:
    rows = []
    for layer in layers:
        maps = register_maps(stats, index, layer)
        titles = [f"layer {layer} register {r}" for r in range(len(maps))]
        group = _layer_group(layer)
        rows.append([_on(stats, image, t, m, group) for t, m in zip(titles, maps)])
    what = "register-to-patch attention (head mean)"
    return _ImagePanels(rows=rows, what=what, before=RAW)


def _rollout_panels(stats: TokenStats, index: int, image: LoadedImage) -> _ImagePanels:
    values = rollout_map(stats, index)
    source = "CLS" if stats.cls_attn is not None else "mean patch"
    alone = Panel("map", values, group="rollout", patch=stats.patch_size)
    on_image = _on(stats, image, "on the image", values, "rollout")
    before = f"{source} row, head mean, 0.5 identity (Abnar & Zuidema 2020)"
    return _ImagePanels(rows=[[on_image, alone]], what="attention rollout", before=before)


def _norm_panels(
    stats: TokenStats,
    index: int,
    image: LoadedImage,
    layers: Sequence[int],
    outliers: np.ndarray | None,
) -> _ImagePanels:
    """A panel per layer; ``outliers`` outlined, red where artifact-like, dashed white where
    content-like, and a caption for each kind drawn."""
    content = stats.content
    artifact_like = None
    if content is not None:
        artifact_like = stats.to_grid(content.artifact_like[index])
    row = []
    drawn = set()
    for layer in layers:
        pos = stats.layer_position(layer)
        title = f"block {stats.layers[pos]}"
        marks = None
        second = None
        if outliers is not None:
            found = stats.to_grid(outliers[index, pos])
            marks = found
            if artifact_like is not None:
                marks = found & artifact_like
                second = found & ~artifact_like
            title += _outlier_count(int(found.sum()), marks, second)
            kinds = zip(MARK_CAPTIONS, (marks, second))
            drawn |= {kind for kind, m in kinds if m is not None and m.any()}
        norms = norm_map(stats, index, layer)
        group = _layer_group(layer)
        row.append(_on(stats, image, title, norms, group, marks=marks, second_marks=second))
    after = [MARK_CAPTIONS[key] for key in MARK_CAPTIONS if key in drawn]
    if "artifact" in drawn and artifact_like is None:
        after = ["red: tokens above the outlier threshold of their block"]
    return _ImagePanels(rows=[row], what="patch-token norms", before=NORM_KIND, after=after)


def _outlier_count(n: int, marks: np.ndarray, second: np.ndarray | None) -> str:
    """``": 3 outliers, 1 artifact-like"`` (the split only where the content was recorded)."""
    if not n:
        return ": no outliers"
    text = f": {n} outlier{'s' if n > 1 else ''}"
    if second is not None:
        text += f", {int(marks.sum())} artifact-like"
    return text


def _view(
    stats: TokenStats,
    view: str,
    index: int,
    image: LoadedImage,
    layer: int,
    renormalise: bool,
    prefix: str,
) -> Panel:
    """A summary or comparison map at ``layer``: rollout, norms or attention (CLS head mean; without CLS,
    the attention each patch receives, where sinks show: Darcet et al. 2023, Fig. 1 and 7)."""
    at = stats.layers[stats.layer_position(layer)]
    if view == "rollout":
        return _on(stats, image, prefix + "rollout", rollout_map(stats, index), "rollout")
    if view == "norms":
        return _on(
            stats, image, f"{prefix}norms, layer {at}", norm_map(stats, index, layer), "norms"
        )
    if stats.cls_attn is not None:
        values = cls_maps(stats, index, layer, renormalise).mean(axis=0)
        kind = "CLS attention"
    else:
        values = received_map(stats, index, layer)
        kind = "attention received"
    return _on(stats, image, f"{prefix}{kind}, layer {at}", values, kind)


def compare_figure(
    models: Sequence[TokenStats],
    index: int,
    image: LoadedImage,
    layer: int,
    style: MapStyle,
    renormalise: bool = False,
    notes: Sequence[str] = (),
) -> Figure:
    """Columns: the image then each model; rows: attention and norms at block ``layer`` (-1: each model's
    last), one colour scale per row."""
    rows = [[Panel("image", image=image.rgb, patch=models[0].patch_size)], [None]]
    for s in models:
        rows[0].append(_view(s, "attention", index, image, layer, renormalise, f"{s.model}: "))
        rows[1].append(_view(s, "norms", index, image, layer, renormalise, f"{s.model}: "))
    names = " vs ".join(s.model for s in models)
    return panel_grid(rows, style, f"{image.name}: {names} (shared colour scale per row)", notes)


def summary_figure(
    models: Sequence[TokenStats],
    images: Sequence[LoadedImage],
    views: Sequence[str],
    layer: int,
    style: MapStyle,
    pca: np.ndarray | None = None,
    renormalise: bool = False,
    notes: Sequence[str] = (),
) -> Figure:
    """One row per image (``models`` order): the image, then per view among ``attention`` (CLS head mean; of
    a model without CLS in a comparison, the attention each patch receives), ``rollout`` and ``norms`` every
    model's map, one colour scale per view, and ``pca`` (``pca [B, h, w, 3]``)."""
    several = len(models) > 1
    names = " vs ".join(s.model for s in models)
    rows = []
    for i, image in enumerate(images):
        rows.append([Panel(image.name, image=image.rgb, patch=models[0].patch_size)])
        for view, s in ((v, s) for v in views for s in models if v != "pca"):
            if view != "attention" or several or s.cls_attn is not None:
                rows[-1].append(
                    _view(s, view, i, image, layer, renormalise, f"{s.model}: " * several)
                )
        if "pca" in views and pca is not None:
            rows[-1].append(Panel("PCA RGB", rgb=pca[i], patch=models[0].patch_size))
    title = f"{names}: summary of {len(images)} images (one colour scale per column)"
    title = (
        f"{names}: attention and token norms (shared colour scale per kind)" if several else title
    )
    return panel_grid(rows, style, title, notes)


def pca_rgb(features: np.ndarray, grid: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """PCA of dense patch features ``[B, P, C]`` (the DINOv2 README figure), one PCA over all images so a
    colour means the same direction in each: RGB maps ``[B, h, w, 3]`` in [0, 1] (each component scaled
    between its :data:`PCA_CLIP` percentiles and clipped) and the explained variance ratios ``[3]``."""
    b, p, c = features.shape
    if b * p < 3 or c < 3:
        raise InputError(
            f"PCA to RGB needs at least 3 patch tokens and 3 channels, got {b * p} tokens of {c} channels"
        )
    pca = PCA(n_components=3, svd_solver="full", random_state=0)
    comps = pca.fit_transform(features.reshape(b * p, c).astype(np.float64))
    lo, hi = np.percentile(comps, PCA_CLIP, axis=0)
    scaled = np.clip((comps - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0, 1.0)
    return scaled.reshape(b, *grid, 3), pca.explained_variance_ratio_


def pca_note(variance: np.ndarray) -> str:
    shares = ", ".join(f"PC{i + 1} {v:.0%}" for i, v in enumerate(variance))
    return (
        "RGB = PC1, PC2, PC3 of the final-norm patch features, one PCA over all images (variance: "
        f"{shares}); each component clipped to its {PCA_CLIP[0]:g}-{PCA_CLIP[1]:g}th percentiles (no "
        "colorbar: a 3-channel map)"
    )


def pca_figure(
    stats: TokenStats,
    image: LoadedImage,
    rgb: np.ndarray,
    variance: np.ndarray,
    style: MapStyle,
    notes=(),
) -> Figure:
    p = stats.patch_size
    title = _title(stats, image, "PCA of dense features")
    panels = [
        Panel("image", image=image.rgb, patch=p),
        Panel("PCA of patch features", rgb=rgb, patch=p),
    ]
    return panel_grid([panels], style, title, [*notes, pca_note(variance)])


def outlier_frequency_figure(
    stats: TokenStats,
    report: MetricReport,
    layers: Sequence[int],
    style: MapStyle,
    notes: Sequence[str] = (),
) -> Figure:
    """Per grid position, the share of images whose token there is an outlier (VTNR Fig. 10; shows border
    bias and stripes from position-embedding interpolation); one scale, 0 to 1, and the outliers'
    placement (``report.placement``) when the images' content was recorded."""
    positions = [stats.layer_position(layer) for layer in layers]
    shares = [stats.to_grid(report.outliers[:, pos].mean(axis=0)) for pos in positions]
    panels = [
        Panel(f"layer {n}", s, group="share", patch=stats.patch_size)
        for n, s in zip(layers, shares)
    ]
    title = (
        f"{stats.model}: images with an outlier token at each position ({stats.num_images} images)"
    )
    placement = []
    for e in [report.placement[pos] for pos in positions] if report.placement else []:
        n = e["outliers"]
        where = (
            f"{e['artifact_like']} of {n} outliers artifact-like (flat, like their neighbours), "
            f"{e['content_like']} content-like"
        )
        placement.append(f"block {e['layer']}: {where if n else 'no outliers'}")
    return panel_grid(
        [panels], style, title, [*notes, *placement], fixed_limits={"share": (0.0, 1.0)}
    )


def norm_histogram_figure(
    stats: TokenStats, thresholds: np.ndarray, style: MapStyle, notes: Sequence[str] = ()
) -> Figure:
    """Small multiples, one per layer, four to a row: norms of patch, register and CLS tokens over all images;
    linear norm axis, log count axis, the outlier threshold as a dashed line (VTNR Fig. 4a)."""
    num = len(stats.layers)
    cols = min(4, num)
    rows = math.ceil(num / cols)
    width = min(S.TEXT_WIDTH, max(cols * 1.75, S.MIN_WIDTH))
    fig = S.figure(width, rows * 1.6 + 0.9, style.dpi)
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    types = np.asarray(stats.layout.token_types())
    for pos, layer in enumerate(stats.layers):
        ax = axes.flat[pos]
        norms = stats.norms[:, pos]
        bins = np.linspace(0.0, max(float(norms.max()), float(thresholds[pos])) * 1.05, 41)
        for kind in ("patch", "register", "cls"):
            values = norms[:, types == kind].ravel()
            if values.size:
                label = f"{'CLS' if kind == 'cls' else kind} tokens"
                ax.hist(values, bins=bins, color=S.ROLE_COLOURS[kind], alpha=0.6, label=label)
        ax.axvline(
            thresholds[pos], color="black", linestyle="--", linewidth=1, label="outlier threshold"
        )
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.xaxis.set_major_locator(MaxNLocator(3))
        bottom = pos // cols == rows - 1
        left = pos % cols == 0
        xlabel = "token norm" if bottom else ""
        S.style_axes(ax, f"block {layer}", xlabel, "count" if left else "")
        ax.grid(False)
    for ax in axes.flat[num:]:
        ax.set_axis_off()
    style.suptitle(fig, f"{stats.model}: token norms per block ({stats.num_images} images)")
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
    fig = S.figure(S.TEXT_WIDTH, 2.9, style.dpi)
    axes = fig.subplots(1, len(PROFILE_PANELS), squeeze=False)[0]
    several = len(reports) > 1
    order = [
        name for _, names in PROFILE_PANELS for name in names
    ]  # one line style per metric, everywhere
    for ax, (title, names) in zip(axes, PROFILE_PANELS):
        for m, (label, report) in enumerate(reports.items()):
            for name in (name for name in names if name in report.summary):
                s = report.summary[name]
                layers = report.layers
                n = len(layers)
                text = f"{label}: {metric_label(name)}" if several else metric_label(name)
                ax.plot(layers, s["value"][:n], label=text, **S.line_kwargs(m, order.index(name)))
                if report.intervals:
                    ax.fill_between(
                        layers,
                        s["ci_low"][:n],
                        s["ci_high"][:n],
                        color=S.model_colour(m),
                        alpha=0.15,
                    )
        if not ax.lines:
            note = "not applicable\n(no registers)"
            ax.text(
                0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes, fontsize=S.FONT
            )
        S.style_axes(ax, title, "block")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    first = next(iter(reports.values()))
    style.suptitle(fig, f"Layer profile: {', '.join(reports)}")
    bands = (
        f"bands: {int(first.config.ci * 100)}% bootstrap over images" if first.intervals else None
    )
    S.finish(fig, [bands or first.interval_note(), *notes], axes, ncol=2 if several else 3)
    return fig


def massive_activation_figure(
    models: Mapping[str, tuple[TokenStats, MetricReport]],
    style: MapStyle,
    notes: Sequence[str] = (),
) -> Figure:
    """Per block, the top-3 ``|activation|`` of the block output and its median, averaged over images
    (Sun et al., arXiv 2402.17762, Fig. 1 / their ViT code), one panel per model, one shared log y axis;
    where the top 1 sits is written where it changes from the block before (a tie among images as a tie)."""
    width = min(S.TEXT_WIDTH, max(3.5 * len(models), S.MIN_WIDTH))
    fig = S.figure(width, 3.0, style.dpi)
    axes = fig.subplots(1, len(models), squeeze=False, sharey=True)[0]
    for m, (ax, (label, (stats, report))) in enumerate(zip(axes, models.items())):
        if stats.massive_top is None:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
            continue
        layers = stats.layers
        top = stats.massive_top.mean(axis=0)  # [L, 3]
        colour = S.model_colour(m)
        for k in range(top.shape[1]):
            line = S.line_kwargs(0, k, colour) | {"alpha": 1.0 - 0.25 * k}
            ax.plot(layers, top[:, k], label=f"top {k + 1}", **line)
        ax.plot(
            layers,
            stats.massive_median.mean(axis=0),
            label="median",
            **S.line_kwargs(0, 3, "#555555"),
        )
        previous = None
        for where, y in zip(report.massive or [], top[:, 0]):
            if (text := _massive_tag(where)) == previous:
                continue
            previous = text
            late = where["layer"] > (layers[0] + layers[-1]) / 2
            side = dict(xytext=(-3, 6), ha="right") if late else dict(xytext=(3, 6), ha="left")
            side.update(textcoords="offset points", fontsize=S.FONT_SMALL, annotation_clip=True)
            ax.annotate(text, (where["layer"], y), **side)
        ax.set_yscale("log")
        S.log_ticks(ax)
        S.style_axes(ax, label, "block", "|activation|, mean over images" if m == 0 else "")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.margins(y=0.15)
    style.suptitle(fig, "Massive activations per block")
    S.finish(
        fig,
        ["labels: where the top 1 sits most often (written where it changes)", *notes],
        axes[:1],
        4,
    )
    return fig


def _massive_tag(where: dict) -> str:
    if where["tied_locations"] > 1:
        return f"top 1 varies ({where['tied_locations']}-way tie)"
    tag = "CLS" if where["token_type"] == "cls" else where["token_type"]
    return f"{tag} {where['token']}, ch {where['channel']}: {where['count']}/{where['n_images']} images"
