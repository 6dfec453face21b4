"""Figures: the confusion matrix of a classification run and accuracy against input resolution."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure  # not pyplot: importing vit5.eval leaves the user's backend alone

_MAX_TICK_LABELS = 40


def plot_confusion(
    confusion: np.ndarray, class_names: Sequence[str], path: str | os.PathLike[str], title: str = ""
) -> Path:
    """Row-normalised confusion matrix (each row: where the images of one true class went)."""
    confusion = np.asarray(confusion, dtype=np.float64)
    rows = confusion.sum(axis=1, keepdims=True)
    normalised = np.divide(confusion, rows, out=np.zeros_like(confusion), where=rows > 0)
    n = len(class_names)
    side = min(4 + 0.35 * n, 16)
    fig = Figure(figsize=(side + 1.5, side))
    ax = fig.subplots()
    image = ax.imshow(normalised, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="fraction of the true class")
    if n <= _MAX_TICK_LABELS:
        ax.set_xticks(range(n), class_names, rotation=90 if n > 12 else 0)
        ax.set_yticks(range(n), class_names)
    if n <= 15:
        for (i, j), value in np.ndenumerate(confusion):
            if value:
                ax.text(
                    j,
                    i,
                    int(value),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if normalised[i, j] > 0.5 else "black",
                )
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title or "confusion matrix (counts; colour = row fraction)")
    return _save(fig, path)


def plot_sweep(
    series: dict[str, list[tuple[tuple[int, int], float]]],
    path: str | os.PathLike[str],
    train_size: tuple[int, int] | None = None,
    metric: str = "top-1 %",
) -> Path:
    """Accuracy against sqrt(H * W) per model; square sizes joined by a line, others as hollow
    markers labelled HxW (extrapolation test for RoPE plus the resampled APE)."""
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.subplots()
    labelled: dict[tuple[int, int], int] = {}  # size -> label row, so labels at one x do not overlap
    for label, points in series.items():
        square = sorted((np.sqrt(h * w), v) for (h, w), v in points if h == w)
        line = ax.plot([x for x, _ in square], [v for _, v in square], marker="o", label=label)[0]
        for (h, w), value in points:
            if h != w:
                ax.scatter(
                    [np.sqrt(h * w)], [value], facecolors="none", edgecolors=line.get_color(), s=60, zorder=3
                )
                if (h, w) not in labelled:  # once per size, not per model
                    row = labelled[(h, w)] = sum(hh * ww == h * w for hh, ww in labelled)
                    ax.annotate(
                        f"{h}x{w}",
                        (np.sqrt(h * w), value),
                        textcoords="offset points",
                        xytext=(6, 4 - 11 * row),
                        fontsize=8,
                    )
    if train_size is not None:
        ax.axvline(np.sqrt(train_size[0] * train_size[1]), color="grey", ls="--", lw=1, label="training size")
    ax.set_xlabel("input side sqrt(H x W) in pixels (hollow: non-square)")
    ax.set_ylabel(metric)
    ax.set_title("accuracy against input resolution")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _save(fig: Figure, path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
