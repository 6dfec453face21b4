"""Test-time registers: a planted outlier neuron is found first, and its activations move into the extra
token.

The neuron is planted by weights (viz_support.plant_outlier_neuron, independent of vit5.viz.ttr) so that
it fires only on white patches; detection and clean-up are then checked exactly: the block output
under test-time registers equals an explicit forward pass written here.
"""

import numpy as np
import pytest
import timm
import torch
from viz_support import bright_patch_images, plant_outlier_neuron, tiny_timm, tiny_vit5

from vit5.errors import InputError
from vit5.viz import CollectConfig, MetricConfig, collect, compute_metrics, describe, to_batch
from vit5.viz.ttr import NeuronSearch, RegisterNeuron, find_register_neurons, use_test_time_registers

BRIGHT = [(1, 4), (3, 0), (0, 2)]  # (row, col) in the 4 x 6 grid of a 32 x 48 image
LAYER, NEURON = 1, 17
QUIET = CollectConfig(batch_size=4, progress=False)


def _planted(family: str):
    torch.manual_seed(0)
    model = tiny_vit5(depth=3, num_registers=0) if family == "vit5" else tiny_timm(reg_tokens=0, depth=3)
    images = bright_patch_images(6, BRIGHT)
    layout = describe(model).layout((32, 48))
    tokens = [layout.patch_slice.start + r * 6 + c for r, c in BRIGHT]
    plant_outlier_neuron(model, LAYER, NEURON, images, tokens)
    return model, images, tokens


@pytest.fixture(scope="module", params=["vit5", "timm"])
def planted(request):
    return _planted(request.param)


def test_the_planted_neuron_makes_the_white_patches_outliers(planted):
    model, images, _ = planted
    report = compute_metrics(collect(model, images, "planted", QUIET), MetricConfig(n_boot=20))
    expected = np.zeros(24, bool)
    expected[[r * 6 + c for r, c in BRIGHT]] = True
    for block in (LAYER, LAYER + 1):
        assert (report.outliers[:, block] == expected).all()
    assert report.per_image["outlier_ratio"][:, 0].max() == 0  # nothing before the planted block


def test_the_planted_neuron_is_found_first(planted):
    model, images, _ = planted
    found = find_register_neurons(model, images, NeuronSearch(top_k=5))
    assert (found.neurons[0].layer, found.neurons[0].neuron) == (LAYER, NEURON)
    assert found.detect_layer == LAYER and found.top_layer == LAYER
    assert found.images_with_outliers == len(images)
    assert found.neurons[0].score > 10 * found.neurons[1].score
    assert "1:17" in found.describe()


def _explicit_block_output(model, images, layer: int, neuron: int) -> torch.Tensor:
    """Block ``layer``'s output with one zero token appended and the TTR edit, written out by hand."""
    info = describe(model)
    x = to_batch(images, info.mean, info.std)
    if info.family == "vit5":
        tokens, grid = model.prepare_tokens(x)
        table = model.rope_table(grid)
        cos, sin = table.cos, table.sin
        extra = {
            "rope": (
                torch.cat([cos, torch.ones(1, cos.shape[1])]),
                torch.cat([sin, torch.zeros(1, sin.shape[1])]),
            )
        }
    else:
        tokens = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))
        extra = {}
    tokens = torch.cat([tokens, torch.zeros(tokens.shape[0], 1, tokens.shape[2])], dim=1)
    patches = info.layout((32, 48)).patch_slice

    def edit(module, args):
        h = args[0].clone()
        h[:, -1, neuron] = h[:, :, neuron].max(dim=1).values
        h[:, patches, neuron] = 0
        return (h,)

    with torch.no_grad():
        for i, block in enumerate(model.blocks[: layer + 1]):
            handle = block.mlp.fc2.register_forward_pre_hook(edit) if i == layer else None
            tokens = block(tokens, **extra)
            if handle:
                handle.remove()
    return tokens


def test_test_time_register_equals_the_explicit_computation_and_removes_the_outliers(planted):
    model, images, _ = planted
    plain = collect(model, images, "planted", QUIET)
    reference = compute_metrics(plain, MetricConfig(n_boot=20))
    with use_test_time_registers(model, [RegisterNeuron(LAYER, NEURON, 1.0)]):
        info = describe(model)
        assert info.test_registers == 1 and info.layout((32, 48)).num_tokens == plain.layout.num_tokens + 1
        from vit5.viz import capture

        with torch.no_grad(), capture(model, layers=[LAYER], attention=False) as rec:
            out = model.forward_features(to_batch(images, info.mean, info.std))
        moved = collect(model, images, "test-time register", QUIET)
    torch.testing.assert_close(
        rec.tokens[LAYER], _explicit_block_output(model, images, LAYER, NEURON), atol=1e-4, rtol=1e-5
    )
    assert out.shape[1] == plain.layout.num_tokens  # the extra token is dropped before the final norm
    after = compute_metrics(moved, MetricConfig(n_boot=20, thresholds=tuple(reference.thresholds)))
    assert after.per_image["outlier_ratio"][:, LAYER].max() == 0  # the outliers left the patches ...
    assert after.per_image["outlier_ratio_registers"][:, LAYER].min() == 1  # ... for the test-time register
    assert moved.layout.num_registers == 1 and moved.layout.register_slice.start == plain.layout.num_tokens
    assert describe(model).test_registers == 0  # restored on exit


def test_no_outliers_is_a_clear_error():
    torch.manual_seed(0)
    model = tiny_vit5(depth=2, num_registers=0)
    with pytest.raises(InputError, match="no image has a patch above norm"):
        find_register_neurons(model, bright_patch_images(2, BRIGHT), NeuronSearch(threshold=1e9))


def test_refused_for_models_with_trained_registers_and_eva():
    with (
        pytest.raises(InputError, match="already has 4 trained registers"),
        use_test_time_registers(tiny_vit5(depth=2), [RegisterNeuron(0, 0, 1.0)]),
    ):
        pass
    eva = timm.create_model(
        "vit_small_patch16_rope_224",
        pretrained=False,
        depth=1,
        embed_dim=32,
        num_heads=2,
        img_size=32,
        patch_size=8,
        num_classes=0,
    )
    with pytest.raises(InputError, match="Eva"), use_test_time_registers(eva, [RegisterNeuron(0, 0, 1.0)]):
        pass
