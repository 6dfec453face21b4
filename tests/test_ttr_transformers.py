"""Test-time registers on transformers backbones (``transformers:`` specs): tiny random DINOv2,
DINOv2-with-registers, DINOv3 (RoPE) and ViT models saved offline with ``save_pretrained``, with an
outlier neuron planted by weights before saving (it fires only on white patches, as in
tests/test_viz_ttr.py, written here for transformers' MLP names).

The search ranks the planted neuron first; the block output under test-time registers equals a
forward pass written out here without hooks (softmax attention, DINOv3's RoPE applied to the patch
rows only, so the inserted token stays unrotated like CLS and the registers); the outliers move
from the patches to the added token; ``vit5 viz ttr`` and ``vit5 eval features --clean ttr`` run
end to end on a folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from viz_support import bright_patch_images, write_png

from vit5.cli import main as vit5_main
from vit5.errors import InputError
from vit5.introspect.load import load_spec
from vit5.viz import (
    CollectConfig,
    MetricConfig,
    capture,
    collect,
    compute_metrics,
    describe,
    to_batch,
)
from vit5.viz.ttr import (
    NeuronSearch,
    RegisterNeuron,
    find_register_neurons,
    use_test_time_registers,
)

transformers = pytest.importorskip("transformers")

BRIGHT = [(1, 4), (3, 0), (0, 2)]  # (row, col) in the 4 x 6 grid of a 32 x 48 image
GRID = (4, 6)
PATCHES = GRID[0] * GRID[1]
LAYER = 1
NEURON = 17
QUIET = CollectConfig(batch_size=6, progress=False)
SMALL = dict(
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=64,
    patch_size=8,
    image_size=32,
)
CONFIGS = {
    "dinov2": lambda: transformers.Dinov2Config(**SMALL),
    "dinov2reg": lambda: transformers.Dinov2WithRegistersConfig(num_register_tokens=4, **SMALL),
    "dinov3": lambda: transformers.DINOv3ViTConfig(num_register_tokens=4, **SMALL),
    "vit": lambda: transformers.ViTConfig(**SMALL),
}


def _mlp_in(layer) -> torch.nn.Linear:
    mlp = layer.mlp
    return mlp.fc1 if hasattr(mlp, "fc1") else mlp.up_proj  # DINOv3: up_proj


def _mlp_out(layer) -> torch.nn.Linear:
    mlp = layer.mlp
    return mlp.fc2 if hasattr(mlp, "fc2") else mlp.down_proj


def _layers(hf) -> torch.nn.ModuleList:
    if hasattr(hf, "layers"):  # ViT
        return hf.layers
    encoder = hf.encoder if hasattr(hf, "encoder") else hf.model  # DINOv3: model
    return encoder.layer


def _pixels(images) -> torch.Tensor:
    """The images as vit5 feeds these folders (no preprocessor config: ImageNet mean / std)."""
    return to_batch(images, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def _inputs(hf, x: torch.Tensor) -> dict:
    """ViT is called with ``interpolate_pos_encoding`` for a size it was not built for (as vit5 does)."""
    if isinstance(hf, transformers.ViTModel):
        return {"pixel_values": x, "interpolate_pos_encoding": True}
    return {"pixel_values": x}


def _embeddings(hf, x: torch.Tensor) -> torch.Tensor:
    if isinstance(hf, transformers.ViTModel):
        return hf.embeddings(x, interpolate_pos_encoding=True)
    return hf.embeddings(x)


def _plant(hf, images, tokens: list[int], boost: float = 30.0) -> None:
    """Hidden unit NEURON of layer LAYER's GELU MLP fires only on ``tokens`` and writes a large
    vector there (the weight planting of viz_support.plant_outlier_neuron, independent of vit5)."""
    layer = _layers(hf)[LAYER]
    seen = {}
    handle = _mlp_in(layer).register_forward_pre_hook(lambda m, a: seen.update(h=a[0]))
    with torch.no_grad():
        out = hf(**_inputs(hf, _pixels(images)), output_hidden_states=True)
    handle.remove()
    h = seen["h"]
    mask = torch.zeros(h.shape[1], dtype=torch.bool)
    mask[tokens] = True
    direction = h[:, mask].mean(dim=(0, 1)) - h[:, ~mask].mean(dim=(0, 1))
    direction = direction / direction.norm()
    s = h @ direction
    low = s[:, ~mask].max()
    high = s[:, mask].min()
    assert high > low, "the planted tokens are not linearly separable from the others"
    gain = 40.0 / float(high - low)
    middle = (low + high) / 2
    fired = F.gelu(gain * (s[:, mask] - middle)).mean()
    median = out.hidden_states[LAYER + 1].norm(dim=-1).median()
    scale = getattr(layer, "layer_scale2", None)
    gamma = torch.ones(1) if scale is None else scale.lambda1.abs().mean()
    u = F.normalize(torch.randn(h.shape[-1], generator=torch.Generator().manual_seed(7)), dim=0)
    with torch.no_grad():
        _mlp_in(layer).weight[NEURON] = gain * direction
        _mlp_in(layer).bias[NEURON] = -gain * middle
        _mlp_out(layer).weight[:, NEURON] = u * boost * median / (fired * gamma)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf_ttr")
    images = bright_patch_images(6, BRIGHT)
    out = {}
    for name, make in CONFIGS.items():
        torch.manual_seed(0)
        config = make()
        assert config.hidden_act == "gelu"  # the planting and the reference use exact GELU
        hf = transformers.AutoModel.from_config(config).eval()
        prefix = 1 + getattr(config, "num_register_tokens", 0)
        _plant(hf, images, [prefix + r * GRID[1] + c for r, c in BRIGHT])
        hf.save_pretrained(root / name)
        out[name] = root / name
    return out


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def planted(request, folders):
    return request.param, load_spec(f"transformers:{folders[request.param]}", require="recording")


def test_the_planted_neuron_is_found_first(planted):
    _, loaded = planted
    images = bright_patch_images(6, BRIGHT)
    found = find_register_neurons(loaded.model, images, NeuronSearch(top_k=5))
    assert (found.neurons[0].layer, found.neurons[0].neuron) == (LAYER, NEURON)
    assert found.detect_layer == LAYER and found.top_layer == LAYER
    assert found.images_with_outliers == len(images)
    assert found.neurons[0].score > 10 * found.neurons[1].score


def _rotate_patches(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """DINOv3's rotation of the last ``len(cos)`` rows (the patches); the rows before are left."""
    count = cos.shape[0]
    patches = t[..., -count:, :]
    half = patches.shape[-1] // 2
    rotated = torch.cat([-patches[..., half:], patches[..., :half]], dim=-1)
    return torch.cat([t[..., :-count, :], patches * cos + rotated * sin], dim=-2)


