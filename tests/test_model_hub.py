"""Weights by name from the Hugging Face Hub, offline: the official releases, hub-ready run dirs, uploads.

Every test runs with HF_HUB_OFFLINE=1 against a cache it lays out itself (tests/hub_support.py):
what a download would have left on disk, and nothing else.
"""

import argparse
import json
from pathlib import Path
from typing import ClassVar

import pytest
import timm
import torch
from hub_support import lay_out_download, lay_out_folder

import vit5
from vit5 import CheckpointError
from vit5.reference import OfficialViT5
from vit5.weights import catalog, publish

OFFICIAL = "FengWang3211/ViT-5"


def randomise(module):
    """Non-trivial norm gains and LayerScale, so a wrong mapping cannot give the same logits."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name or "gamma" in name:
                p.uniform_(0.5, 1.5)
    return module.eval()


@pytest.fixture(scope="module")
def official_small(tmp_path_factory):
    """A full-size vit5_small in the official container: {"model", "args" (a Namespace), "epoch"}."""
    torch.manual_seed(0)
    ref = randomise(OfficialViT5())  # the official defaults: ViT-5-S at 224, 1000 classes
    path = tmp_path_factory.mktemp("official") / "vit5_small_patch16_224.pth"
    args = argparse.Namespace(model="vit5_small", input_size=224, eval_crop_ratio=1.0)
    torch.save({"model": ref.state_dict(), "args": args, "epoch": 799}, path)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        features = ref.forward_features(x)
        return x, ref.head(features), features, path


def tiny(**kw):
    base = {
        "depth": 2,
        "img_size": 32,
        "patch_size": 8,
        "embed_dim": 64,
        "num_heads": 2,
        "num_classes": 5,
    }
    return randomise(vit5.create_model("vit5_tiny", **{**base, **kw}))


# ------------------------------------------------------------------------------------ official weights
def test_released_weights_load_by_name_with_the_official_logits(hf_cache, official_small):
    x, logits, features, path = official_small
    lay_out_download(hf_cache, OFFICIAL, {"vit5_small_patch16_224.pth": path})
    with torch.no_grad():
        by_timm = timm.create_model("vit5_small_patch16_224.in1k", pretrained=True).eval()
        torch.testing.assert_close(by_timm(x), logits, rtol=1e-4, atol=1e-4)
        by_size = vit5.create_model(
            "vit5_small", pretrained=True
        ).eval()  # a size name: its 224 weights
        torch.testing.assert_close(by_size(x), logits, rtol=1e-4, atol=1e-4)
        assert "vit5_small_patch16_224.in1k" in by_size.load_report.path
        inferred = vit5.load_model(
            "vit5_small_patch16_224.in1k"
        ).eval()  # architecture read off the weights
        torch.testing.assert_close(inferred(x), logits, rtol=1e-4, atol=1e-4)
        # timm adapts the head as for its own models; the trunk is the official one
        new_head = timm.create_model("vit5_small", pretrained=True, num_classes=10).eval()
        assert new_head(x).shape == (1, 10)
        torch.testing.assert_close(
            new_head.forward_head(new_head.forward_features(x), pre_logits=True),
            features,
            rtol=1e-4,
            atol=1e-4,
        )
    assert (
        by_timm.pretrained_cfg["hf_hub_id"] == OFFICIAL
        and by_timm.pretrained_cfg["crop_pct"] == 1.0
    )


def test_offline_and_not_cached_is_one_clear_error(hf_cache):
    expected = (
        r"vit5_small_patch16_224.pth of the Hugging Face Hub repo FengWang3211/ViT-5: it is not in the "
        r"cache .* and HF_HUB_OFFLINE is set; fetch it by hand .*hf download FengWang3211/ViT-5 "
        r"vit5_small_patch16_224.pth"
    )
    with pytest.raises(CheckpointError, match=expected):
        vit5.create_model("vit5_small", pretrained=True)
    with pytest.raises(CheckpointError, match=expected):
        timm.create_model("vit5_small_patch16_224.in1k", pretrained=True)
    with pytest.raises(
        CheckpointError, match="vit5_base_patch16_384.pth"
    ):  # the tag picks the file
        vit5.create_model("vit5_base", pretrained="vit5_base_patch16_384.in1k")
    pinned = r"vit5_base_patch16_384.pth of the Hugging Face Hub repo FengWang3211/ViT-5 \(revision abc\)"
    with pytest.raises(
        CheckpointError, match=pinned
    ):  # revision= goes to the download, not the config
        vit5.create_model("vit5_base", pretrained="vit5_base_patch16_384.in1k", revision="abc")


def test_unknown_names_list_the_released_weights():
    known = "vit5_small_patch16_224.in1k, vit5_base_patch16_224.in1k, vit5_base_patch16_384.in1k"
    with pytest.raises(
        CheckpointError, match=f"unknown pretrained weights 'vit5_small_patch16_224.in21k'.*{known}"
    ):
        vit5.create_model("vit5_small", pretrained="vit5_small_patch16_224.in21k")
    with pytest.raises(
        CheckpointError, match=f"unknown pretrained tag 'in21k' for vit5_small_patch16_224.*{known}"
    ):
        timm.create_model("vit5_small_patch16_224.in21k")
    with pytest.raises(CheckpointError, match=f"vit5_tiny has no released weights.*{known}"):
        vit5.create_model("vit5_tiny", pretrained=True)
    with pytest.raises(
        CheckpointError,
        match=r"holds a vit5_base_patch16_384 .*create_model\('vit5_base_patch16_384'",
    ):
        vit5.create_model("vit5_small", pretrained="vit5_base_patch16_384.in1k")


@pytest.mark.parametrize("content", [b"PK\x03\x04 truncated download", b"junk"])
def test_a_damaged_cached_file_names_its_path_and_says_to_delete_it(hf_cache, content):
    lay_out_download(hf_cache, OFFICIAL, {"vit5_small_patch16_224.pth": content})
    snapshot = next(hf_cache.rglob("vit5_small_patch16_224.pth"))
    fix = rf"{snapshot}.* is a cached download from the Hugging Face Hub; .*delete {snapshot} and the blob"
    with pytest.raises(CheckpointError, match=rf"not a readable PyTorch checkpoint[\s\S]*{fix}"):
        vit5.create_model("vit5_small", pretrained=True)
    with pytest.raises(CheckpointError, match=rf"not a readable PyTorch checkpoint[\s\S]*{fix}"):
        timm.create_model("vit5_small_patch16_224.in1k", pretrained=True)


def test_every_release_has_a_timm_pretrained_config():
    assert timm.list_pretrained("vit5*") == sorted(catalog.RELEASES)
    for name, release in catalog.RELEASES.items():
        cfg = timm.models.get_pretrained_cfg(name).to_dict()
        size = release.img_size
        assert (
            cfg["hf_hub_id"] == OFFICIAL and cfg["hf_hub_filename"] == f"{name.split('.')[0]}.pth"
        )
        assert cfg["input_size"] == (3, size, size) and name.split(".")[0].endswith(str(size))
        assert (cfg["crop_pct"], cfg["interpolation"], cfg["num_classes"]) == (1.0, "bicubic", 1000)
        assert cfg["mean"] == (0.485, 0.456, 0.406) and cfg["std"] == (0.229, 0.224, 0.225)
        assert cfg["license"] == "apache-2.0" and cfg["paper_ids"] == "arXiv:2602.08071"


# ------------------------------------------------------------------------------------ hub-ready run dirs
def test_a_saved_run_is_what_timm_and_vit5_read_from_the_hub(hf_cache, tmp_path):
    model = tiny(num_registers=1, global_pool="avg")
    ema = {k: v + 0.01 for k, v in model.state_dict().items()}
    vit5.save_pretrained(model, tmp_path / "run", ema_state_dict=ema, extra={"epoch": 3})
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (
        config["architecture"] == "vit5_tiny"
        and config["num_classes"] == 5
        and config["epoch"] == 3
    )
    assert config["model_args"]["embed_dim"] == 64 and config["pretrained_cfg"]["input_size"] == [
        3,
        32,
        32,
    ]
    lay_out_folder(hf_cache, "someone/tiny-vit5", tmp_path / "run")
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(vit5.load_model("hf-hub:someone/tiny-vit5")(x), expected)
        via_timm = timm.create_model("hf-hub:someone/tiny-vit5", pretrained=True).eval()
        torch.testing.assert_close(via_timm(x), expected)
        torch.testing.assert_close(
            timm.create_model(f"local-dir:{tmp_path / 'run'}", pretrained=True).eval()(x), expected
        )
        ema_model = vit5.load_model("hf-hub:someone/tiny-vit5", use_ema=True)
        torch.testing.assert_close(ema_model.pos_embed, ema["pos_embed"])
    assert timm.data.resolve_model_data_config(via_timm)["input_size"] == (3, 32, 32)


def test_a_config_json_without_the_hub_layout_is_one_clear_error(tmp_path):
    model = tiny()
    vit5.save_pretrained(model, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"config": model.cfg.to_dict(), "epoch": 1}))
    with pytest.raises(
        CheckpointError, match=r"config.json is corrupt or not a vit5 config .*architecture"
    ):
        vit5.load_model(tmp_path)


def test_a_revision_pins_the_weights(hf_cache):
    first, second = tiny(), tiny()
    folders = []
    for i, m in enumerate((first, second)):
        folders.append(vit5.save_pretrained(m, hf_cache.parent / f"push{i}"))
    old = lay_out_folder(hf_cache, "someone/tiny-vit5", folders[0])
    lay_out_folder(hf_cache, "someone/tiny-vit5", folders[1])  # main now points here
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(vit5.load_model("hf-hub:someone/tiny-vit5")(x), second(x))
        torch.testing.assert_close(vit5.load_model(f"hf-hub:someone/tiny-vit5@{old}")(x), first(x))
        torch.testing.assert_close(
            vit5.load_model("hf-hub:someone/tiny-vit5", revision=old)(x), first(x)
        )
        pinned = timm.create_model(f"hf-hub:someone/tiny-vit5@{old}", pretrained=True).eval()
        torch.testing.assert_close(pinned(x), first(x))


@pytest.mark.parametrize(
    "files,message",
    [
        (
            {
                "config.json": json.dumps(
                    {"model_type": "vit", "architectures": ["ViTForImageClassification"]}
                ),
                "model.safetensors": b"",
            },
            "transformers ViTForImageClassification \\(model_type 'vit'\\), not a vit5 / timm",
        ),
        (
            {
                "config.json": json.dumps({"architecture": "resnet18", "num_classes": 1000}),
                "model.safetensors": b"",
            },
            "the timm model 'resnet18', not a vit5 model: load it with timm.create_model",
        ),
        (
            {"README.md": "# a dataset card"},
            "cannot load config.json of the Hugging Face Hub repo someone/other",
        ),
    ],
)
def test_a_hub_repo_that_is_not_a_vit5_model_says_what_it_found(hf_cache, files, message):
    lay_out_download(
        hf_cache,
        "someone/other",
        {k: v.encode() if isinstance(v, str) else v for k, v in files.items()},
    )
    with pytest.raises(CheckpointError, match=message):
        vit5.load_model("hf-hub:someone/other")


def test_a_damaged_cached_run_names_the_file_to_delete(hf_cache, tmp_path):
    vit5.save_pretrained(tiny(), tmp_path / "run")
    (tmp_path / "run" / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    lay_out_folder(hf_cache, "someone/damaged", tmp_path / "run")
    with pytest.raises(
        CheckpointError,
        match=r"model.safetensors is corrupt or truncated[\s\S]*delete .*model.safetensors",
    ):
        vit5.load_model("hf-hub:someone/damaged")


# ------------------------------------------------------------------------------------ uploads
class FakeHfApi:
    """Stands in for huggingface_hub.HfApi: records the calls and keeps a copy of the uploaded folder."""

    calls: ClassVar[list] = []
    uploaded: ClassVar[dict] = {}
    has_card = False

    def __init__(self, token=None, library_name=None):
        self.calls.append(("init", token, library_name))

    def create_repo(self, repo_id, private=None, exist_ok=False):
        self.calls.append(("create_repo", repo_id, private, exist_ok))
        return argparse.Namespace(repo_id=repo_id)

    def file_exists(self, repo_id, filename, revision=None):
        return self.has_card and filename == "README.md"

    def upload_folder(
        self,
        repo_id,
        folder_path,
        revision=None,
        commit_message=None,
        create_pr=False,
        ignore_patterns=None,
    ):
        self.calls.append(("upload_folder", repo_id, revision, commit_message, create_pr))
        files = {p.name: p.read_bytes() for p in Path(folder_path).iterdir()}
        FakeHfApi.uploaded = {k: v for k, v in files.items() if k not in (ignore_patterns or [])}
        return "commit-info"


@pytest.fixture
def fake_api(monkeypatch):
    FakeHfApi.calls, FakeHfApi.uploaded, FakeHfApi.has_card = [], {}, False
    monkeypatch.setattr(publish, "HfApi", FakeHfApi)
    return FakeHfApi


def test_push_to_hub_uploads_what_hf_hub_loads_back(hf_cache, tmp_path, fake_api):
    model = tiny()
    assert (
        vit5.push_to_hub(model, "someone/pushed", commit_message="first", private=True, token="t")
        == "commit-info"
    )
    assert ("create_repo", "someone/pushed", True, True) in fake_api.calls
    assert ("upload_folder", "someone/pushed", None, "first", False) in fake_api.calls
    assert sorted(fake_api.uploaded) == ["README.md", "config.json", "model.safetensors"]
    card = fake_api.uploaded["README.md"].decode()
    assert "library_name: timm" in card and 'vit5.load_model("hf-hub:someone/pushed")' in card
    lay_out_download(hf_cache, "someone/pushed", fake_api.uploaded)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(vit5.load_model("hf-hub:someone/pushed")(x), model(x))
        torch.testing.assert_close(
            timm.create_model("hf-hub:someone/pushed", pretrained=True).eval()(x), model(x)
        )


def test_push_a_checkpoint_directory_keeps_its_ema_and_an_existing_card(tmp_path, fake_api):
    model = tiny()
    run = tmp_path / "runs" / "final"
    ema = {k: v * 0 for k, v in model.state_dict().items()}
    vit5.save_pretrained(model, run, ema_state_dict=ema, extra={"step": 7})
    fake_api.has_card = True
    vit5.push_to_hub(run, "someone/run")
    assert sorted(fake_api.uploaded) == [
        "config.json",
        "model.safetensors",
        "model_ema.safetensors",
    ]
    assert json.loads(fake_api.uploaded["config.json"])["step"] == 7
    with pytest.raises(CheckpointError, match="not a vit5 checkpoint directory"):
        torch.save(model.state_dict(), tmp_path / "w.pth")
        vit5.push_to_hub(tmp_path / "w.pth", "someone/run")


# ------------------------------------------------------------------------------------ fine-tuning
def test_released_weights_fine_tune_at_the_recipes_patch_size(hf_cache, official_small):
    """`vit5 train model.name=vit5_small model.pretrained=vit5_small_patch16_224.in1k
    model.img_size=32` on the default recipe (its model.overrides.patch_size=8): the patch
    embedding is resampled 16 -> 8, the APE 14x14 -> 4x4, and the report says so."""
    from vit5.train import TrainConfigError
    from vit5.train.config import ModelSection
    from vit5.train.modeling import build_model

    _, _, _, path = official_small
    lay_out_download(hf_cache, OFFICIAL, {"vit5_small_patch16_224.pth": path})
    released = "vit5_small_patch16_224.in1k"
    cfg = ModelSection(
        name="vit5_small", img_size=32, pretrained=released, overrides={"patch_size": 8}
    )
    model, description, report = build_model(cfg, num_classes=10)
    assert model.patch_embed.proj.weight.shape == (384, 3, 8, 8)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert "patch_embed.proj.weight 16x16 -> 8x8" in report and "pos_embed 14x14 -> 4x4" in report
    assert "[patch_size=8]" in description  # the override, named beside the model
    narrow = ModelSection(
        name="vit5_small",
        img_size=32,
        pretrained=released,
        overrides={"patch_size": 8, "embed_dim": 192, "num_heads": 3},
    )
    fix = (
        r"built with embed_dim=192, num_heads=3: the weights hold embed_dim=384, num_heads=6[\s\S]*"
        r"In the training config, set model\.overrides\.embed_dim=384 model\.overrides\.num_heads=6"
    )
    with pytest.raises(TrainConfigError, match=fix):
        build_model(narrow, num_classes=10)
