"""decode_image: every storage format ends as RGB uint8 HxWx3; broken files raise BadImageError."""

from __future__ import annotations

import pickle

import cv2
import numpy as np
import pytest
from data_images import (
    random_rgb,
    smooth_rgb,
    write_bad_files,
    write_jpeg,
    write_png,
    write_png_bomb,
    write_rgba_png,
)
from PIL import Image, ImageOps

from vit5.data import BadImageError, decode_image
from vit5.data.decode import MAX_PIXELS_ENV, max_image_pixels
from vit5.errors import InputError


def test_rgb_png_round_trips_exactly(tmp_path):
    rgb = random_rgb(9, 13)
    out = decode_image(write_png(tmp_path / "x.png", rgb))
    assert out.dtype == np.uint8 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, rgb)


def test_grayscale_png_is_replicated_to_three_channels(tmp_path):
    gray = random_rgb(7, 5)[..., 0]
    out = decode_image(write_png(tmp_path / "g.png", gray))
    np.testing.assert_array_equal(out, np.stack([gray] * 3, axis=-1))


def test_sixteen_bit_png_is_rounded_to_eight_bits(tmp_path):
    values = np.array(
        [0, 1, 128, 129, 257, 385, 386, 32767, 65407, 65408, 65534, 65535], dtype=np.uint16
    )
    rgb16 = np.stack([values, values[::-1], np.full_like(values, 257 * 200)], axis=-1)[None]
    assert cv2.imwrite(str(tmp_path / "c16.png"), cv2.cvtColor(rgb16, cv2.COLOR_RGB2BGR))
    expected = ((rgb16.astype(np.int64) + 128) // 257).astype(
        np.uint8
    )  # round(v / 257), never a tie
    np.testing.assert_array_equal(decode_image(tmp_path / "c16.png"), expected)
    assert cv2.imwrite(str(tmp_path / "g16.png"), values[None])
    np.testing.assert_array_equal(decode_image(tmp_path / "g16.png")[0, :, 1], expected[0, :, 0])


def test_rgba_png_drops_alpha_by_default_and_composites_on_request(tmp_path):
    rgba = random_rgb(6, 8, seed=1)
    alpha = np.linspace(0, 255, 48).astype(np.uint8).reshape(6, 8, 1)
    path = write_rgba_png(tmp_path / "a.png", np.concatenate([rgba, alpha], axis=-1))
    np.testing.assert_array_equal(decode_image(path), rgba)
    a = alpha.astype(np.float64) / 255
    expected = np.rint(rgba * a + np.array([255.0, 0.0, 10.0]) * (1 - a)).astype(np.uint8)
    out = decode_image(path, alpha_background=(255, 0, 10))
    assert np.abs(out.astype(int) - expected).max() <= 1
    assert out[0, 0].tolist() == [255, 0, 10]  # fully transparent pixel = background
    with pytest.raises(ValueError, match="alpha_background"):
        decode_image(path, alpha_background=(0, 0, 256))


def test_sixteen_bit_rgba_composites(tmp_path):
    rgba16 = np.zeros((1, 2, 4), np.uint16)
    rgba16[0, 0] = (65535, 0, 0, 65535)  # opaque red
    rgba16[0, 1] = (65535, 0, 0, 0)  # transparent
    assert cv2.imwrite(str(tmp_path / "a16.png"), cv2.cvtColor(rgba16, cv2.COLOR_RGBA2BGRA))
    out = decode_image(tmp_path / "a16.png", alpha_background=(0, 0, 255))
    assert out.tolist() == [[[255, 0, 0], [0, 0, 255]]]


@pytest.mark.parametrize("mode", ["P", "1", "LA"])
def test_palette_bilevel_and_gray_alpha_pngs_match_pil(tmp_path, mode):
    rgb = random_rgb(10, 12, seed=2)
    if mode == "P":
        image = Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
    else:
        image = Image.fromarray(rgb).convert(mode)
    image.save(tmp_path / "m.png")
    expected = np.asarray(Image.open(tmp_path / "m.png").convert("RGB"))
    np.testing.assert_array_equal(decode_image(tmp_path / "m.png"), expected)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied(tmp_path, orientation):
    rgb = smooth_rgb(24, 40)
    rgb[:6, :10] = (255, 0, 0)  # asymmetric marker so every orientation differs
    path = write_jpeg(tmp_path / "r.jpg", rgb, orientation=orientation)
    expected = np.asarray(ImageOps.exif_transpose(Image.open(path)).convert("RGB"))
    out = decode_image(path)
    assert out.shape == expected.shape == ((24, 40, 3) if orientation < 5 else (40, 24, 3))
    assert np.abs(out.astype(int) - expected).mean() < 2  # both decode the same JPEG


