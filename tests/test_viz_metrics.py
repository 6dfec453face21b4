"""Metrics find planted artifacts where they were planted, and match hand computations on toy inputs."""

import math

import numpy as np
import pytest
import scipy.stats
import torch
from viz_support import multiply_tokens, smooth_images, tiny_vit5

import vit5
from vit5.errors import InputError
from vit5.model.capture import summarise_probabilities
from vit5.viz import (
    CollectConfig,
    MetricConfig,
    TokenStats,
    collect,
    compute_metrics,
    load_thresholds,
)
from vit5.viz import artifacts as M
from vit5.viz.artifacts import bootstrap_ci
from vit5.viz.collect import figure_keep, layer_rows, rollout_step
from vit5.viz.stats import norm_map, outlier_map

PLANTED = [(1, 4), (3, 0)]  # (row, col) in the 4 x 6 grid of a 32 x 48 image with 8-pixel patches
QUIET = CollectConfig(batch_size=4, progress=False)


@pytest.fixture(scope="module")
def clean_and_planted():
    torch.manual_seed(0)
    model = tiny_vit5(depth=3)
    images = smooth_images(8)
    clean = collect(model, images, "clean", QUIET)
    layout = clean.layout
    indices = [layout.patch_slice.start + r * layout.grid[1] + c for r, c in PLANTED]
    handle = multiply_tokens(model.blocks[1], indices, 20.0)
    planted = collect(model, images, "planted", QUIET)
    handle.remove()
    return clean, planted


def test_planted_tokens_are_the_outliers_ratio_and_location(clean_and_planted):
    _, planted = clean_and_planted
    report = compute_metrics(planted, MetricConfig(n_boot=200))
    expected = np.zeros((4, 6), bool)
    for r, c in PLANTED:
        expected[r, c] = True
    for image in range(planted.num_images):
        np.testing.assert_array_equal(outlier_map(report.outliers, planted, image, 1), expected)
        assert np.unravel_index(norm_map(planted, image, 1).argmax(), (4, 6)) in PLANTED
    np.testing.assert_allclose(report.per_image["outlier_ratio"][:, 1], 2 / 24)
    assert report.summary["outlier_ratio"]["value"][0] == 0  # before the planted block
    assert report.summary["max_median_ratio"]["value"][1] > 10


def test_about_zero_outliers_without_the_hook(clean_and_planted):
    clean, _ = clean_and_planted
    report = compute_metrics(clean, MetricConfig(n_boot=200))
    assert report.per_image["outlier_ratio"].mean() <= 0.01
    assert report.summary["max_median_ratio"]["value"].max() < 3


def test_reference_thresholds_are_reused_for_the_twin(clean_and_planted, tmp_path):
    clean, planted = clean_and_planted
    reference = compute_metrics(clean, MetricConfig(n_boot=50))
    thresholds, source = load_thresholds(reference.write(tmp_path / "metrics")[0])
    reused = compute_metrics(
        planted, MetricConfig(thresholds=thresholds, threshold_source=source, n_boot=50)
    )
    np.testing.assert_allclose(reused.thresholds, reference.thresholds)
    assert "reused from clean" in reused.threshold_source
    np.testing.assert_allclose(reused.per_image["outlier_ratio"][:, 1], 2 / 24)
    explicit = compute_metrics(planted, MetricConfig(threshold=1e9, n_boot=50))
    assert (
        explicit.per_image["outlier_ratio"].max() == 0
        and explicit.threshold_source == "explicit norm 1e+09"
    )
    with pytest.raises(InputError, match="cannot read thresholds"):
        load_thresholds(tmp_path / "missing.json")


def _toy_stats(attention: torch.Tensor, layout: vit5.TokenLayout) -> TokenStats:
    tokens = torch.ones(1, layout.num_tokens, 4)
    summary = summarise_probabilities(attention, figure_keep(layout))
    rows = {k: v[:, None].numpy() for k, v in layer_rows(summary, tokens, layout).items()}
    return TokenStats(
        "toy", layout, [0], ["toy"], 8, rollout=np.zeros((1, layout.num_tokens)), **rows
    )


@pytest.mark.parametrize("registers_first", [False, True])
def test_register_mass_equals_a_hand_computation(registers_first):
    layout = vit5.TokenLayout((1, 2), 1, 2, registers_first=registers_first)
    cls, patches, regs = (
        0,
        ([3, 4] if registers_first else [1, 2]),
        ([1, 2] if registers_first else [3, 4]),
    )
    rows = torch.rand(1, 2, 5, 5)
    attention = rows / rows.sum(-1, keepdim=True)  # [B=1, H=2, N=5, N=5]
    report = compute_metrics(_toy_stats(attention, layout), MetricConfig(n_boot=10))
    a = attention[0].numpy()
    cls_mass = np.mean([a[h, cls, regs[0]] + a[h, cls, regs[1]] for h in range(2)])
    patch_mass = np.mean(
        [np.mean([a[h, p, regs[0]] + a[h, p, regs[1]] for p in patches]) for h in range(2)]
    )
    assert report.summary["cls_register_mass"]["value"][0] == pytest.approx(cls_mass, abs=1e-6)
    assert report.summary["patch_register_mass"]["value"][0] == pytest.approx(patch_mass, abs=1e-6)


