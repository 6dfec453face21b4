"""Figures (matplotlib, no pyplot): every builder returns a Figure; :func:`save_figure` writes PNG and PDF."""

from vit5.viz.figures.attention import cls_attention_figure, register_attention_figure, rollout_figure
from vit5.viz.figures.base import (
    MapStyle,
    Panel,
    color_limits,
    figure_size,
    panel_grid,
    save_figure,
    upsample,
)
from vit5.viz.figures.compare import compare_figure, compare_summary_figure
from vit5.viz.figures.norms import (
    layer_profile_figure,
    massive_activation_figure,
    norm_histogram_figure,
    norm_map_figure,
    outlier_frequency_figure,
)
from vit5.viz.figures.pca import pca_figure
from vit5.viz.figures.summary import summary_figure

__all__ = [
    "MapStyle",
    "Panel",
    "cls_attention_figure",
    "color_limits",
    "compare_figure",
    "compare_summary_figure",
    "figure_size",
    "layer_profile_figure",
    "massive_activation_figure",
    "norm_histogram_figure",
    "norm_map_figure",
    "outlier_frequency_figure",
    "panel_grid",
    "pca_figure",
    "register_attention_figure",
    "rollout_figure",
    "save_figure",
    "summary_figure",
    "upsample",
]