def test_cmyk_jpeg_becomes_rgb(tmp_path):
    Image.fromarray(smooth_rgb(16, 16)).convert("CMYK").save(tmp_path / "c.jpg")
    expected = np.asarray(Image.open(tmp_path / "c.jpg").convert("RGB"))
    out = decode_image(tmp_path / "c.jpg")
    assert out.shape == (16, 16, 3) and np.abs(out.astype(int) - expected).mean() < 3


def test_bad_files_raise_named_errors(tmp_path):
    empty, truncated, text = write_bad_files(tmp_path)
    expected_reason = {empty: "empty file", truncated: "truncated", text: "cannot decode"}
    for path, reason in expected_reason.items():
        with pytest.raises(BadImageError) as info:
            decode_image(path)
        assert info.value.path == str(path) and reason in info.value.reason
        assert str(path) in str(info.value)
    with pytest.raises(BadImageError, match="cannot read file"):
        decode_image(tmp_path / "missing.png")
    with pytest.raises(BadImageError, match="cannot read file"):
        decode_image(tmp_path)


def test_jpeg_missing_only_its_end_marker_is_truncated(tmp_path):
    path = write_jpeg(tmp_path / "t.jpg", random_rgb(32, 32))
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(BadImageError, match="truncated JPEG"):
        decode_image(path)


def test_float_tiff_is_rejected_with_the_fix(tmp_path):
    assert cv2.imwrite(str(tmp_path / "f.tiff"), np.zeros((4, 4, 3), np.float32))
    with pytest.raises(BadImageError, match="convert the file to 8 or 16 bit"):
        decode_image(tmp_path / "f.tiff")


def test_bad_image_error_survives_pickling():
    error = pickle.loads(pickle.dumps(BadImageError("/a/b.jpg", "empty file (0 bytes)")))
    assert (error.path, error.reason) == ("/a/b.jpg", "empty file (0 bytes)")
    assert str(error) == "/a/b.jpg: empty file (0 bytes)"


def test_image_declaring_too_many_pixels_is_refused_before_decoding(tmp_path, monkeypatch):
    """A 32000x32000 PNG of a few KB would take 3 GB decoded: refused from its header alone."""
    bomb = write_png_bomb(tmp_path / "bomb.png", 32000, 32000)
    assert bomb.stat().st_size < 200_000
    decoded = []
    real = cv2.imdecode
    monkeypatch.setattr(cv2, "imdecode", lambda *a: decoded.append(1) or real(*a))
    refused = r"declares (32000x32000 = )?1,024,000,000 pixels .* over the limit"
    with pytest.raises(BadImageError, match=refused) as err:
        decode_image(bomb)
    assert decoded == []  # nothing allocated for its pixels
    assert f"{MAX_PIXELS_ENV}=1024000000" in err.value.reason  # the way to allow it
    with pytest.raises(BadImageError, match="declares"):
        decode_image(write_png_bomb(tmp_path / "over.png", 9500, 9500), alpha_background=(0, 0, 0))
    assert decoded == []


def test_pixel_limit_is_the_users_to_raise_or_lower(tmp_path, monkeypatch):
    rgb = random_rgb(20, 30)
    path = write_png(tmp_path / "x.png", rgb)
    monkeypatch.setenv(MAX_PIXELS_ENV, "599")
    assert max_image_pixels() == 599
    with pytest.raises(BadImageError, match="declares 30x20 = 600 pixels .* over the limit of 599"):
        decode_image(path)
    with pytest.raises(BadImageError, match="declares 30x20"):  # JPEG headers too
        decode_image(write_jpeg(tmp_path / "x.jpg", rgb))
    monkeypatch.setenv(MAX_PIXELS_ENV, "600")
    np.testing.assert_array_equal(decode_image(path), rgb)
    bomb = write_png_bomb(tmp_path / "bomb.png", 12000, 12000)
    monkeypatch.setenv(
        MAX_PIXELS_ENV, "200_000_000"
    )  # allowed now: decoded, and its missing rows found
    with pytest.raises(BadImageError, match="cannot decode"):
        decode_image(bomb)
    monkeypatch.setenv(MAX_PIXELS_ENV, "lots")
    with pytest.raises(InputError, match=f"{MAX_PIXELS_ENV}='lots' is not a positive whole number"):
        decode_image(path)
