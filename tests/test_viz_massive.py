"""Massive activations (Sun et al. 2024): top magnitudes, median and location against numpy, and a planted
massive value found on the right token and channel in both token orders."""

import numpy as np
import pytest
import torch
from viz_support import smooth_images, tiny_timm, tiny_vit5

from vit5.viz import (
    CollectConfig,
    MetricConfig,
    capture,
    collect,
    compute_metrics,
    describe,
    to_batch,
)
from vit5.viz.collect import massive_activations
from vit5.viz.figures import MapStyle, massive_activation_figure


@pytest.mark.parametrize("shape", [(2, 5, 7), (3, 4, 6)])  # odd and even token x channel counts
def test_top_values_locations_and_median_match_numpy(shape):
    x = torch.randn(*shape)
    found = massive_activations(x)
    flat = x.abs().flatten(1).numpy()
    for b in range(shape[0]):
        order = np.argsort(-flat[b], kind="stable")[:3]
        np.testing.assert_allclose(found["massive_top"][b].numpy(), flat[b][order], rtol=1e-6)
        np.testing.assert_array_equal(found["massive_token"][b].numpy(), order // shape[2])
        np.testing.assert_array_equal(found["massive_channel"][b].numpy(), order % shape[2])
        assert found["massive_median"][b].item() == pytest.approx(np.median(flat[b]), rel=1e-6)


@pytest.mark.parametrize("family", ["vit5", "timm"])
def test_a_planted_massive_value_is_located_on_its_register_and_channel(family):
    torch.manual_seed(0)
    model = tiny_vit5(depth=3) if family == "vit5" else tiny_timm(depth=3)
    images = smooth_images(4)
    layout = describe(model).layout((32, 48))
    token = layout.register_slice.start + 2  # the third register, wherever the order puts it

    def plant(module, inputs, output):
        out = output.clone()
        out[:, token, 5] = 500.0
        return out

    handle = model.blocks[1].register_forward_hook(plant)
    stats = collect(model, images, "planted", CollectConfig(batch_size=2, progress=False))
    report = compute_metrics(stats, MetricConfig(n_boot=20))
    info = describe(model)
    with torch.no_grad(), capture(model, attention=False) as rec:
        model.forward_features(to_batch(images, info.mean, info.std))
    handle.remove()
    for block in (1, 2):
        where = report.massive[block]
        assert (where["token"], where["channel"], where["token_type"], where["share"]) == (
            token,
            5,
            "register",
            1.0,
        )
        magnitude = rec.tokens[block].abs().flatten(1).numpy()
        expected = magnitude.max(axis=1) / np.median(magnitude, axis=1)
        np.testing.assert_allclose(report.per_image["massive_ratio"][:, block], expected, rtol=1e-5)
    assert report.per_image["massive_on_register"][:, 1].min() == 1.0
    assert report.per_image["massive_on_register"][:, 0].max() == 0.0  # before the planted block
    assert "register" in report.table() and "MA top/med" in report.table()
    fig = massive_activation_figure({"planted": (stats, report)}, MapStyle())
    assert "Massive activations" in fig._suptitle.get_text()
