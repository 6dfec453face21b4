"""The training-curve figure of a run: loss, accuracy and learning rate against epochs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

_PANELS = (
    ("loss", (("train_loss", "train (soft targets)"), ("val_loss", "val"), ("ema_val_loss", "val, EMA"))),
    ("top-1 accuracy (%)", (("val_top1", "val"), ("ema_top1", "val, EMA"))),
    ("learning rate (end of epoch)", (("lr", "peak group"),)),
)


def plot_curves(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> Path:
    """Three panels side by side; epochs on x (1-based); a missing value leaves a gap."""
    fig = Figure(figsize=(13, 3.6), layout="constrained")  # no pyplot: no global backend, no GUI
    axes = fig.subplots(1, 3)
    epochs = [int(r["epoch"]) for r in rows]
    for ax, (ylabel, series) in zip(axes, _PANELS, strict=True):
        for key, label in series:
            points = [(e, r[key]) for e, r in zip(epochs, rows, strict=True) if r.get(key) is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", markersize=3, label=label)
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    axes[2].set_yscale("log")
    best = [r["val_top1"] for r in rows if r.get("val_top1") is not None]
    if best:
        axes[1].set_title(f"best val top-1 {max(best):.2f}%", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
