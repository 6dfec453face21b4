"""Figures: the confusion matrix of a classification run and accuracy against input resolution."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure  # not pyplot: importing vit5.eval leaves the user's backend alone

from vit5 import plotstyle as S


def plot_confusion(
    confusion: np.ndarray, class_names: Sequence[str], path: str | os.PathLike[str], title: str = ""
) -> Path:
    """Row-normalised confusion matrix (each row: where the images of one true class went); class names
    up to 40 classes, counts in the cells up to 15."""
    confusion = np.asarray(confusion, dtype=np.float64)
    rows = confusion.sum(axis=1, keepdims=True)
    normalised = np.divide(confusion, rows, out=np.zeros_like(confusion), where=rows > 0)
    n = len(class_names)
    side = min(4 + 0.35 * n, 16)
    fig = Figure(figsize=(side + 1.5, side))
    ax = fig.subplots()
    image = ax.imshow(normalised, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="fraction of the true class")
    if n <= 40:
        ax.set_xticks(range(n), class_names, rotation=90 if n > 12 else 0)
        ax.set_yticks(range(n), class_names)
    if n <= 15:
        for (i, j), value in np.ndenumerate(confusion):
            colour = "white" if normalised[i, j] > 0.5 else "black"
            if value:
                ax.text(j, i, int(value), ha="center", va="center", fontsize=7, color=colour)
    title = title or "confusion matrix (counts; colour = row fraction)"
    S.style_axes(ax, title, "predicted class", "true class")
    ax.grid(False)
    return _save(fig, path)


def sweep_plot(
    results: Sequence, path: str | os.PathLike[str], train_size: tuple[int, int] | None = None
) -> Path:
    """Top-1 of :class:`~vit5.eval.classify.ClassifyResult` s against sqrt(H * W) per model; square sizes
    joined by a line, others as hollow markers labelled HxW (extrapolation of RoPE and the resampled APE)."""
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.subplots()
    labelled: dict[tuple[int, int], int] = {}  # size -> label row, so labels at one x do not overlap
    for index, model in enumerate(dict.fromkeys(r.model for r in results)):
        points = [(r.size, 100 * r.scores.top1) for r in results if r.model == model]
        square = sorted((np.sqrt(h * w), v) for (h, w), v in points if h == w)
        line = ax.plot(
            [x for x, _ in square], [v for _, v in square], label=model, **S.line_kwargs(index, 0)
        )[0]
        for (h, w), value in points:
            if h == w:
                continue
            ax.scatter(
                [np.sqrt(h * w)], [value], facecolors="none", edgecolors=line.get_color(), s=60, zorder=3
            )
            if (h, w) not in labelled:  # once per size, not per model
                row = labelled[(h, w)] = sum(hh * ww == h * w for hh, ww in labelled)
                xy = (np.sqrt(h * w), value)
                ax.annotate(f"{h}x{w}", xy, textcoords="offset points", xytext=(6, 4 - 11 * row), fontsize=8)
    if train_size is not None:
        ax.axvline(np.sqrt(train_size[0] * train_size[1]), color="grey", ls="--", lw=1, label="training size")
    xlabel = "input side sqrt(H x W) in pixels (hollow: non-square)"
    S.style_axes(ax, "accuracy against input resolution", xlabel, "top-1 %")
    S.legend(ax)
    return _save(fig, path)


def _save(fig: Figure, path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
