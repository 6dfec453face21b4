"""Position-artifact probe: the two numbers against hand computations and synthetic features of known
structure, and the structural fact that RoPE alone leaves no pattern on a constant image."""

import numpy as np
import pytest
import timm
import torch

import vit5
from vit5.viz import MapStyle
from vit5.viz.position import (
    COLOUR_SPAN,
    PositionProbeConfig,
    constant_spatial_share,
    pca_map,
    position_figure,
    position_share,
    probe_images,
    run_position_probe,
)


def test_constant_spatial_share_by_hand():
    f = np.array([[[1.0, 0.0], [3.0, 0.0]]])  # two patches: mean (2, 0), deviations +-1
    assert constant_spatial_share(f)[0] == pytest.approx(
        1.0 / 5.0
    )  # mean sq deviation 1 / mean sq norm (1 + 9) / 2
    assert constant_spatial_share(np.ones((1, 4, 3)))[0] == 0.0


def test_pca_map_is_grey_without_a_pattern_and_on_an_absolute_scale():
    same = np.tile(np.array([3.0, -1.0, 2.0, 0.5]), (6, 1))
    np.testing.assert_allclose(pca_map(same, (2, 3)), 0.5)  # no amplified rounding noise
    f = np.tile(np.array([10.0, 0.0, 0.0, 0.0]), (6, 1))
    f[:, 1] = [1, -1, 1, -1, 1, -1]  # one direction of deviation, +-1 on a norm of ~10
    first = pca_map(f, (2, 3))[..., 0].ravel()
    expected = 0.5 + 0.5 * np.abs(f[:, 1]) / (COLOUR_SPAN * np.sqrt((f**2).sum(-1).mean()))
    np.testing.assert_allclose(
        np.sort(first), np.sort(np.where(f[:, 1] > 0, 1, -1) * (expected - 0.5) + 0.5)
    )


@pytest.mark.parametrize("pattern_var,noise_var", [(1.0, 1.0), (1.0, 0.0), (0.0, 1.0), (3.0, 1.0)])
def test_position_share_recovers_the_variance_split(pattern_var, noise_var):
    rng = np.random.default_rng(0)
    m, p, c = 400, 64, 8
    pattern = rng.normal(0, np.sqrt(pattern_var), (1, p, c))
    features = pattern + rng.normal(0, np.sqrt(noise_var), (m, p, c))
    expected = pattern.var(axis=1).sum() / (pattern.var(axis=1).sum() + noise_var * c)
    assert position_share(features) == pytest.approx(expected, abs=0.02)


def _vit5(**kw):
    torch.manual_seed(0)
    model = vit5.create_model(
        "vit5_tiny", depth=2, img_size=32, patch_size=8, num_classes=0, layer_scale=1.0, **kw
    )
    return model.eval()


def test_rope_alone_leaves_no_pattern_without_prefix_tokens_but_ape_does():
    cfg = PositionProbeConfig(size=(32, 48), noise_images=4)
    rope_only = run_position_probe(
        _vit5(ape=False, class_token=False, global_pool="avg", num_registers=0), "rope", cfg
    )
    assert (
        rope_only.constant_spatial_share < 1e-10
    )  # identical tokens stay identical: values are all equal
    assert np.ptp(rope_only.constant_norms, axis=(1, 2)).max() < 1e-4
    with_ape = run_position_probe(
        _vit5(rope=False, class_token=False, global_pool="avg", num_registers=0), "ape", cfg
    )
    assert with_ape.constant_spatial_share > 1e-4 and with_ape.grid == (4, 6)
    assert with_ape.constant_norms.shape == (5, 4, 6) and with_ape.constant_pca.shape == (
        5,
        4,
        6,
        3,
    )


def test_timm_non_square_and_figure():
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_small_patch16_224",
        pretrained=False,
        depth=1,
        embed_dim=32,
        num_heads=2,
        img_size=32,
        patch_size=8,
        num_classes=0,
        reg_tokens=4,
        dynamic_img_size=True,
    ).eval()
    probe = run_position_probe(
        model,
        "timm (random init)",
        PositionProbeConfig(size=(40, 24), noise_images=3, levels=(0.5,)),
    )
    assert (
        probe.grid == (5, 3)
        and probe.noise_norms.shape == (5, 3)
        and 0 <= probe.noise_position_share <= 1
    )
    constant, noise = probe_images((40, 24), PositionProbeConfig(noise_images=3, levels=(0.5,)))
    assert (constant[0].rgb == 128).all() and len(noise) == 3 and noise[0].rgb.shape == (40, 24, 3)
    fig = position_figure([probe], MapStyle())
    assert "Position-artifact probe" in fig._suptitle.get_text()
