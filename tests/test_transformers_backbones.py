"""transformers backbones as ``transformers:`` model specs: tiny random models saved offline with
``save_pretrained``, their recorded attention against transformers' own eager
``output_attentions=True``, their features against its ``hidden_states``, the token layout,
the errors, and ``vit5 viz attention`` / ``vit5 eval features`` end to end (through the command's
own entry point, in this process; the offline hub id through ``python -m vit5``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from viz_support import smooth_rgb, write_png

from vit5.cli import main as vit5_main
from vit5.errors import InputError
from vit5.eval.common import dense_features
from vit5.introspect.load import load_spec
from vit5.viz.collect import capture

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    patch_size=8,
)
SIZED = dict(SMALL, image_size=32)
CONFIGS = {
    "dinov2": lambda: transformers.Dinov2Config(**SIZED),
    "dinov2reg": lambda: transformers.Dinov2WithRegistersConfig(num_register_tokens=4, **SIZED),
    "dinov3": lambda: transformers.DINOv3ViTConfig(num_register_tokens=4, **SIZED),
    "vit": lambda: transformers.ViTConfig(**SIZED),
    "siglip": lambda: transformers.SiglipVisionConfig(**SIZED),
    "siglip2": lambda: transformers.Siglip2VisionConfig(num_patches=16, **SMALL),
}
HEADS = {
    "vit_head": lambda: transformers.ViTForImageClassification(
        transformers.ViTConfig(num_labels=3, id2label={0: "a", 1: "b", 2: "c"}, **SIZED)
    ),
    "dinov2_head": lambda: transformers.Dinov2ForImageClassification(
        transformers.Dinov2Config(num_labels=3, **SIZED)
    ),
}
# registers, CLS
LAYOUTS = {
    "dinov2": (0, True),
    "dinov2reg": (4, True),
    "dinov3": (4, True),
    "vit": (0, True),
    "siglip": (0, False),
    "siglip2": (0, False),
}
HW = (32, 40)  # not the 32x32 the models were built for


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    out = {}
    torch.manual_seed(0)
    for name, make in CONFIGS.items():
        model = transformers.AutoModel.from_config(make())
        model.save_pretrained(root / name)
        out[name] = root / name
    for name, make in HEADS.items():
        make().save_pretrained(root / name)
        out[name] = root / name
    return out


def _eager(folder: Path):
    return transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()


def _inputs(name: str, x: torch.Tensor) -> dict:
    """transformers' own inputs for ``x``: SigLIP 2 patchified by its image processor's
    function."""
    if name != "siglip2":
        extra = {"interpolate_pos_encoding": True} if name in ("vit", "siglip") else {}
        return {"pixel_values": x, **extra}
    from transformers.models.siglip2.image_processing_siglip2 import convert_image_to_patches

    patches = torch.stack([convert_image_to_patches(image, 8) for image in x])
    grid = torch.tensor([[HW[0] // 8, HW[1] // 8]] * len(x))
    mask = torch.ones(patches.shape[:2], dtype=torch.long)
    return {"pixel_values": patches, "pixel_attention_mask": mask, "spatial_shapes": grid}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_recorded_attention_equals_eager_layer_by_layer(folders, name):
    loaded = load_spec(f"transformers:{folders[name]}", require="recording")
    hf = loaded.model.hf
    assert hf.config._attn_implementation == "vit5_sdpa"  # the fused path is kept
    x = torch.randn(2, 3, *HW)
    with torch.no_grad(), capture(loaded.model, info=loaded.info) as rec:
        tokens = loaded.model.forward_features(x)
    with torch.no_grad():
        eager = _eager(folders[name])(**_inputs(name, x), output_attentions=True)
    torch.testing.assert_close(tokens, eager.last_hidden_state, atol=1e-5, rtol=1e-5)
    assert sorted(rec.attentions) == [0, 1]
    for i, expected in enumerate(eager.attentions):
        got = rec.attention(i)
        assert got.shape == expected.shape
        assert (got - expected).abs().max() < 1e-5
    registers, has_cls = LAYOUTS[name]
    assert rec.layout.num_registers == registers and bool(rec.layout.num_cls) == has_cls
    assert rec.layout.grid == (4, 5) and rec.layout.registers_first


@pytest.mark.parametrize("name", list(CONFIGS))
def test_features_equal_hidden_states(folders, name):
    loaded = load_spec(f"transformers:{folders[name]}", require="vit")
    info = loaded.info
    x = torch.randn(2, 3, *HW)
    with torch.no_grad():
        eager = _eager(folders[name])
        out = eager(**_inputs(name, x), output_hidden_states=True)
        final_norm = loaded.model.norm
        # hidden_states[i + 1] is layer i's output before the final layernorm
        assert not torch.allclose(out.hidden_states[-1], out.last_hidden_state)
        torch.testing.assert_close(final_norm(out.hidden_states[-1]), out.last_hidden_state)
    prefix = info.num_cls + info.num_registers
    for norm in (False, True):
        feats = dense_features(loaded.model, x, info, [0, 1], norm=norm)
        for block in (0, 1):
            hidden = out.hidden_states[block + 1]
            if norm:
                hidden = final_norm(hidden)
            patches = hidden[:, prefix:].transpose(1, 2).reshape(2, 32, 4, 5)
            torch.testing.assert_close(feats[f"blocks.{block}.patches"], patches)
            if info.num_cls:
                torch.testing.assert_close(feats[f"blocks.{block}.cls"], hidden[:, 0])
            if info.num_registers:
                registers = feats[f"blocks.{block}.registers"]
                torch.testing.assert_close(registers, hidden[:, 1:prefix])


def test_description_and_preprocessing(folders, tmp_path):
    loaded = load_spec(f"transformers:{folders['dinov2reg']}")
    info = loaded.info
    assert (info.family, info.name, info.depth, info.embed_dim) == (
        "transformers",
        "Dinov2WithRegistersModel",
        2,
        32,
    )
    assert (info.num_heads, info.patch_size, info.num_registers) == (4, 8, 4)
    assert info.registers_first and info.has_cls and info.dynamic_size
    assert loaded.mean == (0.485, 0.456, 0.406)
    assert "ImageNet mean/std (no preprocessor_config.json" in loaded.description
    folder = tmp_path / "with_processor"
    transformers.AutoModel.from_config(CONFIGS["siglip"]()).save_pretrained(folder)
    processor = {
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "size": {"shortest_edge": 40},
        "crop_size": {"height": 32, "width": 32},
        "do_center_crop": True,
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    loaded = load_spec(f"transformers:{folder}")
    assert loaded.mean == (0.5, 0.5, 0.5) and loaded.std == (0.5, 0.5, 0.5)
    assert loaded.input_size == (32, 32) and loaded.crop_pct == pytest.approx(0.8)
    assert "ImageNet" not in loaded.description
    assert not loaded.info.has_cls and loaded.info.num_registers == 0


@pytest.mark.parametrize("name", list(HEADS))
def test_classification_heads_give_transformers_logits(folders, name):
    loaded = load_spec(f"transformers:{folders[name]}")
    x = torch.randn(2, 3, 32, 32)
    hf = transformers.AutoModelForImageClassification.from_pretrained(folders[name]).eval()
    with torch.no_grad():
        expected = hf(pixel_values=x).logits
        torch.testing.assert_close(loaded.model(x), expected)
        tokens = loaded.model.forward_features(x)
        torch.testing.assert_close(loaded.model.forward_head(tokens), expected)
    assert loaded.model.num_classes == 3
    if name == "vit_head":
        assert loaded.class_names == ("a", "b", "c")


def test_pickle_only_folder_is_refused(folders, tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text((folders["vit"] / "config.json").read_text())
    torch.save({}, folder / "pytorch_model.bin")
    refused = "only pickle weights .pytorch_model.bin.*safetensors only"
    with pytest.raises(InputError, match=refused):
        load_spec(f"transformers:{folder}")


def test_unknown_architecture_names_the_supported_ones(tmp_path):
    folder = tmp_path / "bert"
    config = transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
    )
    transformers.BertModel(config).save_pretrained(folder)
    names = "a BertModel model; supported are Dinov2Model, .*SiglipVision"
    with pytest.raises(InputError, match=names):
        load_spec(f"transformers:{folder}")


def test_missing_folder_and_options_it_cannot_take(folders, tmp_path):
    with pytest.raises(InputError, match="no such folder"):
        load_spec(f"transformers:{tmp_path / 'nothing' / 'here'}")
    with pytest.raises(InputError, match="takes no --model-args .depth"):
        load_spec(f"transformers:{folders['vit']}", {"depth": 3})
    with pytest.raises(InputError, match="no separate EMA weights"):
        load_spec(f"transformers:{folders['vit']}", use_ema=True)


def test_missing_transformers_is_one_clear_error(folders, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(InputError, match=r"pip install 'vit5\[transformers\]'"):
        load_spec(f"transformers:{folders['vit']}")


def _run(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT), **(env or {})}
    cmd = [sys.executable, "-m", "vit5", *args]
    return subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_hub_id_offline_names_the_folder_form(tmp_path):
    env = {"HF_HOME": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"}
    spec = "transformers:facebook/dinov2-small"
    args = ["eval", "features", "--model", spec, "--images", str(tmp_path)]
    proc = _run([*args, "--out", str(tmp_path / "o")], env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: cannot load transformers:facebook/dinov2")
    assert "save_pretrained" in lines[0] and "transformers:/path/to/folder" in lines[0]


@pytest.fixture
def images(tmp_path) -> Path:
    write_png(tmp_path / "imgs" / "a.png", smooth_rgb(40, 48, 1))
    write_png(tmp_path / "imgs" / "b.png", smooth_rgb(40, 48, 2))
    return tmp_path / "imgs"


@pytest.mark.parametrize("name", ["dinov3", "siglip2"])
def test_viz_attention_end_to_end(folders, images, tmp_path, name):
    out = tmp_path / "viz"
    args = ["viz", "attention", "--model", f"transformers:{folders[name]}", "--images", str(images)]
    assert (
        vit5_main([*args, "--out", str(out), "--size", "32x40", "--quiet", "--formats", "png"]) == 0
    )
    pngs = sorted(p.name for p in out.rglob("*.png"))
    assert pngs and all(p.stat().st_size > 1000 for p in out.rglob("*.png"))


def test_eval_features_end_to_end(folders, images, tmp_path):
    out = tmp_path / "features"
    spec = f"transformers:{folders['dinov2reg']}"
    args = ["eval", "features", "--model", spec, "--images", str(images), "--out", str(out)]
    assert vit5_main([*args, "--size", "32x40", "--layers", "0", "1"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["blocks"] == [0, 1] and len(manifest["images"]) == 2
    from safetensors.torch import load_file

    saved = load_file(str(out / manifest["images"][0]["file"]))
    assert saved["blocks.1.registers"].shape == (4, 32)
    assert saved["blocks.1.patches"].shape == (32, 4, 5)
