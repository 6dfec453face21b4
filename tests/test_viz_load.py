"""Model specs: presets, checkpoint directories and run directories, official .pth files, timm names with
checkpoints."""

import pytest
import timm
import torch
from safetensors.torch import save_file
from viz_support import tiny_timm

import vit5
from vit5.errors import InputError
from vit5.introspect.load import load_spec
from vit5.reference import OfficialViT5
from vit5.viz import parse_overrides

TINY = dict(depth=1, img_size=32, patch_size=8)


def _same_output(a, b):
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        torch.testing.assert_close(a(x), b(x))


def test_preset_with_overrides_is_random_and_labelled():
    overrides = parse_overrides(["depth=1", "img_size=32", "patch_size=8", "norm=layernorm"])
    loaded = load_spec("vit5_tiny", overrides, random_init=True)
    assert loaded.random_init and "RANDOM INIT" in loaded.description and not loaded.model.training
    assert loaded.label == "vit5_tiny-random-init"  # every table and figure title shows it
    assert loaded.model.cfg.depth == 1 and loaded.model.cfg.norm == "layernorm"
    with pytest.raises(InputError, match="not KEY=VALUE"):
        parse_overrides(["depth"])
    with pytest.raises(InputError, match="no EMA weights"):
        load_spec("vit5_tiny", TINY, use_ema=True, random_init=True)
    with pytest.raises(InputError, match="vit5_tiny has no released weights .* --random-init"):
        load_spec("vit5_tiny", TINY)  # a name means its pretrained weights, as in timm
    with pytest.raises(
        InputError,
        match="--random-init asks for an untrained model, but vit5_tiny@w.pth names weights",
    ):
        load_spec("vit5_tiny@w.pth", TINY, random_init=True)


def test_checkpoint_directory_run_directory_and_preset_with_weights(tmp_path):
    model = vit5.create_model("vit5_tiny", **TINY).eval()
    vit5.save_pretrained(model, tmp_path / "run" / "model")
    direct = load_spec(str(tmp_path / "run" / "model"))
    run = load_spec(str(tmp_path / "run"))  # a run directory with one checkpoint directory in it
    assert (
        not direct.random_init and run.label == direct.label == "run-model"
    )  # generic folder names get the run's
    _same_output(direct.model, model)
    _same_output(run.model, model)
    vit5.save_pretrained(model, tmp_path / "run" / "other")
    with pytest.raises(InputError, match="several checkpoint directories"):
        load_spec(str(tmp_path / "run"))
    vit5.save_pretrained(
        model, tmp_path / "run" / "final"
    )  # a training run: final/ is the one meant
    assert load_spec(str(tmp_path / "run")).label == "run-final"


def test_official_pth(tmp_path):
    ref = OfficialViT5(
        img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=2, num_classes=3
    ).eval()
    torch.save({"model": ref.state_dict()}, tmp_path / "official.pth")
    loaded = load_spec(str(tmp_path / "official.pth"))
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x), ref(x), rtol=1e-4, atol=1e-4)


def test_timm_name_with_a_local_checkpoint_loads_strictly(tmp_path):
    source = tiny_timm(reg_tokens=4)
    save_file(source.state_dict(), str(tmp_path / "w.safetensors"))
    args = dict(
        depth=2,
        embed_dim=64,
        num_heads=2,
        img_size=32,
        patch_size=8,
        num_classes=0,
        reg_tokens=4,
        no_embed_class=True,
        qk_norm=True,
    )
    loaded = load_spec(f"timm:vit_small_patch16_224@{tmp_path / 'w.safetensors'}", args)
    assert loaded.model.dynamic_img_size and not loaded.random_init  # any patch-multiple size works
    _same_output(loaded.model, source)
    with pytest.raises(InputError, match="does not fit timm model"):
        load_spec(
            f"timm:vit_small_patch16_224@{tmp_path / 'w.safetensors'}", {**args, "reg_tokens": 0}
        )
    with pytest.raises(InputError, match="does not exist"):
        load_spec("timm:vit_small_patch16_224@missing.pth")


def test_timm_dinov2_in_metas_own_key_layout_goes_through_the_models_filter(tmp_path):
    source = timm.create_model(
        "vit_small_patch14_reg4_dinov2",
        pretrained=False,
        depth=1,
        img_size=56,
        dynamic_img_size=True,
    ).eval()
    meta = {k: v.clone() for k, v in source.state_dict().items()}
    meta["register_tokens"] = meta.pop(
        "reg_token"
    )  # facebookresearch/dinov2 names, mask token, CLS row in pos_embed
    meta["mask_token"] = torch.zeros(1, 384)
    meta["pos_embed"] = torch.cat([torch.zeros(1, 1, 384), meta["pos_embed"]], 1)
    torch.save(meta, tmp_path / "dinov2_vits14_reg4.pth")
    loaded = load_spec(
        f"timm:vit_small_patch14_reg4_dinov2@{tmp_path / 'dinov2_vits14_reg4.pth'}",
        {"depth": 1, "img_size": 56},
    )
    x = torch.randn(1, 3, 56, 84)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model.forward_features(x), source.forward_features(x))


def test_a_loaded_model_carries_its_description_made_once():
    from vit5.introspect import describe

    loaded = load_spec("vit5_tiny", TINY, random_init=True, require="recording")
    assert loaded.info == describe(loaded.model)  # the loader's description is the describer's
    assert loaded.info.recordable and loaded.info.layout((32, 48)).grid == (4, 6)
    assert loaded.preprocessing == loaded.info.preprocessing
    assert loaded.input_size == (32, 32) and loaded.mean == loaded.info.mean


def test_what_a_command_requires_of_its_model_is_checked_at_load():
    cnn = dict(num_classes=3)
    loaded = load_spec("timm:resnet18", cnn, random_init=True)  # classify takes any timm model
    assert loaded.info is None and loaded.input_size == (224, 224)
    with pytest.raises(InputError, match="cannot use a ResNet: supported are vit5 models"):
        load_spec("timm:resnet18", cnn, random_init=True, require="vit")


def test_a_model_request_is_validated_when_built():
    from vit5.introspect.load import ModelRequest

    with pytest.raises(InputError, match="weights='latest' must be one of auto, raw, ema"):
        ModelRequest(specs=("vit5_tiny",), weights="latest")
    with pytest.raises(InputError, match="overrides must be empty or one per spec"):
        ModelRequest(specs=("vit5_tiny", "vit5_small"), overrides=({},))
