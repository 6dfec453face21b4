"""Test-time registers: a planted outlier neuron is found first, and its activations move into the extra
token.

The neuron is planted by weights (viz_support.plant_outlier_neuron, independent of vit5.viz.ttr) so that
it fires only on white patches; detection and clean-up are then checked exactly: the block output
under test-time registers equals an explicit forward pass written here.
"""

from dataclasses import asdict

import numpy as np
import pytest
import timm
import torch
from timm.models.eva import Eva
from viz_support import bright_patch_images, plant_outlier_neuron, sharpen, tiny_timm, tiny_vit5

from vit5.errors import InputError
from vit5.model import ViT5
from vit5.outputs import write_json
from vit5.viz import CollectConfig, MetricConfig, collect, compute_metrics, describe, to_batch
from vit5.viz.ttr import (
    NeuronSearch,
    RegisterNeuron,
    find_register_neurons,
    read_neurons,
    use_test_time_registers,
)

BRIGHT = [(1, 4), (3, 0), (0, 2)]  # (row, col) in the 4 x 6 grid of a 32 x 48 image
LAYER, NEURON = 1, 17
QUIET = CollectConfig(batch_size=4, progress=False)


def tiny_eva(name: str, **overrides) -> torch.nn.Module:
    """A random timm Eva (RoPE): EVA-02-style ``vit_small_patch16_rope_224`` or DINOv3 (4 registers)."""
    cfg = dict(depth=3, embed_dim=64, num_heads=2, img_size=32, patch_size=8, num_classes=0)
    cfg |= dict(dynamic_img_size=True)
    return sharpen(timm.create_model(name, pretrained=False, **{**cfg, **overrides}))


FAMILIES = {
    "vit5": lambda: tiny_vit5(depth=3, num_registers=0),
    "vit5-registers": lambda: tiny_vit5(depth=3, num_registers=4),
    "timm": lambda: tiny_timm(reg_tokens=0, depth=3),
    "timm-registers": lambda: tiny_timm(reg_tokens=4, depth=3),
    "eva": lambda: tiny_eva("vit_small_patch16_rope_224"),
    "dinov3": lambda: tiny_eva("vit_small_patch16_dinov3"),
}


def _planted(family: str):
    torch.manual_seed(0)
    model = FAMILIES[family]()
    images = bright_patch_images(6, BRIGHT)
    layout = describe(model).layout((32, 48))
    tokens = [layout.patch_slice.start + r * 6 + c for r, c in BRIGHT]
    plant_outlier_neuron(model, LAYER, NEURON, images, tokens)
    return model, images, tokens


@pytest.fixture(scope="module", params=sorted(FAMILIES))
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


def _insert_index(model) -> int:
    """Where the test-time token goes, read from the model's own attributes: after the trained
    registers (vit5: at the end of the sequence; timm: after its prefix tokens)."""
    if isinstance(model, ViT5):
        layout = model.token_layout((4, 6))
        return layout.num_tokens
    return model.num_prefix_tokens


def _explicit_block_output(model, images, layer: int, neuron: int) -> torch.Tensor:
    """Block ``layer``'s output with one zero token inserted and the TTR edit, written out by hand:
    vit5 gets a RoPE row of angle 0 for it, an Eva a rotation row of angle 0 (sin 0, cos 1) in
    front of its patch rows, with its attention's prefix count left as it is."""
    info = describe(model)
    x = to_batch(images, info.mean, info.std)
    at = _insert_index(model)
    if isinstance(model, ViT5):
        tokens, grid = model.prepare_tokens(x)
        table = model.rope_table(grid)
        cos = torch.cat([table.cos, torch.ones(1, table.cos.shape[1])])
        sin = torch.cat([table.sin, torch.zeros(1, table.sin.shape[1])])
        extra = {"rope": (cos, sin)}
    elif isinstance(model, Eva):
        tokens, rope = model._pos_embed(model.patch_embed(x))
        tokens = model.norm_pre(tokens)
        half = rope.shape[-1] // 2
        unrotated = torch.cat([torch.zeros(1, half), torch.ones(1, half)], dim=-1)
        extra = {"rope": torch.cat([unrotated, rope], dim=-2)}
    else:
        tokens = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))
        extra = {}
    zero = torch.zeros(tokens.shape[0], 1, tokens.shape[2])
    tokens = torch.cat([tokens[:, :at], zero, tokens[:, at:]], dim=1)
    if isinstance(model, ViT5):
        patches = list(range(1, 1 + 24))
    else:
        patches = list(range(at + 1, at + 1 + 24))

    def edit(module, args):
        h = args[0].clone()
        h[:, at, neuron] = h[:, :, neuron].max(dim=1).values
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
        assert (
            info.test_registers == 1
            and info.layout((32, 48)).num_tokens == plain.layout.num_tokens + 1
        )
        from vit5.viz import capture

        with torch.no_grad(), capture(model, layers=[LAYER], attention=False) as rec:
            out = model.forward_features(to_batch(images, info.mean, info.std))
        moved = collect(model, images, "test-time register", QUIET)
    torch.testing.assert_close(
        rec.tokens[LAYER],
        _explicit_block_output(model, images, LAYER, NEURON),
        atol=1e-4,
        rtol=1e-5,
    )
    assert (
        out.shape[1] == plain.layout.num_tokens
    )  # the extra token is dropped before the final norm
    after = compute_metrics(moved, MetricConfig(n_boot=20, thresholds=tuple(reference.thresholds)))
    assert (
        after.per_image["outlier_ratio"][:, LAYER].max() == 0
    )  # the outliers left the patches ...
    at = _insert_index(model)
    new_norms = moved.norms[:, LAYER, at]  # ... for the test-time register
    assert (new_norms > reference.thresholds[LAYER]).all()
    assert moved.layout.num_registers == plain.layout.num_registers + 1
    assert moved.layout.register_slice.stop - 1 == at  # after the trained registers
    assert describe(model).test_registers == 0  # restored on exit
    if isinstance(model, Eva):
        assert all(
            block.attn.num_prefix_tokens == model.num_prefix_tokens for block in model.blocks
        )


def test_no_outliers_is_a_clear_error():
    torch.manual_seed(0)
    model = tiny_vit5(depth=2, num_registers=0)
    with pytest.raises(InputError, match="no image has a patch above norm"):
        find_register_neurons(model, bright_patch_images(2, BRIGHT), NeuronSearch(threshold=1e9))


def test_refused_when_already_active_and_for_neurons_the_model_lacks():
    model = tiny_vit5(depth=2, num_registers=0)
    with use_test_time_registers(model, [RegisterNeuron(0, 0, 1.0)]):
        with pytest.raises(InputError, match="already active"):
            with use_test_time_registers(model, [RegisterNeuron(0, 0, 1.0)]):
                pass
    width = model.blocks[0].mlp.fc2.in_features
    with pytest.raises(InputError, match="do not exist"):
        with use_test_time_registers(model, [RegisterNeuron(0, width, 1.0)]):
            pass


def test_neurons_read_back_from_the_json_of_viz_ttr(tmp_path, planted):
    model, images, _ = planted
    found = find_register_neurons(model, images, NeuronSearch(top_k=3))
    path = write_json(tmp_path / "register_neurons.json", asdict(found))
    assert read_neurons(path) == found.neurons
    (tmp_path / "bad.json").write_text('{"neurons": [{"layer": 1, "neuron": -2, "score": 1}]}')
    with pytest.raises(InputError, match="neurons\\[0\\]"):
        read_neurons(tmp_path / "bad.json")
