"""Figures fit for a paper (one style: dpi, fonts >= 8 pt at the figure's size, rows fitted to the text width,
human legend labels, colour = model, shared axes where compared, honest intervals and ties) and the outliers'
placement relative to the image content (artifact-like on flat, neighbour-redundant patches; content-like
elsewhere), checked on planted cases of both kinds."""

import json
import math
from functools import partial

import cv2
import numpy as np
import pytest
import scipy.stats
import torch
from matplotlib.collections import PolyCollection
from matplotlib.text import Text
from viz_support import smooth_images, smooth_rgb, tiny_vit5, write_png

from vit5 import plotstyle as S
from vit5.plotstyle import save_figure
from vit5.viz import CollectConfig, LoadedImage, MapStyle, MetricConfig, collect, compute_metrics
from vit5.viz import artifacts as M
from vit5.viz.artifacts import MIN_BOOTSTRAP_IMAGES, bootstrap_ci
from vit5.viz.figures import (
    image_figure,
    layer_profile_figure,
    massive_activation_figure,
    norm_histogram_figure,
)
from vit5.viz.images import default_size
from vit5.viz.runner import PlantSpec, plant_artifacts
from vit5.viz.stats import patch_content

cls_attention_figure = partial(image_figure, "attention")
norm_map_figure = partial(image_figure, "norms")
QUIET = CollectConfig(batch_size=4, progress=False)
FLAT_AT, BUSY_AT = (
    ((1, 0), (2, 1)),
    ((1, 4), (2, 5)),
)  # (row, col) in the 4 x 6 grid of a 32 x 48 image


def half_flat_images(count: int) -> list[LoadedImage]:
    """Left half a constant grey (redundant patches), right half strong noise (each patch unlike the next)."""
    images = []
    for i in range(count):
        rgb = np.full((32, 48, 3), 110, np.uint8)
        rgb[:, 24:] = np.random.default_rng(i).integers(0, 256, (32, 24, 3), dtype=np.uint8)
        images.append(LoadedImage(f"half{i}", rgb))
    return images


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tiny_vit5(depth=2)


def planted_report(model, positions, count=4):
    """Norms here: ~1.3 on the flat half, ~11 on the noise, x30 where planted. The log-MAD threshold of
    such a bimodal image is far above all of them, so an explicit one sits between the groups."""
    with plant_artifacts(model, PlantSpec(0, positions, 30.0)):
        stats = collect(model, half_flat_images(count), "planted", QUIET)
    return stats, compute_metrics(stats, MetricConfig(threshold=25.0, n_boot=50))


def _texts(fig):
    return [t for t in fig.findobj(Text) if t.get_text().strip() and t.get_visible()]


# ------------------------------------------------------------------------------------ content (item 10)
def test_patch_content_matches_a_direct_computation():
    rgb = np.stack([smooth_rgb(32, 48, 3), smooth_rgb(32, 48, 4)])
    content = patch_content(rgb, 8)
    x = rgb.astype(np.float64) / 255
    for b in range(2):
        mean = x[b].reshape(-1, 3).mean(axis=0)
        cells = {
            (r, c): (x[b, r * 8 : r * 8 + 8, c * 8 : c * 8 + 8] - mean).ravel()
            for r in range(4)
            for c in range(6)
        }
        variance = np.array(
            [x[b, r * 8 : r * 8 + 8, c * 8 : c * 8 + 8].var() for r in range(4) for c in range(6)]
        )
        np.testing.assert_allclose(content.variance[b], variance)
        ranks = (scipy.stats.rankdata(variance, method="average") - 1) / 23
        np.testing.assert_allclose(content.variance_percentile[b], ranks)
        for (r, c), v in cells.items():
            near = [
                cells[n] for n in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)) if n in cells
            ]
            cos = np.mean([v @ u / np.linalg.norm(v) / np.linalg.norm(u) for u in near])
            assert content.neighbour_cosine[b, r * 6 + c] == pytest.approx(cos)


def test_a_bright_patch_on_a_flat_background_is_content_not_artifact():
    """The case that fooled the norm threshold: the input itself is bright there."""
    rgb = np.full((1, 32, 48, 3), 40, np.uint8)
    rgb[0, 8:16, 16:24] = 255
    content = patch_content(rgb, 8)
    bright, background = 1 * 6 + 2, 3 * 6 + 5
    assert not content.artifact_like[0, bright] and content.neighbour_cosine[0, bright] < 0
    assert content.artifact_like[0, background]


