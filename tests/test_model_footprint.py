"""A config's size is known before anything is allocated, and a crafted ``config.json`` fails at once.

The parameter count formula is checked against built models of every switch; a refused config must
never reach the ``ViT5`` constructor (the tests make that constructor fail loudly).
"""

from __future__ import annotations

import json
import math

import pytest
from test_train_support import single_thread  # noqa: F401 (autouse fixture: one torch thread)

import vit5
from vit5.model.footprint import (
    activation_bytes,
    attention_bytes,
    check_size,
    num_tokens,
    parameter_count,
)
from vit5.weights import factory as factory_module

SWITCHES = [
    {},
    {"norm": "layernorm", "qkv_bias": True, "qk_norm": False, "rope": False, "num_registers": 0},
    {
        "mlp": "swiglu",
        "num_kv_heads": 1,
        "layer_scale": None,
        "class_token": False,
        "global_pool": "avg",
    },
    {
        "mlp": "swiglu",
        "mlp_bias": True,
        "mlp_ratio": 2.5,
        "ape": False,
        "num_registers": 9,
        "img_size": (32, 48),
    },
    {
        "mlp_ratio": 0.5,
        "num_classes": 0,
        "pre_norm": False,
        "in_chans": 1,
        "patch_size": 4,
    },
]


@pytest.mark.parametrize("switches", SWITCHES)
@pytest.mark.parametrize("name", ["vit5_tiny", "deit3_tiny", "vanilla_vit_tiny"])
def test_parameter_count_is_exact(name, switches):
    cfg = vit5.preset_config(
        name, **{"depth": 2, "embed_dim": 48, "num_heads": 4, "img_size": 32, **switches}
    )
    built = sum(p.numel() for p in vit5.ViT5(cfg).parameters())
    assert parameter_count(cfg) == built


def test_activation_estimates_follow_the_shapes():
    cfg = vit5.preset_config("vit5_small")
    n = 14 * 14 + 1 + 4
    assert num_tokens(cfg) == n and num_tokens(cfg, (448, 224)) == 28 * 14 + 5
    # per block: x, norm(x), attention output (3 * 384), q, k, v (3 * 384), MLP hidden (1536), float32
    assert activation_bytes(cfg, batch=2) == 2 * n * (3 * 384 + 3 * 384 + 1536) * 4
    assert activation_bytes(cfg, batch=2, training=True) == 12 * activation_bytes(cfg, batch=2)
    assert attention_bytes(2, 6, n) == 2 * 6 * n * n * 8  # scores + fp32 probabilities
    with_scores = activation_bytes(cfg, batch=2, materialised_attention=True)
    assert with_scores == activation_bytes(cfg, batch=2) + attention_bytes(2, 6, n)


@pytest.fixture
def no_model_built(monkeypatch):
    """Any ViT5 constructed by the loaders fails the test: refusals must come before allocation."""

    def refuse(cfg):
        raise AssertionError(
            f"a model was built for {cfg.depth=} {cfg.embed_dim=} before the size check"
        )

    monkeypatch.setattr(factory_module, "ViT5", refuse)


def test_a_preset_beyond_the_limit_is_refused_with_the_estimate(no_model_built):
    with pytest.raises(vit5.ConfigError, match=r"44.4e9 parameters .*depth 100000.*max_params="):
        vit5.create_model("vit5_tiny", depth=100_000)
    with pytest.raises(vit5.ConfigError, match=r"more than the limit of 1e\+06"):
        check_size(vit5.preset_config("vit5_tiny"), max_params=1e6)
    assert (
        check_size(vit5.preset_config("vit5_tiny"), max_params=6e6) == 5_712_424
    )  # the limit can be raised


@pytest.fixture
def model_dir(tmp_path):
    model = vit5.create_model(
        "vit5_tiny", depth=2, embed_dim=48, num_heads=2, img_size=16, patch_size=8
    )
    vit5.save_pretrained(model, tmp_path / "m")
    return tmp_path / "m"


