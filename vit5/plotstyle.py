"""The one figure style of vit5, so that figures put side by side match: DPI >= 150, fonts >= 8 pt at a
two-column page's text width, colour by model and line style by metric (Okabe and Ito's colour-blind-safe
palette, https://jfly.uni-koeln.de/color/). Imports matplotlib only, inside the functions that need it."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

DPI = 200
FONT_SMALL = 8  # ticks, legends, notes, colorbars: the floor
FONT = 9  # axis labels, panel titles
FONT_TITLE = 10  # figure titles
TEXT_WIDTH = 7.0  # inches: the widest figure row
LINE_SPACING = 1.35  # a text line is this many font sizes tall
MIN_WIDTH = (
    3.4  # inches: a one-panel figure is still one column wide (titles do not wrap into a tower)
)

# Okabe & Ito: blue, vermillion, bluish green, reddish purple, orange, sky blue, yellow, black
MODEL_COLOURS = (
    "#0072B2",
    "#D55E00",
    "#009E73",
    "#CC79A7",
    "#E69F00",
    "#56B4E9",
    "#F0E442",
    "#000000",
)
# (line style, marker) of the n-th metric of a plot
METRIC_STYLES = tuple(
    zip(("-", "--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 1)), (0, (3, 1, 1, 1, 1, 1))), "os^DvPX")
)
ROLE_COLOURS = {
    "train": "#000000",
    "val": MODEL_COLOURS[0],
    "val, EMA": MODEL_COLOURS[1],
    "patch": MODEL_COLOURS[0],
    "register": MODEL_COLOURS[4],
    "cls": MODEL_COLOURS[2],
}

METRIC_LABELS = {
    "outlier_ratio": "outlier patches (share)",
    "max_median_ratio": "max / median patch norm",
    "cls_register_mass": "CLS → registers",
    "patch_register_mass": "patches → registers",
    "sink_rate": "heads with a sink (share)",
    "outlier_artifact_share": "outliers on low-information patches",
}


def metric_label(key: str) -> str:
    """Words for a metric key; an unknown key is shown with spaces (never silently as a raw key)."""
    return METRIC_LABELS.get(key, key.replace("_", " "))


def model_colour(index: int) -> str:
    return MODEL_COLOURS[index % len(MODEL_COLOURS)]


def line_kwargs(model: int, metric: int, colour: str | None = None) -> dict:
    """``Axes.plot`` keywords: colour by model, style and marker by metric; later models thinner with open
    markers so coinciding lines stay visible."""
    linestyle, marker = METRIC_STYLES[metric % len(METRIC_STYLES)]
    colour = colour or model_colour(model)
    return dict(
        color=colour,
        linestyle=linestyle,
        marker=marker,
        linewidth=max(0.8, 1.4 - 0.4 * model),
        markersize=max(2.5, 3.5 - 0.5 * model),
        markerfacecolor=colour if model == 0 else "white",
        markeredgewidth=1.0,
    )


def style_axes(ax, title: str = "", xlabel: str = "", ylabel: str = "") -> None:
    """Fonts of one axes: title and labels at ``FONT``, ticks at ``FONT_SMALL``; a light grid."""
    for set_text, text in ((ax.set_title, title), (ax.set_xlabel, xlabel), (ax.set_ylabel, ylabel)):
        if text:
            set_text(text, fontsize=FONT)
    ax.tick_params(labelsize=FONT_SMALL)
    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() == "linear" and hasattr(axis.get_major_formatter(), "set_useOffset"):
            axis.get_major_formatter().set_useOffset(
                False
            )  # "+1.43" above an axis reads as a value
    ax.grid(alpha=0.25, linewidth=0.6)


def legend(ax, **kwargs):
    """A legend at ``FONT_SMALL`` (``loc="best"`` unless given); None without lines."""
    if not ax.get_legend_handles_labels()[0]:
        return None
    return ax.legend(
        **{"fontsize": FONT_SMALL, "framealpha": 0.85, "handlelength": 2.4, "loc": "best", **kwargs}
    )


def figure(width: float, height: float, dpi: float = DPI):
    """A constrained-layout figure of ``width`` x ``height`` inches (whole pixels at ``dpi``): the one
    layout system of vit5. Not pyplot, so drawing leaves the user's backend and global state alone."""
    from matplotlib.figure import Figure

    size = (_whole_pixels(width, dpi), _whole_pixels(height, dpi))
    return Figure(figsize=size, dpi=dpi, layout="constrained")


