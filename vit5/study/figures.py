"""The register study's trajectory figure: artifact metrics of both twins through training."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from vit5 import plotstyle as S

# (title, [(twin, metric, where, label)]): where = "metrics" (own thresholds), "reused" (the no-register
# twin's)
# or "background" (own thresholds, drawn dashed)
PANELS = (
    (
        "outlier-token ratio (max over blocks)",
        (
            ("no_registers", "outlier_ratio", "metrics", "no registers"),
            ("registers", "outlier_ratio", "metrics", "registers, own thresholds"),
            ("registers", "outlier_ratio", "reused", "registers, no-register twin's thresholds"),
        ),
    ),
    (
        "images with an outlier patch (max over blocks)",
        (
            ("no_registers", "images_with_outliers", "metrics", "no registers: any patch"),
            (
                "no_registers",
                "images_with_background_outliers",
                "background",
                "no registers: a background patch",
            ),
            ("registers", "images_with_outliers", "metrics", "registers: any patch"),
            ("registers", "images_with_background_outliers", "background", "registers: a background patch"),
        ),
    ),
    (
        "max / median patch norm (max over blocks)",
        (
            ("no_registers", "max_median_ratio", "metrics", "no registers"),
            ("registers", "max_median_ratio", "metrics", "registers"),
        ),
    ),
    (
        "sink heads: patch / register (block mean)",
        (
            ("no_registers", "sink_rate_patch", "metrics", "no registers: patch sinks"),
            ("registers", "sink_rate_patch", "metrics", "registers: patch sinks"),
            ("registers", "sink_rate_register", "metrics", "registers: register sinks"),
        ),
    ),
    (
        "attention mass (max over blocks)",
        (
            ("no_registers", "received_outlier_mass", "metrics", "no registers: on outlier patches"),
            ("registers", "patch_register_mass", "metrics", "registers: patches on registers"),
        ),
    ),
    (
        "held-out accuracy",
        (
            ("no_registers", "accuracy", "metrics", "no registers"),
            ("registers", "accuracy", "metrics", "registers"),
        ),
    ),
)
TWINS = ("no_registers", "registers")  # colour index of each twin (vit5.plotstyle: colour = model)
MEAN_OVER_BLOCKS = {"sink_rate_patch", "sink_rate_register"}


def _value(row: dict, metric: str, where: str) -> float:
    if metric == "accuracy":
        return row["accuracy"]
    block = row.get("reused") if where == "reused" else row
    if block is None:
        return float("nan")
    values = block.get(metric) if metric.startswith("images_with") else block["metrics"].get(metric)
    values = [v for v in (values or []) if v is not None]
    if not values:
        return float("nan")
    return float(np.mean(values)) if metric in MEAN_OVER_BLOCKS else float(max(values))


def trajectory_figure(trajectories: Mapping[str, Sequence[dict]], cfg, dpi: int = S.DPI) -> Figure:
    """One panel per quantity, x = training step; colour = twin, line style and marker = the quantity
    (which metric, or which thresholds); trained models, held-out canvases."""
    cols = 2
    rows = (len(PANELS) + cols - 1) // cols
    fig = Figure(figsize=(S.TEXT_WIDTH, 2.3 * rows + 1.0), dpi=dpi, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, (title, lines) in zip(axes.flat, PANELS):
        kinds: list[tuple[str, str]] = []
        for twin, metric, where, label in lines:
            kind = (metric, where)
            if kind not in kinds:
                kinds.append(kind)
            traj = trajectories.get(twin) or []
            steps = [r["step"] for r in traj]
            values = [_value(r, metric, where) for r in traj]
            ax.plot(steps, values, label=label, **S.line_kwargs(TWINS.index(twin), kinds.index(kind)))
        S.style_axes(ax, title, "training step")
        S.legend(ax)
    for ax in axes.flat[len(PANELS) :]:
        ax.set_axis_off()
    canvas = cfg.canvas
    reached = min((traj[-1]["step"] for traj in trajectories.values() if traj), default=0)
    progress = "" if reached >= cfg.steps else f"; STOPPED at step {reached} of {cfg.steps}"
    fig.suptitle(
        f"Register study: TRAINED twins on {cfg.eval_images} held-out canvases{progress}",
        fontsize=S.FONT_TITLE,
    )
    S.finish(
        fig,
        [
            f"width {cfg.embed_dim}, depth {cfg.depth}, {canvas.size[0]}x{canvas.size[1]} "
            f"{canvas.background} canvases, task {canvas.task}, no CLS + average pooling, "
            f"0 vs {cfg.registers} registers",
            "outlier threshold: log-norm median + 5 MAD per block; sink: one key receives > 0.3 of a head's "
            "average attention",
        ],
    )
    return fig
