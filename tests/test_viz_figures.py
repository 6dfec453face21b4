"""Figures: written as PNG and PDF, non-empty, the expected pixel size, a colorbar on every map, shared scales
where maps are compared, clipping stated, and the heat where it was planted."""

from functools import partial

import cv2
import matplotlib
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

import vit5
from vit5 import plotstyle as S
from vit5.errors import InputError
from vit5.plotstyle import save_figure
from vit5.viz import LoadedImage, MapStyle, TokenStats
from vit5.viz.figures import compare_figure, image_figure, upsample

cls_attention_figure = partial(image_figure, "attention")
register_attention_figure = partial(image_figure, "registers")
norm_map_figure = partial(image_figure, "norms")
GRID, PATCH, HOT = (4, 6), 8, (2, 3)
GRAY = LoadedImage("gray", np.full((32, 48, 3), 128, np.uint8))


def synthetic_stats(
    registers: int = 2, heads: int = 2, scale: float = 1.0, name: str = "synthetic"
) -> TokenStats:
    """One image, one layer, vit5 order; the patch at HOT has the largest norm, registers larger still."""
    layout = vit5.TokenLayout(GRID, 1, registers)
    n = layout.num_tokens
    rng = np.random.default_rng(0)
    norms = rng.uniform(1, 2, (1, 1, n)) * scale
    norms[0, 0, layout.patch_slice.start + HOT[0] * GRID[1] + HOT[1]] = 50 * scale
    norms[0, 0, layout.register_slice] = 500 * scale  # must never show up in a patch map
    rows = rng.random((1, 1, heads, n))
    rows /= rows.sum(-1, keepdims=True)
    reg = rng.random((1, 1, heads, registers, n)) if registers else None
    return TokenStats(
        name,
        layout,
        [0],
        ["gray"],
        PATCH,
        norms=norms,
        received=rows,
        rollout=rows[0, 0, :1],
        cls_attn=rows * scale,
        reg_attn=reg,
    )


def test_norm_map_written_with_expected_size_and_peak_at_the_planted_patch(tmp_path):
    style = MapStyle(dpi=80)
    fig = norm_map_figure(synthetic_stats(), 0, GRAY, [0], style)
    png, pdf = save_figure(fig, tmp_path / "norms", style.formats)
    assert (
        png.stat().st_size > 1000
        and pdf.read_bytes().startswith(b"%PDF")
        and pdf.stat().st_size > 1000
    )
    pixels = cv2.cvtColor(cv2.imread(str(png)), cv2.COLOR_BGR2RGB).astype(float)
    declared_w, declared_h = fig.get_size_inches()
    assert pixels.shape[:2] == (
        round(declared_h * 80),
        round(declared_w * 80),
    )  # whole pixels, as declared
    assert declared_w >= S.MIN_WIDTH  # one panel: still one column wide
    assert not overlaps(fig)
    # the hottest overlay colour (top of viridis at alpha 0.5 over gray), searched inside the map's axes only
    hot = 0.5 * np.array(matplotlib.colormaps["viridis"](1.0)[:3]) * 255 + 0.5 * 128
    ax = fig.axes[0]
    (x0, y0), (x1, y1) = ax.transData.transform(
        [(0, 32), (48, 0)]
    )  # display coords, origin bottom-left
    top, left, bottom, right = (
        round(pixels.shape[0] - y1),
        round(x0),
        round(pixels.shape[0] - y0),
        round(x1),
    )
    inside = pixels[top:bottom, left:right]
    y, x = np.unravel_index(np.abs(inside - hot).sum(-1).argmin(), inside.shape[:2])
    assert np.abs(inside[y, x] - hot).sum() < 15
    row, col = int(y / inside.shape[0] * GRID[0]), int(x / inside.shape[1] * GRID[1])
    assert (row, col) == HOT