def settle(fig, passes: int = 4, tolerance: float = 1e-3) -> None:
    """Lay ``fig`` out until its axes stop moving, then keep that layout for every format it is saved
    in. Needed where a map keeps its aspect and its colorbar follows the map's box: the constrained
    layout measures the colorbar where the last draw left it, so each draw moves it a little less."""
    for _ in range(passes):
        before = [ax.get_position(original=True).bounds for ax in fig.axes]
        fig.draw_without_rendering()
        after = [ax.get_position(original=True).bounds for ax in fig.axes]
        moved = max(
            (abs(a - b) for box, old in zip(after, before) for a, b in zip(box, old)), default=0
        )
        if moved < tolerance:
            break
    fig.set_layout_engine("none")


def _whole_pixels(inches: float, dpi: float) -> float:
    """``inches`` rounded to whole pixels at ``dpi``, a hair above (Agg truncates the pixel count)."""
    return (round(inches * dpi) + 0.01) / dpi


def save_figure(
    fig, path_or_base: str | os.PathLike[str], formats: Sequence[str] | None = None, dpi=None
) -> list[Path]:
    """Write ``fig``: to ``path_or_base`` itself (its suffix names the format) when ``formats`` is
    None, else to ``path_or_base.<format>`` for each format. At ``dpi``, by default the figure's own:
    :data:`DPI` for every :func:`figure`, or what the user asked for (``--dpi``). Returns the paths."""
    base = Path(path_or_base)
    if formats is None:
        paths = [base]
    else:
        paths = [Path(f"{base}.{fmt}") for fmt in formats]
    base.parent.mkdir(parents=True, exist_ok=True)
    for path in paths:
        fig.savefig(path, format=path.suffix[1:], dpi=dpi or fig.dpi)
    return paths


def text_height(text: str, width: float, fontsize: float) -> float:
    """Inches that ``text`` takes once matplotlib wraps it (``wrap=True``) across ``width`` inches:
    an estimate that errs high (an average glyph of DejaVu Sans is below 0.6 em wide)."""
    if not text:
        return 0.0
    per_line = max(20, int(width * 72 / (fontsize * 0.6)))
    lines = sum(max(1, math.ceil(len(line) / per_line)) for line in text.split("\n"))
    return lines * fontsize * LINE_SPACING / 72


def notes_height(text: str, width: float) -> float:
    """Inches that :func:`finish` keeps under the axes for the notes ``text`` of a figure ``width``
    inches wide."""
    return text_height(text, width - 0.1, FONT_SMALL) + 0.06 if text else 0.0


def finish(
    fig, notes: Iterable[str] = (), legend_axes: Iterable = (), ncol: int | None = None
) -> None:
    """Below the axes of a :func:`figure`: one legend of ``legend_axes`` (each label once), then the
    ``notes``; the layout is confined above both, so neither overlaps an axis or the other."""
    width, height = fig.get_size_inches()
    text = "\n".join(note for note in notes if note)
    notes_h = notes_height(text, width)
    seen: dict[str, object] = {}
    for ax in legend_axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    legend_h = 0.0
    if seen:
        ncol = ncol or min(len(seen), 3)
        legend_rows = -(-len(seen) // ncol)
        legend_h = legend_rows * FONT_SMALL * LINE_SPACING * 1.15 / 72 + 0.1
        fig.legend(
            list(seen.values()),
            list(seen),
            ncol=ncol,
            loc="lower center",
            bbox_to_anchor=(0.5, notes_h / height),
            fontsize=FONT_SMALL,
            frameon=False,
            handlelength=2.4,
            borderaxespad=0.1,
        )
    if text:
        fig.text(0.5, 0.03 / height, text, ha="center", va="bottom", fontsize=FONT_SMALL, wrap=True)
    if notes_h or legend_h:
        below = (notes_h + legend_h) / height  # the share of the figure under the axes
        fig.get_layout_engine().set(rect=(0, below, 1, 1 - below))


def log_ticks(ax) -> None:
    """Plain numbers (``0.5``, ``2``) on a log y axis; minor labels only within about a decade."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    low, high = ax.get_ylim()
    if low > 0 and high / low < 30:
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
        ax.yaxis.set_minor_formatter(plain)
    else:
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="both", which="both", labelsize=FONT_SMALL)
