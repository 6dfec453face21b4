"""The register study's trajectory figure: artifact metrics of both twins through training."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from vit5 import plotstyle as S
from vit5.study.run import TWINS

LABELS = ("no registers", "registers")  # of TWINS, which is also the colour index (colour = model)


def _both(metric: str, suffix: str = "", where: str = "metrics") -> tuple[tuple[int, str, str, str], ...]:
    return (0, metric, where, suffix), (1, metric, where, suffix)


# panel title -> lines (twin index, metric, where, label suffix); where = "metrics" (own thresholds),
# "reused" (the no-register twin's) or "background" (own thresholds, another line style)
PANELS = {
    "outlier-token ratio (max over blocks)": (
        (0, "outlier_ratio", "metrics", ""),
        (1, "outlier_ratio", "metrics", ", own thresholds"),
        (1, "outlier_ratio", "reused", ", no-register twin's thresholds"),
    ),
    "images with an outlier patch (max over blocks)": (
        *_both("images_with_outliers", ": any patch"),
        *_both("images_with_background_outliers", ": a background patch", "background"),
    ),
    "max / median patch norm (max over blocks)": _both("max_median_ratio"),
    "sink heads: patch / register (block mean)": (
        *_both("sink_rate_patch", ": patch sinks"),
        (1, "sink_rate_register", "metrics", ": register sinks"),
    ),
    "attention mass (max over blocks)": (
        (0, "received_outlier_mass", "metrics", ": on outlier patches"),
        (1, "patch_register_mass", "metrics", ": patches on registers"),
    ),
    "held-out accuracy": _both("accuracy"),
}


def _value(row: dict, metric: str, where: str) -> float:
    """One point: the metric's max over blocks (the mean for sink rates), NaN where not measured."""
    if metric == "accuracy":
        return row["accuracy"]
    block = (row.get("reused") if where == "reused" else row) or {}
    values = block.get(metric) if metric.startswith("images_with") else block.get("metrics", {}).get(metric)
    values = [v for v in values or [] if v is not None]
    reduce = np.mean if metric.startswith("sink_rate") else max
    return float(reduce(values)) if values else float("nan")


def trajectory_figure(trajectories: Mapping[str, Sequence[dict]], cfg, dpi: int = S.DPI) -> Figure:
    """One panel per quantity, x = training step; colour = twin, line style and marker = the quantity
    (which metric, or which thresholds); trained models, held-out canvases."""
    rows = -(-len(PANELS) // 2)
    fig = Figure(figsize=(S.TEXT_WIDTH, 2.3 * rows + 1.0), dpi=dpi, layout="constrained")
    for ax, (title, lines) in zip(fig.subplots(rows, 2).flat, PANELS.items()):
        kinds = list(dict.fromkeys((metric, where) for _, metric, where, _ in lines))
        for twin, metric, where, suffix in lines:
            traj = trajectories.get(TWINS[twin]) or []
            values = [_value(r, metric, where) for r in traj]
            style = S.line_kwargs(twin, kinds.index((metric, where)))
            ax.plot([r["step"] for r in traj], values, label=LABELS[twin] + suffix, **style)
        S.style_axes(ax, title, "training step")
        S.legend(ax)
    canvas = cfg.canvas
    reached = min((traj[-1]["step"] for traj in trajectories.values() if traj), default=0)
    progress = "" if reached >= cfg.steps else f"; STOPPED at step {reached} of {cfg.steps}"
    fig.suptitle(
        f"Register study: TRAINED twins on {cfg.eval_images} held-out canvases{progress}",
        fontsize=S.FONT_TITLE,
    )
    notes = [
        f"width {cfg.embed_dim}, depth {cfg.depth}, {canvas.size[0]}x{canvas.size[1]} {canvas.background} "
        f"canvases, task {canvas.task}, no CLS + average pooling, 0 vs {cfg.registers} registers",
        "outlier threshold: log-norm median + 5 MAD per block; sink: one key receives > 0.3 of a head's "
        "average attention",
    ]
    S.finish(fig, notes)
    return fig