def edit_config(directory, **changes):
    path = directory / "config.json"
    data = json.loads(path.read_text())
    key = (
        "model_args" if "model_args" in data else "config"
    )  # hub-ready dirs keep the config in model_args
    if "whole" in changes:
        data[key] = changes.pop("whole")
    data[key].update(changes) if isinstance(data[key], dict) else None
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"depth": 100_000}, "parameters .*more than the limit of"),
        ({"depth": 10**9}, "parameters .*more than the limit of"),
        ({"embed_dim": 10**6}, "parameters .*more than the limit of"),
        ({"img_size": 10**6}, "parameters .*more than the limit of"),
        ({"num_registers": 10**8}, "parameters .*more than the limit of"),
        ({"num_classes": 10**10}, "parameters .*more than the limit of"),
        ({"mlp_ratio": 1e7}, "parameters .*more than the limit of"),
        ({"whole": [1, 2]}, "must be a mapping of field names to values, not list"),
        ({"depth": "12"}, r"depth = '12' has the wrong type: expected int"),
        ({"mlp_ratio": math.nan}, "mlp_ratio must be a positive finite number, got nan"),
        ({"depth": -3}, "depth must be positive"),
        ({"mlp_ratio": -1.0}, "mlp_ratio must be a positive finite number"),
        ({"norm_eps": math.inf}, "norm_eps must be a positive finite number"),
        ({"rope_ref_grid": [0, 3]}, "rope_ref_grid sides must be positive"),
    ],
)
def test_every_malformed_config_json_is_a_config_error_naming_the_file(
    model_dir, no_model_built, changes, message
):
    edit_config(model_dir, **changes)
    for load in (
        lambda: vit5.load_model(model_dir),
        lambda: vit5.create_model("vit5_tiny", pretrained=model_dir),
    ):
        with pytest.raises(vit5.ConfigError, match=message) as caught:
            load()
        assert str(model_dir / "config.json") in str(caught.value)


def test_the_config_json_must_describe_its_own_weights(model_dir):
    edit_config(model_dir, depth=3)  # within the size limit, but not the model these weights are
    stored = json.loads((model_dir / "config.json").read_text())["model_args"]
    described = parameter_count(vit5.ViT5Config.from_dict(stored))  # the formula, no model built
    held = sum(
        p.numel()
        for p in vit5.create_model(
            "vit5_tiny", depth=2, embed_dim=48, num_heads=2, img_size=16, patch_size=8
        ).parameters()
    )
    with pytest.raises(
        vit5.ConfigError,
        match=f"describes a model of {described:,} parameters, but model.safetensors holds {held:,}",
    ):
        vit5.load_model(model_dir)


def test_naming_another_family_than_the_directory_holds_is_an_error(tmp_path):
    vit5.save_pretrained(vit5.create_model("vit5_tiny", depth=2), tmp_path)
    with pytest.raises(
        vit5.CheckpointError, match=r"holds a vit5_tiny, not a deit3_tiny: norm='rmsnorm'"
    ):
        vit5.create_model("deit3_tiny", pretrained=tmp_path)
    assert vit5.create_model("vit5_tiny", pretrained=tmp_path).cfg.norm == "rmsnorm"
    ablated = (
        tmp_path / "ablated"
    )  # an ablation of the family (no registers) still loads under its name
    vit5.save_pretrained(vit5.create_model("vit5_tiny", depth=2, num_registers=0), ablated)
    assert vit5.create_model("vit5_tiny", pretrained=ablated).cfg.num_registers == 0


@pytest.mark.parametrize("switches", [{}, {"mlp": "swiglu", "num_kv_heads": 1}])
def test_memory_estimates_are_lower_bounds_of_measured_cpu_peaks(switches):
    import torch
    import torch.nn.functional as F

    from vit5.bench.measure import measure_memory
    from vit5.model.footprint import training_bytes

    model = vit5.create_model(
        "vit5_tiny", depth=2, img_size=64, patch_size=8, num_classes=10, **switches
    )
    images, labels = torch.randn(4, 3, 64, 64), torch.arange(4) % 10
    with torch.no_grad():
        forward, _ = measure_memory(lambda: model(images))
    assert forward.peak / 2 < activation_bytes(model.cfg, batch=4) <= forward.peak
    optimizer = torch.optim.AdamW(model.parameters())

    def step() -> None:
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # allocates the two moments
    reading, _ = measure_memory(step)
    alive_before = (
        3 * 4 * sum(p.numel() for p in model.parameters())
    )  # weights and moments, float32
    total = reading.peak + alive_before
    assert total / 2 < training_bytes(model.cfg, batch=4, ema=False) <= total
