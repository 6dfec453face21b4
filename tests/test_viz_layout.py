"""Token layouts: R = 0 and R = 4, vit5 [CLS|patches|regs] and timm [CLS|regs|patches], non-square grids;
images; raw arrays."""

import numpy as np
import pytest
from viz_support import multiply_tokens, smooth_images, smooth_rgb, tiny_timm, tiny_vit5, write_png

from vit5.errors import InputError
from vit5.viz import CollectConfig, TokenStats, collect, load_images, to_batch
from vit5.viz.images import list_sources
from vit5.viz.stats import norm_map, register_maps, rollout_map

QUIET = CollectConfig(batch_size=2, progress=False)
MODELS = {
    ("vit5", 0): lambda: tiny_vit5(num_registers=0),
    ("vit5", 4): lambda: tiny_vit5(num_registers=4),
    ("timm", 0): lambda: tiny_timm(reg_tokens=0),
    ("timm", 4): lambda: tiny_timm(reg_tokens=4),
}


@pytest.mark.parametrize("family,registers", list(MODELS))
def test_planted_patch_lands_at_its_grid_position_for_every_layout(family, registers):
    model = MODELS[(family, registers)]()
    row, col = (
        1,
        4,
    )  # in the 4 x 6 grid of a 32 x 48 image (a transposed or sqrt(N) reshape would misplace it)
    num_cls = 1
    first_patch = num_cls + (
        registers if family == "timm" else 0
    )  # written out, not taken from the library
    handle = multiply_tokens(model.blocks[0], [first_patch + row * 6 + col], 30.0)
    stats = collect(model, smooth_images(2), family, QUIET)
    handle.remove()
    assert stats.layout.grid == (4, 6) and stats.layout.num_registers == registers
    assert stats.layout.registers_first == (family == "timm")
    assert stats.norms.shape == (2, 2, 1 + registers + 24) and stats.received.shape == (
        2,
        2,
        2 if family == "timm" else 3,
        1 + registers + 24,
    )
    for image in range(2):
        for layer in (0, 1):
            assert np.unravel_index(norm_map(stats, image, layer).argmax(), (4, 6)) == (row, col)
    assert stats.register_values(stats.norms).shape == (2, 2, registers)
    assert (
        rollout_map(stats, 0).shape == (4, 6)
        and np.isclose(stats.rollout.sum(-1), 1.0, atol=1e-5).all()
    )
    if registers:
        assert register_maps(stats, 0, 1).shape == (registers, 4, 6)
        assert stats.patch_to_reg.shape == (2, 2, stats.received.shape[2])
    else:
        assert stats.reg_attn is None and stats.patch_to_reg is None
        with pytest.raises(InputError, match="no register tokens"):
            register_maps(stats, 0, 1)


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_raw_arrays_round_trip(tmp_path, suffix):
    stats = collect(
        tiny_timm(reg_tokens=4),
        smooth_images(3),
        "timm",
        CollectConfig(batch_size=2, keep_features=2, progress=False),
    )
    assert stats.features.shape == (2, 24, 64)  # only the first two images keep features
    loaded = TokenStats.load(stats.save(tmp_path / f"raw{suffix}"))
    assert (
        loaded.layout == stats.layout
        and loaded.names == stats.names
        and loaded.layers == stats.layers
    )
    for name in (
        "norms",
        "received",
        "cls_attn",
        "reg_attn",
        "patch_to_reg",
        "rollout",
        "features",
    ):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(stats, name))
    with pytest.raises(InputError, match=".npz or .safetensors"):
        stats.save(tmp_path / "raw.txt")


def test_images_from_folders_files_and_sklearn(tmp_path):
    write_png(tmp_path / "a" / "wide.png", smooth_rgb(60, 100, 1))
    write_png(tmp_path / "a" / "sub" / "tall.png", smooth_rgb(90, 40, 2))
    write_png(tmp_path / "a" / "tiny.png", smooth_rgb(4, 4, 3))
    (tmp_path / "a" / "broken.png").write_bytes(b"not an image")
    write_png(tmp_path / "b" / "wide.png", smooth_rgb(50, 50, 4))  # same name as a/wide.png
    images, skipped = load_images(
        [str(tmp_path / "a"), str(tmp_path / "b" / "wide.png"), "sklearn-samples"], (32, 48), 8
    )
    assert [img.name for img in images] == ["sub_tall", "wide", "wide_2", "china", "flower"]
    assert all(img.rgb.shape == (32, 48, 3) and img.rgb.dtype == np.uint8 for img in images)
    assert len(skipped) == 2
    assert any("broken.png" in s and "cannot decode" in s for s in skipped)
    assert any("tiny.png" in s and "4x4 pixels is smaller than one 8x8 patch" in s for s in skipped)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    batch = to_batch(images[:2], mean, std)
    expected = (images[1].rgb[5, 7, 2] / 255.0 - 0.3) / 0.3
    assert batch.shape == (2, 3, 32, 48) and batch[1, 2, 5, 7].item() == pytest.approx(
        expected, abs=1e-6
    )


def test_image_errors_name_the_problem(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        list_sources([str(tmp_path / "nope")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no image files"):
        list_sources([str(tmp_path / "empty")])
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8garbage")
    with pytest.raises(InputError, match="no usable image") as err:
        load_images([str(tmp_path / "bad.jpg")], (32, 32), 8)
    assert "bad.jpg" in str(err.value)
    with pytest.raises(InputError, match="use --size 32x48"):
        load_images(["sklearn-samples"], (30, 47), 8)


def test_images_of_different_sizes_cannot_share_a_run():
    images = smooth_images(1) + smooth_images(1, 40, 48)
    with pytest.raises(InputError, match="must share one size"):
        collect(tiny_vit5(), images, "x", QUIET)


def test_stored_cls_rows_are_raw_attention_over_all_tokens():
    stats = collect(tiny_vit5(depth=3), smooth_images(3), "x", QUIET)
    assert stats.cls_attn.shape == (3, 3, 3, 29) and stats.reg_attn.shape == (3, 3, 3, 4, 29)
    np.testing.assert_allclose(
        stats.cls_attn.sum(-1), 1.0, atol=1e-5
    )  # over all tokens: the patch part does not sum to 1
    assert (stats.patch_values(stats.cls_attn).sum(-1) < 1 - 1e-3).all()