def _norms_of(layer) -> list[torch.nn.Module]:
    if hasattr(layer, "norm1"):
        return [layer.norm1, layer.norm2]
    return [layer.layernorm_before, layer.layernorm_after]  # ViT


def _gamma(layer, which: int):
    scale = getattr(layer, f"layer_scale{which}", None)
    return 1.0 if scale is None else scale.lambda1  # ViT has no LayerScale


def _layer(layer, x: torch.Tensor, rope, edit) -> torch.Tensor:
    """One transformers layer written out: pre-norm softmax attention and GELU MLP with LayerScale;
    ``edit(hidden)`` changes the MLP hidden activation."""
    norms = _norms_of(layer)
    att = layer.attention
    heads = att.config.num_attention_heads
    h = norms[0](x)
    q = att.q_proj(h).unflatten(-1, (heads, -1)).transpose(1, 2)
    k = att.k_proj(h).unflatten(-1, (heads, -1)).transpose(1, 2)
    v = att.v_proj(h).unflatten(-1, (heads, -1)).transpose(1, 2)
    if rope is not None:
        q = _rotate_patches(q, rope[0], rope[1])
        k = _rotate_patches(k, rope[0], rope[1])
    weights = torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, dim=-1)
    x = x + _gamma(layer, 1) * att.o_proj((weights @ v).transpose(1, 2).flatten(2))
    hidden = edit(F.gelu(_mlp_in(layer)(norms[1](x))))
    return x + _gamma(layer, 2) * _mlp_out(layer)(hidden)