def test_sink_rate_entropy_and_topk_on_toy_attention():
    layout = vit5.TokenLayout((1, 2), 1, 1, registers_first=False)  # tokens: cls, p, p, reg
    spread = torch.tensor([[0.25, 0.28, 0.25, 0.22]] * 4)  # no key above 0.3
    sink = torch.tensor([[0.1, 0.1, 0.1, 0.7]] * 4)  # every query sends 0.7 to the register
    attention = torch.stack([spread, sink])[None]  # head 0 spread, head 1 a register sink
    report = compute_metrics(
        _toy_stats(attention, layout), MetricConfig(eps=0.3, top_k=1, n_boot=10)
    )
    value = lambda name: report.summary[name]["value"][0]  # noqa: E731
    assert (
        value("sink_rate") == 0.5
        and value("sink_rate_register") == 0.5
        and value("sink_rate_patch") == 0
    )
    p0 = (
        np.array([0.28, 0.25]) / 0.53
    )  # head 0's CLS row renormalised over the two patches; head 1's is uniform
    assert value("cls_entropy") == pytest.approx((-(p0 * np.log(p0)).sum() / math.log(2) + 1.0) / 2)
    assert value("topk_sink_mass") == pytest.approx(
        (0.28 + 0.7) / 2
    )  # top-1 received key per head, head mean
    assert value("topk_register_share") == pytest.approx(
        0.5
    )  # head 0: a patch, head 1: the register


def test_entropy_effective_tokens_and_kurtosis_formulas():
    one_hot = np.zeros((1, 1, 1, 8))
    one_hot[..., 3] = 1
    assert M.cls_entropy(one_hot)[0, 0] == pytest.approx(0.0, abs=1e-9)
    assert M.cls_effective_tokens(np.ones((1, 1, 1, 8)))[0, 0] == pytest.approx(8.0)
    x = np.random.default_rng(0).lognormal(size=(3, 2, 50))
    np.testing.assert_allclose(
        M.excess_kurtosis(x), scipy.stats.kurtosis(x, axis=-1, fisher=True, bias=True)
    )


def test_log_mad_threshold_by_hand():
    norms = np.exp(
        np.array([0.0, 1.0, 2.0, 3.0, 100.0])
    )  # log: median 2, |u - 2| = 2, 1, 0, 1, 98 -> MAD 1
    assert M.log_mad_threshold(norms, k=5) == pytest.approx(math.exp(2 + 5 * 1.4826))


def test_outlier_mass_reads_the_previous_block_outliers():
    cls_to_patches = np.full((1, 2, 1, 3), 0.1)
    cls_to_patches[0, 1, 0, 2] = 0.4
    outliers = np.zeros((1, 2, 3), bool)
    outliers[0, 0, 2] = True  # outlier in block 0's output, attended by block 1
    mass = M.outlier_attention_mass(cls_to_patches, outliers)
    assert np.isnan(mass[0, 0]) and mass[0, 1] == pytest.approx(0.4)


def test_bootstrap_interval():
    values = np.random.default_rng(1).normal(5.0, 1.0, 200)
    stat, lo, hi = bootstrap_ci(values, "mean", n_boot=500)
    assert lo < stat < hi and stat == pytest.approx(values.mean()) and hi - lo < 0.5
    assert bootstrap_ci(np.array([2.0] * 10 + [np.nan]), "median") == (2.0, 2.0, 2.0)
    stat, lo, hi = bootstrap_ci(
        np.array([2.0, 2.0, np.nan]), "median"
    )  # too few images for an interval
    assert stat == 2.0 and math.isnan(lo) and math.isnan(hi)
    assert all(math.isnan(v) for v in bootstrap_ci(np.array([np.nan])))


def test_rollout_equals_the_matrix_product():
    a1, a2 = torch.rand(1, 2, 3, 3).softmax(-1), torch.rand(1, 2, 3, 3).softmax(-1)
    step = lambda a: 0.5 * a.mean(1) + 0.5 * torch.eye(3)  # rows already sum to 1  # noqa: E731
    torch.testing.assert_close(rollout_step(rollout_step(None, a1), a2), step(a2) @ step(a1))
