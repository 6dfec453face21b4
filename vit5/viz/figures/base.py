"""Drawing conventions shared by every figure, so that maps of different models can be compared.

- ``viridis`` by default; maps upsampled to pixels by repeating each patch value ``p x p``
  (nearest: the token grid and isolated outliers stay visible), bilinear optional;
- maps overlaid on the pixels the model saw with alpha 0.5;
- a colorbar on every scalar map; panels of one *group* share one colour scale, so a comparison
  never mixes per-panel min-max scales;
- clipping of a colour scale only on request, and then written on the figure;
- figures are :class:`matplotlib.figure.Figure` objects rendered by Agg (PNG) and the PDF
  backend, without pyplot, so importing this module changes no global matplotlib state;
- resolution, fonts and the widest row come from :mod:`vit5.plotstyle` (the one figure style): a
  row of panels is fitted to the text width of a page, so its 8-9 pt fonts are legible in print.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import cv2
import matplotlib
import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from vit5 import plotstyle as S
from vit5.errors import InputError


@dataclass(frozen=True)
class MapStyle:
    cmap: str = "viridis"
    alpha: float = 0.5
    upsample: Literal["nearest", "bilinear"] = "nearest"
    clip_percentile: float | None = None  # clip each colour scale at this percentile of its values
    dpi: int = S.DPI
    panel_inches: float = 2.4  # the widest a map gets; rows of many panels shrink to the text width
    formats: tuple[str, ...] = ("png", "pdf")
    title: str | None = None  # replaces every figure's title ("" for none: a paper sets its own caption)

    def __post_init__(self) -> None:
        if self.cmap not in matplotlib.colormaps:
            raise InputError(f"unknown colormap {self.cmap!r}: try viridis, inferno, magma or jet")
        if not 0.0 <= self.alpha <= 1.0:
            raise InputError(f"overlay alpha must be in [0, 1], got {self.alpha}")
        if self.upsample not in ("nearest", "bilinear"):
            raise InputError(f"upsampling is 'nearest' or 'bilinear', got {self.upsample!r}")
        if self.clip_percentile is not None and not 50.0 < self.clip_percentile <= 100.0:
            raise InputError(f"the clipping percentile must be in (50, 100], got {self.clip_percentile}")
        if self.dpi < 50:
            raise InputError(f"a figure needs at least 50 dpi, got {self.dpi} (default {S.DPI})")
        unknown = set(self.formats) - {"png", "pdf", "svg"}
        if unknown or not self.formats:
            raise InputError(f"figure formats are png, pdf or svg, got {list(self.formats)}")


def figure_title(style: MapStyle, default: str) -> str:
    """The title a figure gets: ``style.title`` when set (also ``""``), else its own."""
    return default if style.title is None else style.title


@dataclass
class Panel:
    """One cell of a figure: a scalar map (optionally over an image), an RGB map, or an image."""

    title: str = ""
    values: np.ndarray | None = None  # [h, w] per-patch scalars
    image: np.ndarray | None = None  # [H, W, 3] uint8 drawn underneath
    rgb: np.ndarray | None = None  # [h, w, 3] in [0, 1], drawn instead of a scalar map (no colorbar)
    group: str = ""  # panels with the same group share one colour scale
    patch: int = 16  # pixels per map cell (the model's patch size)
    marks: np.ndarray | None = None  # [h, w] bool: cells outlined in red (e.g. artifact-like outliers)
    second_marks: np.ndarray | None = None  # [h, w] bool: cells outlined dashed white (content-like ones)


@dataclass(frozen=True)
class Limits:
    vmin: float
    vmax: float
    note: str = ""


def upsample(values: np.ndarray, patch: int, mode: str = "nearest") -> np.ndarray:
    """Per-patch ``[h, w]`` to per-pixel ``[h * patch, w * patch]``."""
    if mode == "nearest":
        return np.repeat(np.repeat(values, patch, axis=0), patch, axis=1)
    h, w = values.shape
    return cv2.resize(values.astype(np.float32), (w * patch, h * patch), interpolation=cv2.INTER_LINEAR)


def color_limits(arrays: Sequence[np.ndarray], clip_percentile: float | None, label: str = "") -> Limits:
    """One colour scale for all ``arrays``; clipped at a percentile only when asked (and then noted)."""
    values = np.concatenate([np.ravel(a) for a in arrays]).astype(np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return Limits(0.0, 1.0)
    vmin, vmax = float(values.min()), float(values.max())
    note = ""
    if clip_percentile is not None and clip_percentile < 100:
        clipped = float(np.percentile(values, clip_percentile))
        prefix = f"{label}: " if label else ""
        note = (
            f"{prefix}colour scale clipped at the {clip_percentile:g}th percentile "
            f"({clipped:.3g}; max {vmax:.3g})"
        )
        vmax = clipped
    if vmax <= vmin:
        vmax = vmin + 1e-12
    return Limits(vmin, vmax, note)


# Panel geometry in inches: a map, its colorbar to the right (tick labels beyond it), its title above.
_TITLE_H, _PAD, _CBAR_GAP, _CBAR_W, _CBAR_LABELS, _HEADER_H, _NOTE_LINE_H = (
    0.3,
    0.1,
    0.05,
    0.1,
    0.42,
    0.4,
    0.15,
)
_CELL_EXTRA = _CBAR_GAP + _CBAR_W + _CBAR_LABELS + _PAD
_MIN_MAP = 1.0  # inches: below this a map is unreadable, so wide grids exceed the text width instead


def _text_lines(texts: Sequence[str], width: float, fontsize: float) -> int:
    """Lines the wrapped ``texts`` take across ``width`` inches (an estimate from an average glyph width)."""
    per_line = max(20, int(width * 72 / (fontsize * 0.6)))
    return sum(math.ceil(len(t) / per_line) for t in texts if t)


def _header_height(title_lines: int) -> float:
    if title_lines == 0:
        return _PAD
    return _HEADER_H + (title_lines - 1) * _NOTE_LINE_H * S.FONT_TITLE / S.FONT_SMALL


def map_inches(cols: int, style: MapStyle) -> float:
    """Width of one map in a row of ``cols`` panels: ``style.panel_inches``, or less so the row fits the
    text width, but never under an inch."""
    fit = S.TEXT_WIDTH / cols - _CELL_EXTRA
    return max(_MIN_MAP, min(style.panel_inches, fit))


def figure_size(
    rows: int, cols: int, aspect: float, style: MapStyle, note_lines: int = 0, title_lines: int = 1
) -> tuple[float, float]:
    """Inches of a grid of panels showing maps of width / height ``aspect`` (plus colorbars, titles, notes).

    At least :data:`vit5.plotstyle.MIN_WIDTH` wide; snapped to whole pixels at ``style.dpi``: the PNG
    is ``round(inches * dpi)`` pixels.
    """
    map_w = map_inches(cols, style)
    cell_w = map_w + _CELL_EXTRA
    cell_h = map_w / aspect + _TITLE_H + _PAD
    width, height = (
        max(cols * cell_w, S.MIN_WIDTH),
        rows * cell_h + _header_height(title_lines) + note_lines * _NOTE_LINE_H + _PAD,
    )
    snap = lambda inches: (round(inches * style.dpi) + 0.01) / style.dpi  # noqa: E731  (Agg truncates)
    return snap(width), snap(height)


def panel_grid(
    rows: Sequence[Sequence[Panel | None]],
    style: MapStyle,
    title: str,
    notes: Sequence[str] = (),
    fixed_limits: Mapping[str, tuple[float, float]] | None = None,
) -> Figure:
    """Draw panels row by row (``None`` leaves a cell empty) on a fixed grid; returns the figure.

    Panels of one group share a colour scale: their joint range, or ``fixed_limits[group]``.

    The layout is computed, not searched (no constrained layout), so the size is exactly
    :func:`figure_size` and every map fills its axes without letterboxing.
    """
    cols = max(len(r) for r in rows)
    first = next(p for r in rows for p in r if p is not None)
    h_px, w_px = _panel_shape(first)
    aspect = w_px / h_px
    panels = [p for r in rows for p in r if p is not None]
    limits = _group_limits(panels, style)
    limits.update({group: Limits(*bounds) for group, bounds in (fixed_limits or {}).items()})
    all_notes = [n for n in notes if n] + sorted({lim.note for lim in limits.values() if lim.note})
    title = figure_title(style, title)
    width, _ = figure_size(len(rows), cols, aspect, style)
    title_lines = _text_lines([title], width, S.FONT_TITLE)
    width, height = figure_size(
        len(rows), cols, aspect, style, _text_lines(all_notes, width, S.FONT_SMALL), title_lines
    )
    header = _header_height(title_lines)
    fig = Figure(figsize=(width, height), dpi=style.dpi)
    map_w = map_inches(cols, style)
    map_h = map_w / aspect
    cell_w, cell_h = map_w + _CELL_EXTRA, map_h + _TITLE_H + _PAD
    margin = (width - cols * cell_w) / 2  # a one-panel figure is centred in its minimum width
    for i, row in enumerate(rows):
        for j, panel in enumerate(row):
            if panel is None:
                continue
            left = margin + j * cell_w + _PAD
            bottom = height - header - (i + 1) * cell_h + _PAD
            ax = fig.add_axes((left / width, bottom / height, map_w / width, map_h / height))
            cax = None
            if panel.values is not None:
                cax_left = left + map_w + _CBAR_GAP
                cax = fig.add_axes((cax_left / width, bottom / height, _CBAR_W / width, map_h / height))
            _draw(fig, ax, cax, panel, style, limits.get(panel.group))
    if title:
        fig.suptitle(title, fontsize=S.FONT_TITLE, y=1 - 0.1 / height, va="top", wrap=True)
    if all_notes:
        fig.text(
            0.5,
            _PAD / 2 / height,
            "\n".join(all_notes),
            ha="center",
            va="bottom",
            fontsize=S.FONT_SMALL,
            wrap=True,
        )
    return fig


def _panel_shape(panel: Panel) -> tuple[int, int]:
    if panel.image is not None:
        return panel.image.shape[:2]
    grid = panel.values if panel.values is not None else panel.rgb
    return grid.shape[0] * panel.patch, grid.shape[1] * panel.patch


def _group_limits(panels: Sequence[Panel], style: MapStyle) -> dict[str, Limits]:
    groups: dict[str, list[np.ndarray]] = {}
    for p in panels:
        if p.values is not None:
            groups.setdefault(p.group, []).append(p.values)
    return {g: color_limits(arrays, style.clip_percentile, g) for g, arrays in groups.items()}


def _draw(fig: Figure, ax, cax, panel: Panel, style: MapStyle, limits: Limits | None) -> None:
    patch = panel.patch
    h, w = _panel_shape(panel)
    extent = (0, w, h, 0)
    if panel.image is not None:
        ax.imshow(panel.image, extent=extent, interpolation="nearest")
    if panel.rgb is not None:
        rgb = np.stack([upsample(panel.rgb[..., c], patch, style.upsample) for c in range(3)], axis=-1)
        ax.imshow(
            np.clip(rgb, 0, 1),
            extent=extent,
            interpolation="nearest",
            alpha=style.alpha if panel.image is not None else 1.0,
        )
    if panel.values is not None:
        alpha = style.alpha if panel.image is not None else 1.0
        norm = Normalize(limits.vmin, limits.vmax)
        ax.imshow(
            upsample(panel.values, patch, style.upsample),
            extent=extent,
            cmap=style.cmap,
            norm=norm,
            alpha=alpha,
            interpolation="nearest",
        )
        colorbar = fig.colorbar(ScalarMappable(norm=norm, cmap=style.cmap), cax=cax)
        colorbar.ax.tick_params(labelsize=S.FONT_SMALL)
        colorbar.locator = MaxNLocator(4)
        colorbar.update_ticks()
    for marks, colour, dash in ((panel.marks, "red", "-"), (panel.second_marks, "white", "--")):
        if marks is None:
            continue
        for r, c in zip(*np.nonzero(marks)):
            ax.add_patch(
                Rectangle(
                    (c * patch, r * patch),
                    patch,
                    patch,
                    fill=False,
                    edgecolor=colour,
                    linestyle=dash,
                    linewidth=1.2,
                )
            )
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)
    ax.set_aspect("auto")  # the axes box already has the map's aspect
    ax.set_axis_off()
    ax.set_title(panel.title, fontsize=S.FONT, pad=3)


def save_figure(fig: Figure, base: str | Path, formats: Sequence[str]) -> list[Path]:
    """Write ``base.<fmt>`` for each format; returns the paths."""
    base = Path(base)
    base.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = base.parent / f"{base.name}.{fmt}"
        fig.savefig(path, format=fmt, dpi=fig.dpi)
        paths.append(path)
    return paths