def test_planted_background_outliers_are_artifact_like(model):
    stats, report = planted_report(model, FLAT_AT)
    block0 = report.placement[0]
    assert block0["outliers"] == 4 * len(FLAT_AT)  # exactly the planted tokens, in every image
    assert block0["artifact_like"] == block0["outliers"] and block0["content_like"] == 0
    share = report.summary["outlier_artifact_share"]["value"][0]
    assert share == 1.0
    assert "outliers art/cont" in report.table()


def test_planted_content_outliers_are_content_like(model):
    stats, report = planted_report(model, BUSY_AT)
    block0 = report.placement[0]
    assert block0["outliers"] == 4 * len(BUSY_AT)
    assert block0["content_like"] == block0["outliers"] and block0["artifact_like"] == 0
    assert report.summary["outlier_artifact_share"]["value"][0] == 0.0


def test_norm_map_marks_each_kind_and_captions_only_what_it_drew(model):
    stats, report = planted_report(model, (FLAT_AT[0], BUSY_AT[0]), count=1)
    image = half_flat_images(1)[0]
    fig = norm_map_figure(stats, 0, image, [0], MapStyle(), outliers=report.outliers)
    text = " ".join(t.get_text() for t in _texts(fig))
    assert (
        "2 outliers, 1 artifact-like" in text
        and "red: artifact-like" in text
        and "white dashed" in text
    )
    clean = compute_metrics(stats, MetricConfig(threshold=1e9, n_boot=10))
    quiet = " ".join(
        t.get_text()
        for t in _texts(norm_map_figure(stats, 0, image, [0], MapStyle(), outliers=clean.outliers))
    )
    assert "no outliers" in quiet and "red" not in quiet and "dashed" not in quiet


# ------------------------------------------------------------------------------------ figures (item 7)
@pytest.fixture(scope="module")
def recorded(model):
    images = smooth_images(3)
    return collect(model, images, "tiny-a", QUIET), images


def test_a_four_panel_row_is_print_sized_at_print_resolution(recorded, tmp_path):
    stats, images = recorded
    style = MapStyle(formats=("png",))
    assert style.dpi == S.DPI >= 150
    fig = cls_attention_figure(stats, 0, images[0], [-1], style)  # 3 heads + the mean: 4 panels
    (png,) = save_figure(fig, tmp_path / "row", style.formats)
    height, width = cv2.imread(str(png)).shape[:2]
    inches_w, inches_h = fig.get_size_inches()
    assert (width, height) == (round(inches_w * style.dpi), round(inches_h * style.dpi))
    assert (
        inches_w <= S.TEXT_WIDTH + 0.01 and width >= 6.5 * 150
    )  # a page's text width, >= 150 dpi there
    assert 0.2 < height / width < 0.6  # a row, not a strip


def test_every_text_is_at_least_8_pt(recorded, model):
    stats, images = recorded
    report = compute_metrics(stats, MetricConfig(n_boot=20))
    style = MapStyle()
    figures = [
        norm_map_figure(stats, 0, images[0], [-1], style, outliers=report.outliers),
        cls_attention_figure(stats, 0, images[0], [0, -1], style),
        layer_profile_figure({"a": report, "b": report}, style),
        massive_activation_figure({"a": (stats, report)}, style),
        norm_histogram_figure(stats, report.thresholds, style),
    ]
    for fig in figures:
        fig.canvas.draw()  # tick labels exist once drawn
        small = [
            (t.get_text(), t.get_fontsize()) for t in _texts(fig) if t.get_fontsize() < S.FONT_SMALL
        ]
        assert not small


def test_layer_profile_colours_models_styles_metrics_and_speaks_words(recorded):
    stats, _ = recorded
    report = compute_metrics(stats, MetricConfig(n_boot=20))
    fig = layer_profile_figure({"no registers": report, "registers": report}, MapStyle())
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert labels and not any(
        "_" in label for label in labels
    )  # no raw keys such as cls_register_mass
    assert "no registers: CLS → registers" in labels
    for ax in fig.axes:
        by_model: dict[str, set] = {}
        for line in ax.get_lines():
            by_model.setdefault(line.get_label().split(":")[0], set()).add(line.get_color())
        assert all(len(colours) == 1 for colours in by_model.values())  # one colour per model
        if len(by_model) == 2:
            assert by_model["no registers"] != by_model["registers"]
        styles = {(line.get_linestyle(), line.get_marker()) for line in ax.get_lines()}
        metrics = {line.get_label().split(": ")[1] for line in ax.get_lines()}
        assert len(styles) == len(metrics)  # one line style per metric


