"""Dense-feature extraction: round trip against the model, timm ViTs, sizes, resume, bad files."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import pytest
import timm
import torch
from eval_helpers import random_rgb, tiny_model
from safetensors.torch import load_file

import vit5.eval.features as export_module
from vit5.data import decode_image, resize_transform
from vit5.errors import InputError
from vit5.eval import (
    FeatureSettings,
    export_features,
    iter_features,
    read_features,
    read_manifest,
)
from vit5.eval.common import own_size

SIZES = {
    "a.png": (40, 50),
    "sub/b.png": (40, 50),
    "sub/deeper/c.jpg": (64, 48),
    "d.png": (33, 70),
    "e.png": (40, 50),
}


@pytest.fixture
def images(tmp_path) -> Path:
    root = tmp_path / "images"
    for i, (name, (h, w)) in enumerate(SIZES.items()):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(root / name), random_rgb(h, w, seed=i))
    (root / "empty.png").write_bytes(b"")
    (root / "sub" / "notes.jpg").write_text("not an image")
    return root


def _reference(model, path: Path, size: tuple[int, int], blocks: list[int], norm: bool):
    x = resize_transform(size)(decode_image(path))[None]
    with torch.no_grad():
        return model.forward_intermediates(
            x, indices=blocks, return_prefix_tokens=True, norm=norm, intermediates_only=True
        )


def test_written_files_equal_forward_intermediates_at_own_size(images, tmp_path):
    model = tiny_model(depth=3).eval()
    settings = FeatureSettings(layers=(0, -1), batch_size=2)
    summary = export_features(model, images, tmp_path / "out", settings, progress=False)
    assert (summary.written, summary.skipped, len(summary.failed)) == (5, 0, 2)
    manifest = read_manifest(tmp_path / "out")
    assert manifest["complete"] and manifest["blocks"] == [0, 2] and manifest["dtype"] == "float32"
    assert sorted(f["path"] for f in manifest["failed"]) == ["empty.png", "sub/notes.jpg"]
    assert all(f["reason"] for f in manifest["failed"])
    entries = {e["path"]: e for e in manifest["images"]}
    assert set(entries) == set(SIZES)
    for name, (h, w) in SIZES.items():
        entry, size = entries[name], own_size((h, w), 8)
        assert entry["image_size"] == [h, w] and entry["input_size"] == list(size)
        assert entry["grid"] == [size[0] // 8, size[1] // 8]
        saved = load_file(str(tmp_path / "out" / entry["file"]))
        for block, (patches, prefix) in zip(
            [0, 2], _reference(model, images / name, size, [0, 2], norm=False)
        ):
            assert saved[f"blocks.{block}.patches"].shape == (64, size[0] // 8, size[1] // 8)
            torch.testing.assert_close(
                saved[f"blocks.{block}.patches"], patches[0], atol=1e-5, rtol=1e-5
            )
            torch.testing.assert_close(
                saved[f"blocks.{block}.cls"], prefix[0, 0], atol=1e-5, rtol=1e-5
            )
            torch.testing.assert_close(
                saved[f"blocks.{block}.registers"], prefix[0, 1:], atol=1e-5, rtol=1e-5
            )
    assert own_size((33, 70), 8) == (32, 72)


def test_normed_last_block_matches_forward_features_token_layout(images):
    """Independent of forward_intermediates: the final-normed last block is forward_features,
    [CLS|patches|regs]."""
    model = tiny_model().eval()
    path = images / "a.png"
    ((_, feats),) = list(iter_features(model, [path], FeatureSettings(size=(32, 48), norm=True)))
    with torch.no_grad():
        tokens = model.forward_features(resize_transform((32, 48))(decode_image(path))[None])[0]
    torch.testing.assert_close(feats["blocks.1.cls"], tokens[0])
    torch.testing.assert_close(feats["blocks.1.patches"], tokens[1:25].T.reshape(64, 4, 6))
    torch.testing.assert_close(feats["blocks.1.registers"], tokens[25:])


def test_timm_vit_with_registers(images):
    model = timm.create_model(
        "vit_small_patch16_224",
        pretrained=False,
        img_size=32,
        depth=2,
        embed_dim=48,
        num_heads=2,
        reg_tokens=2,
        dynamic_img_size=True,
    ).eval()
    path = images / "sub" / "deeper" / "c.jpg"
    ((_, feats),) = list(iter_features(model, [path], FeatureSettings(size=(48, 32), norm=True)))
    mean, std = model.pretrained_cfg["mean"], model.pretrained_cfg["std"]
    assert mean == (0.5, 0.5, 0.5)  # the model's own normalisation is used, not ImageNet's
    with torch.no_grad():
        x = resize_transform((48, 32), mean=mean, std=std)(decode_image(path))[None]
        tokens = model.forward_features(x)[0]  # timm order [CLS | registers | patches]
    assert set(feats) == {"blocks.1.patches", "blocks.1.cls", "blocks.1.registers"}
    torch.testing.assert_close(feats["blocks.1.cls"], tokens[0])
    torch.testing.assert_close(feats["blocks.1.registers"], tokens[1:3])
    torch.testing.assert_close(feats["blocks.1.patches"], tokens[3:].T.reshape(48, 3, 2))


def test_fixed_size_half_storage_and_iterator_agree(images, tmp_path):
    model = tiny_model().eval()
    for dtype, torch_dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        settings = FeatureSettings(size=(32, 64), dtype=dtype, batch_size=4)
        export_features(model, images, tmp_path / dtype, settings, progress=False)
        from_disk = dict(read_features(tmp_path / dtype))
        with pytest.warns(UserWarning, match="skipping unreadable image"):
            in_memory = dict(
                iter_features(model, images, FeatureSettings(size=(32, 64), batch_size=3))
            )
        assert (
            set(from_disk)
            == {p.resolve() for p in in_memory}
            == {(images / n).resolve() for n in SIZES}
        )
        for path, feats in in_memory.items():
            saved = from_disk[path.resolve()]
            assert saved["blocks.1.patches"].dtype == torch_dtype and saved[
                "blocks.1.patches"
            ].shape == (
                64,
                4,
                8,
            )
            torch.testing.assert_close(
                saved["blocks.1.patches"], feats["blocks.1.patches"].to(torch_dtype), atol=0, rtol=0
            )


def test_max_side_limits_own_size(images):
    model = tiny_model().eval()
    feats = dict(iter_features(model, [images / "sub/deeper/c.jpg"], FeatureSettings(max_side=32)))
    (patches,) = [f["blocks.1.patches"] for f in feats.values()]
    assert patches.shape[1:] == (4, 3)  # 64x48 -> 32x24


def test_resume_after_interruption_finishes_without_redoing_work(images, tmp_path, monkeypatch):
    model = tiny_model().eval()
    settings = FeatureSettings(layers=(-1,), batch_size=2, dtype="float16")
    real_save, calls = export_module.save, []

    def crash_on_fourth(tensors, metadata=None):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real_save(tensors, metadata=metadata)

    monkeypatch.setattr(export_module, "save", crash_on_fourth)
    with pytest.raises(KeyboardInterrupt):
        export_features(model, images, tmp_path / "out", settings, progress=False)
    monkeypatch.setattr(export_module, "save", real_save)
    out = tmp_path / "out"
    assert not read_manifest(out)["complete"]
    done = sorted(out.rglob("*.safetensors"))
    partial = (
        out / "sub" / ".b.png.safetensors.4242.partial"
    )  # what a kill in the middle of writing b.png leaves
    partial.parent.mkdir(exist_ok=True)
    partial.write_bytes(done[0].read_bytes()[:100])
    assert not (out / "sub" / "b.png.safetensors").exists()
    done_before = {p: p.stat().st_mtime_ns for p in out.rglob("*.safetensors")}
    assert len(done_before) == 3

    summary = export_features(model, images, out, settings, progress=False)
    assert (summary.skipped, summary.written, len(summary.failed)) == (3, 2, 2)
    assert not list(out.rglob("*.partial"))
    assert all(p.stat().st_mtime_ns == t for p, t in done_before.items())  # not rewritten
    manifest = read_manifest(out)
    assert manifest["complete"] and manifest["num_images"] == 5
    export_features(model, images, tmp_path / "fresh", settings, progress=False)
    for entry in manifest["images"]:
        resumed, fresh = (
            load_file(str(out / entry["file"])),
            load_file(str(tmp_path / "fresh" / entry["file"])),
        )
        assert resumed.keys() == fresh.keys()
        assert all(torch.equal(resumed[k], fresh[k]) for k in resumed)

    cv2.imwrite(
        str(images / "a.png"), random_rgb(40, 50, seed=99)
    )  # a changed source is recomputed
    again = export_features(model, images, out, settings, progress=False)
    assert (again.skipped, again.written) == (4, 1)


def test_other_settings_are_refused_unless_overwrite(images, tmp_path):
    model = tiny_model().eval()
    export_features(model, images, tmp_path, FeatureSettings(), progress=False)
    with pytest.raises(InputError, match="other settings.*dtype"):
        export_features(model, images, tmp_path, FeatureSettings(dtype="float16"), progress=False)
    other = tiny_model().eval()  # new random weights
    with pytest.raises(InputError, match="model_fingerprint"):
        export_features(other, images, tmp_path, FeatureSettings(), progress=False)
    summary = export_features(
        other, images, tmp_path, FeatureSettings(dtype="float16"), overwrite=True, progress=False
    )
    assert (
        summary.written == 5
        and json.loads((tmp_path / "manifest.json").read_text())["dtype"] == "float16"
    )


def test_bad_settings_are_clear_errors(images):
    model = tiny_model().eval()
    with pytest.raises(InputError, match="not a positive multiple of the patch size 8"):
        list(iter_features(model, images, FeatureSettings(size=(30, 32))))
    with pytest.raises(InputError, match="out of range: this model has 2 blocks"):
        list(iter_features(model, images, FeatureSettings(layers=(5,))))
    with pytest.raises(InputError, match="either a fixed size or max_side"):
        FeatureSettings(size=(32, 32), max_side=64)


def test_plain_export_keeps_its_features_and_run_and_scores_every_image(images, tmp_path):
    """--clean none: the tensors are dense_features' (the path of every earlier export), the run id
    leaves the new settings out, and each image has its artifact score from the viz metrics' rule."""
    from vit5.eval.common import dense_features
    from vit5.eval.outliers import artifact_score
    from vit5.introspect import describe

    model = tiny_model().eval()
    settings = FeatureSettings(layers=(-1,), size=(32, 32), batch_size=1)
    export_features(model, images, tmp_path / "out", settings, progress=False)
    manifest = read_manifest(tmp_path / "out")
    assert manifest["clean"] == "none" and "median" in manifest["artifact_rule"]
    assert "clean" not in manifest["settings"] and "outlier_k" not in manifest["settings"]
    info = describe(model)
    entry = manifest["images"][0]
    stored = load_file(str(tmp_path / "out" / entry["file"]))
    x = resize_transform((32, 32), mean=info.mean, std=info.std)(
        decode_image(images / entry["path"])
    )
    direct = dense_features(model, x[None], info, [info.depth - 1])
    for name, value in direct.items():
        assert stored[name].numpy().tobytes() == value[0].numpy().tobytes()
    with torch.no_grad():
        tokens = model.forward_intermediates(x[None], indices=[-1], intermediates_only=True)[0]
    norms = tokens.flatten(2)[0].norm(dim=0).numpy()  # [P], raw block output
    expected = artifact_score(norms)
    score = entry["artifacts"][f"blocks.{info.depth - 1}"]
    assert score["outlier_share"] == pytest.approx(expected["outlier_share"])
    assert score["max_median"] == pytest.approx(expected["max_median"], rel=1e-5)


def test_drop_outliers_replaces_a_planted_outlier_by_its_neighbours():
    from vit5.eval.outliers import artifact_score, fill_outliers

    grid = torch.arange(2 * 4 * 5, dtype=torch.float32).reshape(2, 4, 5)
    norms = torch.ones(20)
    norms[7] = 50.0  # cell (1, 2)
    norms += torch.linspace(0, 0.1, 20)  # a spread, so the MAD is not zero
    score = artifact_score(norms.numpy())
    outliers = torch.from_numpy(norms.numpy() > score["threshold"]).reshape(4, 5)
    assert outliers.sum() == 1 and outliers[1, 2] and score["outlier_share"] == 1 / 20
    filled = fill_outliers(grid, outliers)
    expected = grid[:, 0:3, 1:4].sum(dim=(1, 2)) - grid[:, 1, 2]
    torch.testing.assert_close(filled[:, 1, 2], expected / 8)
    keep = ~outliers
    assert torch.equal(filled[:, keep], grid[:, keep])  # the others are left alone