def overlaps(fig) -> list[str]:
    """After drawing: texts that overlap a map, another text or the figure's edge, and maps that overlap
    each other, are squashed (not at their pixels' aspect) or lack a colorbar of their height beside them."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    maps = [ax for ax in fig.axes if ax.images]
    boxes = [
        (t.get_text(), t.get_window_extent(renderer).shrunk(0.98, 0.9)) for t in drawn_texts(fig)
    ]
    found = [
        f"{text!r} leaves the figure"
        for text, box in boxes
        if not fig.bbox.contains(box.x0, box.y0)
    ]
    found += [
        f"{text!r} leaves the figure"
        for text, box in boxes
        if not fig.bbox.contains(box.x1, box.y1)
    ]
    for i, ax in enumerate(maps):
        area = ax.get_window_extent(renderer)
        found += [f"{text!r} overlaps map {i}" for text, box in boxes if box.overlaps(area)]
        found += [
            f"maps {i} and {j} overlap"
            for j, other in enumerate(maps[:i])
            if area.overlaps(other.bbox)
        ]
        h, w = ax.images[0].get_array().shape[:2]
        if abs(area.width / area.height - w / h) > 0.02 * w / h:
            found.append(
                f"map {i} squashed: {area.width:.0f} x {area.height:.0f} pixels for a {w} x {h} map"
            )
        bars = [c.get_window_extent(renderer) for c in ax.child_axes]
        if ax.images[-1].get_cmap().name != "viridis":
            continue  # an image or an RGB map has no colorbar
        if not any(abs(b.height - area.height) < 2 and b.x0 >= area.x1 for b in bars):
            found.append(f"map {i} has no colorbar of its height beside it")
    for i, (text, box) in enumerate(boxes):
        found += [f"{text!r} overlaps {other!r}" for other, o in boxes[:i] if box.overlaps(o)]
    return found


def drawn_texts(fig) -> list:
    """Every text a reader sees: titles, notes, legends, and the tick labels of the axes that show them."""
    texts = [*fig.texts, *(t for legend in fig.legends for t in legend.get_texts())]
    if fig._suptitle is not None:
        texts.append(fig._suptitle)
    for ax in [*fig.axes, *colorbars_of(fig)]:
        texts += [ax.title, *ax.texts]
        if ax.axison:
            texts += [*ax.get_xticklabels(), *ax.get_yticklabels(), ax.xaxis.label, ax.yaxis.label]
    unique = {id(t): t for t in texts}.values()  # the suptitle is one of fig.texts too
    return [t for t in unique if t.get_visible() and t.get_text().strip()]


def colorbars_of(fig) -> list:
    return [bar for ax in fig.axes if ax.images for bar in ax.child_axes]


def test_every_map_has_a_colorbar_and_heads_share_a_layer_scale():
    fig = cls_attention_figure(synthetic_stats(heads=3), 0, GRAY, [0], MapStyle())
    maps = [ax for ax in fig.axes if ax.images]
    colorbars = colorbars_of(fig)
    assert len(maps) == 4 and len(colorbars) == 4  # 3 heads + mean, each with its colorbar
    assert len({cb.get_ylim() for cb in colorbars}) == 1
    assert not overlaps(fig)
    assert "raw" in fig._suptitle.get_text()
    renormalised = cls_attention_figure(
        synthetic_stats(heads=3), 0, GRAY, [0], MapStyle(), renormalise=True
    )
    assert "renormalised" in renormalised._suptitle.get_text()
    assert "renormalised over the patches" in " ".join(
        t.get_text() for t in renormalised.texts
    )  # the note


def test_comparison_shares_one_scale_per_row_across_models():
    a, b = synthetic_stats(name="A"), synthetic_stats(scale=10.0, name="B")
    fig = compare_figure([a, b], 0, GRAY, 0, MapStyle(formats=("png",)))
    colorbars = colorbars_of(fig)
    attention_a, attention_b, norms_a, norms_b = (cb.get_ylim() for cb in colorbars)
    assert attention_a == attention_b and norms_a == norms_b
    assert norms_a[1] == pytest.approx(
        500.0
    )  # B's largest patch norm (10 x 50), not A's own maximum


def test_clipping_is_written_on_the_figure_and_only_when_asked():
    unclipped = norm_map_figure(synthetic_stats(), 0, GRAY, [0], MapStyle())
    assert not any("clipped" in t.get_text() for t in unclipped.texts)
    clipped = norm_map_figure(synthetic_stats(), 0, GRAY, [0], MapStyle(clip_percentile=90))
    assert any("clipped at the 90th percentile" in t.get_text() for t in clipped.texts)
    assert not overlaps(clipped)


def test_register_panels_one_per_register_and_a_clear_error_without_registers():
    fig = register_attention_figure(synthetic_stats(registers=4), 0, GRAY, [0], MapStyle())
    assert [ax.get_title() for ax in fig.axes if ax.images] == [
        f"layer 0 register {r}" for r in range(4)
    ]
    assert not overlaps(fig)
    with pytest.raises(InputError, match="no register tokens"):
        register_attention_figure(synthetic_stats(registers=0), 0, GRAY, [0], MapStyle())


def test_upsampling_nearest_repeats_each_patch_and_bilinear_keeps_the_size():
    values = np.arange(6.0).reshape(2, 3)
    near = upsample(values, 4, "nearest")
    assert near.shape == (8, 12) and (near[:4, 4:8] == 1).all() and (near[4:, 8:] == 5).all()
    assert upsample(values, 4, "bilinear").shape == (8, 12)


def test_style_rejects_bad_options():
    with pytest.raises(InputError, match="unknown colormap"):
        MapStyle(cmap="nope")
    with pytest.raises(InputError, match="alpha"):
        MapStyle(alpha=2)
