"""The report's figures: grouped bars and lines, written as PNG with matplotlib (no display)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.figure import Figure  # not pyplot: importing vit5.bench leaves the user's backend alone


def bar_chart(
    path: Path,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    errors: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    title: str = "",
    ylabel: str = "",
    reference_line: float | None = None,
) -> Path:
    """Bars for each group (x) and series (colour); ``errors`` are (low, high) per bar (e.g. IQR)."""
    fig = Figure(figsize=(max(5.0, 1.3 * len(groups) * max(1, len(series)) / 2), 3.6))
    ax = fig.subplots()
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        yerr = None
        if errors and name in errors:
            pairs = list(zip(values, errors[name]))
            yerr = [[max(0.0, v - lo) for v, (lo, _) in pairs], [max(0.0, hi - v) for v, (_, hi) in pairs]]
        ax.bar(xs, values, width, label=name, yerr=yerr, capsize=3)
    if reference_line is not None:
        ax.axhline(reference_line, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) > 1:
        ax.legend(fontsize=8)
    return _save(fig, path)


def line_chart(
    path: Path,
    x: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    logx: bool = False,
    logy: bool = False,
) -> Path:
    """One line per series over ``x``; ``None`` values (not measured) are left out."""
    fig = Figure(figsize=(5.5, 3.6))
    ax = fig.subplots()
    for name, ys in series.items():
        points = [(a, b) for a, b in zip(x, ys) if b is not None]
        if points:
            ax.plot(*zip(*points), marker="o", markersize=3, label=name)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
