"""The presets as timm models: pretrained configs, feature wrappers, backward, FX tracing.

The properties timm's own model tests check (tests/test_models.py of pytorch-image-models), stated
here at tiny sizes: every preset has a pretrained config, ``features_only`` takes timm's keywords,
every parameter gets a gradient, and FX symbolic tracing (torchvision's feature extractor) gives
the eager outputs, in eval and train mode, at any input size. timm sees the presets once the weights
layer is imported (``import vit5.weights``), which is also how timm's own ``train.py`` is given them.
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from timm.models._features import FeatureGetterNet
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

import vit5
import vit5.weights  # registers every preset in timm
from vit5.model.presets import PRESETS

DOCS = Path(__file__).resolve().parents[1] / "docs" / "model.md"

FAMILIES = ("vit5_tiny", "deit3_tiny", "vanilla_vit_tiny")


def tiny_args(name: str) -> dict:
    """A preset at a few thousand parameters, keeping its heads (head_dim 8) and switches."""
    heads = PRESETS[name]["num_heads"]
    return {"depth": 2, "embed_dim": 8 * heads, "img_size": 32, "patch_size": 8}


def randomise(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "gamma" in name or "pos_embed" in name:
                p.normal_(1.0 if "norm" in name else 0.0, 0.5)
    return model


def test_every_preset_has_a_timm_pretrained_config():
    presets = set(PRESETS)
    assert presets <= set(
        timm.list_models("*", name_matches_cfg=True)
    )  # what timm's backward tests collect
    for name in presets:
        cfg = timm.models.get_pretrained_cfg(name).to_dict()
        side = PRESETS[name].get("img_size", 224)
        assert cfg["input_size"] == (3, side, side) and cfg["first_conv"] == "patch_embed.proj"
        assert cfg["classifier"] == "head" and (cfg["crop_pct"], cfg["interpolation"]) == (
            1.0,
            "bicubic",
        )


@pytest.mark.parametrize("name", FAMILIES)
def test_features_only_takes_timms_keywords(name):
    x = torch.randn(1, 3, 32, 48)
    getter = timm.create_model(
        name, features_only=True, feature_cls="getter", out_indices=(0, 1), **tiny_args(name)
    )
    assert isinstance(getter, FeatureGetterNet)
    assert [f.shape for f in getter(x)] == [(1, getter.feature_info.channels()[0], 4, 6)] * 2
    args = {**tiny_args(name), "depth": 4}
    default = timm.create_model(
        name, features_only=True, feature_cfg={"feature_cls": "getter"}, **args
    )
    assert len(default(x)) == 3 and default.feature_info.reduction() == [
        8,
        8,
        8,
    ]  # as timm's ViTs: the last 3
    _, intermediates = default.model.forward_intermediates(x, indices=[1, 2, 3])
    for got, want in zip(default(x), intermediates):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_trains_every_parameter(name):
    model = timm.create_model(name, pretrained=False, num_classes=42, **tiny_args(name)).train()
    out = model(torch.randn(2, 3, 32, 32))
    out.mean().backward()
    assert out.shape == (2, 42) and not out.isnan().any()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []


@pytest.mark.parametrize("name", FAMILIES)
def test_fx_feature_extraction_matches_eager_at_any_size(name):
    model = randomise(timm.create_model(name, num_classes=5, **tiny_args(name))).eval()
    nodes = get_graph_node_names(model)[1]
    assert (
        "patch_embed.checked_images" in nodes
    )  # input checks are one recorded call, not traced control flow
    extractor = create_feature_extractor(
        model, return_nodes={"blocks.0": "block0", "head": "logits"}
    )
    for size in ((32, 32), (48, 64)):  # traced once, symbolic grid: any patch-multiple size
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            out = extractor(x)
            assert torch.equal(
                out["logits"], model(x)
            )  # the same computation, not merely close (as timm checks)
            n_tokens = model.num_prefix_tokens + model.num_reg_tokens + size[0] // 8 * size[1] // 8
            assert out["block0"].shape == (2, n_tokens, model.embed_dim)
    with pytest.raises(ValueError, match="not a positive multiple of the patch size 8"):
        extractor(torch.randn(1, 3, 36, 32))  # the traced graph still checks its input


@pytest.mark.parametrize("name", FAMILIES)
def test_fx_traced_training_graph_backpropagates_to_every_parameter(name):
    model = timm.create_model(name, num_classes=42, **tiny_args(name)).train()
    train_nodes, _ = get_graph_node_names(model)
    traced = create_feature_extractor(
        model, train_return_nodes=[train_nodes[-1]], eval_return_nodes=[train_nodes[-1]]
    )
    out = next(iter(traced(torch.randn(2, 3, 32, 32)).values()))
    out.mean().backward()
    assert out.shape == (2, 42)
    assert [n for n, p in traced.named_parameters() if p.grad is None] == []


def test_fx_tracing_leaves_the_rope_table_cache_alone():
    model = vit5.create_model("vit5_tiny", **tiny_args("vit5_tiny")).eval()
    create_feature_extractor(model, return_nodes=["head"])
    assert all(isinstance(t, torch.Tensor) for tables in model._rope_cache.values() for t in tables)


TIMM_TRAIN_STAND_IN = """
import argparse
import torch
from timm.models import create_model  # as timm's train.py imports it

parser = argparse.ArgumentParser()
parser.add_argument("--model")
args, _ = parser.parse_known_args()
model = create_model(args.model, num_classes=3, img_size=32, depth=1)
print(type(model).__name__, tuple(model(torch.randn(1, 3, 32, 32)).shape))
"""


def test_the_documented_line_gives_timms_train_py_the_presets(tmp_path):
    """docs/model.md's one line that runs timm's own train.py with the presets registered, run here
    on a stand-in train.py that builds its model as timm's does."""
    line = next(line for line in DOCS.read_text().splitlines() if "runpy.run_path" in line)
    argv = shlex.split(line.strip())
    assert argv[:2] == ["python", "-c"] and "--model" in argv
    (tmp_path / "train.py").write_text(TIMM_TRAIN_STAND_IN)
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, *argv[1:]],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": root},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ViT5", "(1,", "3)"]