def _explicit_block_output(name: str, hf, x: torch.Tensor) -> torch.Tensor:
    """Layer LAYER's output with one zero token inserted after CLS and the registers and the TTR
    edit at NEURON, without hooks: transformers' embeddings, then each layer by :func:`_layer`."""
    tokens = _embeddings(hf, x)
    at = tokens.shape[1] - PATCHES
    zero = torch.zeros(tokens.shape[0], 1, tokens.shape[2])
    tokens = torch.cat([tokens[:, :at], zero, tokens[:, at:]], dim=1)
    rope = hf.rope_embeddings(x) if name == "dinov3" else None
    patches = slice(at + 1, at + 1 + PATCHES)

    def moved(hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.clone()
        hidden[:, at, NEURON] = hidden[:, :, NEURON].max(dim=1).values
        hidden[:, patches, NEURON] = 0
        return hidden

    with torch.no_grad():
        for i, layer in enumerate(_layers(hf)[: LAYER + 1]):
            tokens = _layer(layer, tokens, rope, moved if i == LAYER else lambda h: h)
    return tokens


def test_the_reference_is_the_plain_model_without_the_token(planted):
    """The written-out layers reproduce transformers' own hidden states (no token, no edit): the
    reference below is the model's computation."""
    name, loaded = planted
    hf = loaded.model.hf
    x = _pixels(bright_patch_images(2, BRIGHT))
    with torch.no_grad():
        expected = hf(**_inputs(hf, x), output_hidden_states=True).hidden_states[LAYER + 1]
        tokens = _embeddings(hf, x)
        rope = hf.rope_embeddings(x) if name == "dinov3" else None
        for layer in _layers(hf)[: LAYER + 1]:
            tokens = _layer(layer, tokens, rope, lambda h: h)
    torch.testing.assert_close(tokens, expected, atol=1e-4, rtol=1e-5)


def test_test_time_register_equals_the_explicit_computation_and_removes_the_outliers(planted):
    name, loaded = planted
    model = loaded.model
    images = bright_patch_images(6, BRIGHT)
    plain = collect(model, images, "planted", QUIET)
    reference = compute_metrics(plain, MetricConfig(n_boot=20))
    x = _pixels(images)
    with use_test_time_registers(model, [RegisterNeuron(LAYER, NEURON, 1.0)]):
        info = describe(model)
        assert info.test_registers == 1
        assert info.layout((32, 48)).num_tokens == plain.layout.num_tokens + 1
        with torch.no_grad(), capture(model, layers=[LAYER], attention=False) as rec:
            out = model.forward_features(x)
        with torch.no_grad():
            grid = model.forward_intermediates(x, [LAYER])[0][0]
        moved = collect(model, images, "test-time register", QUIET)
    explicit = _explicit_block_output(name, model.hf, x)
    torch.testing.assert_close(rec.tokens[LAYER], explicit, atol=1e-4, rtol=1e-5)
    at = plain.layout.num_cls + plain.layout.num_registers  # after CLS and the trained registers
    patches = explicit[:, at + 1 :].transpose(1, 2).unflatten(-1, GRID)
    torch.testing.assert_close(grid, patches, atol=1e-4, rtol=1e-5)  # the patches, not the token
    assert out.shape[1] == plain.layout.num_tokens  # the token is dropped before the final norm
    thresholds = tuple(reference.thresholds)
    after = compute_metrics(moved, MetricConfig(n_boot=20, thresholds=thresholds))
    assert reference.per_image["outlier_ratio"][:, LAYER].min() > 0
    assert after.per_image["outlier_ratio"][:, LAYER].max() == 0  # the outliers left the patches
    assert (moved.norms[:, LAYER, at] > reference.thresholds[LAYER]).all()  # ... for the token
    assert moved.layout.num_registers == plain.layout.num_registers + 1
    assert moved.layout.register_slice.stop - 1 == at
    assert describe(model).test_registers == 0  # restored on exit


def test_siglip_is_refused_naming_the_supported_models(tmp_path):
    config = transformers.SiglipVisionConfig(**dict(SMALL, num_hidden_layers=1))
    transformers.AutoModel.from_config(config).save_pretrained(tmp_path / "siglip")
    loaded = load_spec(f"transformers:{tmp_path / 'siglip'}")
    refused = "cannot be added to a transformers SiglipVisionModel.*supported are .*DINOv3ViTModel"
    with pytest.raises(InputError, match=refused):
        find_register_neurons(loaded.model, bright_patch_images(1, BRIGHT))
    with pytest.raises(InputError, match=refused):
        with use_test_time_registers(loaded.model, [RegisterNeuron(0, 0, 1.0)]):
            pass


def test_viz_ttr_and_eval_features_clean_ttr_end_to_end(folders, tmp_path):
    images = tmp_path / "imgs"
    for image in bright_patch_images(4, BRIGHT):
        write_png(images / f"{image.name}.png", image.rgb)
    spec = f"transformers:{folders['dinov3']}"
    viz = tmp_path / "viz"
    args = ["viz", "ttr", "--model", spec, "--images", str(images), "--out", str(viz)]
    assert vit5_main([*args, "--size", "32x48", "--quiet", "--formats", "png"]) == 0
    neurons = viz / "ttr" / "register_neurons.json"
    found = json.loads(neurons.read_text())
    assert (found["neurons"][0]["layer"], found["neurons"][0]["neuron"]) == (LAYER, NEURON)
    pngs = list((viz / "ttr").rglob("*.png"))
    assert pngs and all(p.stat().st_size > 1000 for p in pngs)
    features = tmp_path / "features"
    args = ["eval", "features", "--model", spec, "--images", str(images), "--out", str(features)]
    ttr = ["--clean", "ttr", "--neurons", str(neurons)]
    assert vit5_main([*args, "--size", "32x48", "--layers", "1", *ttr]) == 0
    manifest = json.loads((features / "manifest.json").read_text())
    from safetensors.torch import load_file

    saved = load_file(str(features / manifest["images"][0]["file"]))
    assert saved["blocks.1.registers"].shape == (4, 32)  # the trained registers only
    assert saved["blocks.1.patches"].shape == (32, *GRID)
    norms = saved["blocks.1.patches"].float().norm(dim=0).numpy()
    bright = np.zeros(GRID, bool)
    for r, c in BRIGHT:
        bright[r, c] = True
    # the planted outliers are gone: the white patches are no longer far above the others
    assert norms[bright].min() < 3 * np.median(norms[~bright])