def test_massive_activations_compare_shares_the_y_axis(recorded, model):
    stats, _ = recorded
    big = collect(model, smooth_images(3), "tiny-b", QUIET)
    big.massive_top = big.massive_top * 50
    a, b = (
        compute_metrics(stats, MetricConfig(n_boot=10)),
        compute_metrics(big, MetricConfig(n_boot=10)),
    )
    fig = massive_activation_figure({"a": (stats, a), "b": (big, b)}, MapStyle())
    first, second = fig.axes[:2]
    assert first.get_ylim() == second.get_ylim()


def test_no_interval_below_the_minimum_number_of_images():
    values = np.arange(MIN_BOOTSTRAP_IMAGES - 1, dtype=float)
    stat, low, high = bootstrap_ci(values)
    assert stat == pytest.approx(values.mean()) and math.isnan(low) and math.isnan(high)
    stat, low, high = bootstrap_ci(np.arange(MIN_BOOTSTRAP_IMAGES, dtype=float), n_boot=200)
    assert low < stat < high


def test_few_images_print_no_interval_and_say_why(recorded):
    stats, _ = recorded  # 3 images
    report = compute_metrics(stats, MetricConfig(n_boot=50))
    table = report.table()
    assert "±" not in table and "no intervals: 3 images" in table
    fig = layer_profile_figure({"a": report}, MapStyle())
    assert not [
        c for ax in fig.axes for c in ax.collections if isinstance(c, PolyCollection)
    ]  # no bands


def test_massive_location_reports_ties_not_a_fake_mode():
    token = np.array([[5], [6], [7], [8], [9]])
    channel = np.array([[1], [1], [1], [1], [1]])
    assert M.massive_location(token, channel) == [(5, 1, 1, 5)]  # 5 places tied at 1 image each
    token[:, 0] = [5, 5, 5, 6, 7]
    assert M.massive_location(token, channel) == [(5, 1, 3, 1)]


def test_default_size_keeps_the_images_aspect(tmp_path):
    assert default_size(["sklearn-samples"], (224, 224), 16) == (224, 336)  # 427 x 640 photos
    assert default_size(["sklearn-samples"], (32, 32), 8) == (32, 48)
    write_png(tmp_path / "tall" / "a.png", smooth_rgb(90, 60, 1))
    write_png(tmp_path / "tall" / "b.png", smooth_rgb(64, 40, 2))
    assert default_size([str(tmp_path / "tall")], (32, 32), 8) == (
        48,
        32,
    )  # portrait, median ratio 1.55
    assert default_size([str(tmp_path / "tall")], (30, 30), 8) == (
        48,
        32,
    )  # short side: nearest multiple


def test_title_label_and_default_size_from_the_command_line(tmp_path, capsys):
    from vit5.cli.viz import main

    tiny = [
        "--model",
        "vit5_tiny",
        "--random-init",
        "--model-args",
        "depth=1",
        "img_size=32",
        "patch_size=8",
    ]
    out = tmp_path / "out"
    args = [
        "metrics",
        *tiny,
        "--images",
        "sklearn-samples",
        "--out",
        str(out),
        "--quiet",
        "--label",
        "ViT-5 demo",
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "2 images at 32x48" in printed  # 427 x 640 photos keep their aspect on a 32 px model
    assert json.loads((out / "metrics.json").read_text())["model"] == "ViT-5 demo"
    with pytest.raises(
        SystemExit
    ) as usage:  # an empty label is a usage error: exit 2, one line naming it
        main([*args[:-2], "--label", " ", "--out", str(tmp_path / "o2")])
    assert usage.value.code == 2 and "--label" in capsys.readouterr().err


def test_a_given_title_replaces_every_generated_one(recorded):
    stats, images = recorded
    report = compute_metrics(stats, MetricConfig(n_boot=10))
    for title in ("Figure 3", ""):
        style = MapStyle(title=title)
        for fig in (
            cls_attention_figure(stats, 0, images[0], [-1], style),
            layer_profile_figure({"a": report}, style),
            massive_activation_figure({"a": (stats, report)}, style),
        ):
            shown = fig._suptitle.get_text() if fig._suptitle is not None else ""
            assert shown == title
