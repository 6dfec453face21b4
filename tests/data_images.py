"""Writers for the image files the data tests need (good, odd and broken), all under tmp_path."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

EXIF_ORIENTATION_TAG = 0x0112


def random_rgb(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def smooth_rgb(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Low-frequency content, so JPEG and resampling differences stay small."""
    noise = np.random.default_rng(seed).random((height, width, 3)).astype(np.float32)
    blurred = cv2.GaussianBlur(noise, (0, 0), sigmaX=max(height, width) / 12)
    lo, hi = blurred.min(), blurred.max()
    return np.rint((blurred - lo) / (hi - lo) * 255).astype(np.uint8)


def write_png(path: Path, rgb_or_gray: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = rgb_or_gray if rgb_or_gray.ndim == 2 else cv2.cvtColor(rgb_or_gray, cv2.COLOR_RGB2BGR)
    assert cv2.imwrite(str(path), image)
    return path


def write_rgba_png(path: Path, rgba: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), cv2.cvtColor(rgba, cv2.COLOR_RGBA2BGRA))
    return path


def write_jpeg(
    path: Path, rgb: np.ndarray, orientation: int | None = None, quality: int = 95
) -> Path:
    """JPEG via PIL, optionally with an EXIF orientation tag (1..8)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    exif = Image.Exif()
    if orientation is not None:
        exif[EXIF_ORIENTATION_TAG] = orientation
    Image.fromarray(rgb).save(path, format="JPEG", quality=quality, exif=exif)
    return path


def write_truncated_jpeg(path: Path, keep_fraction: float = 0.5) -> Path:
    write_jpeg(path, random_rgb(64, 64))
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep_fraction)])
    return path


def write_bad_files(folder: Path) -> list[Path]:
    """Zero-byte, truncated and text-as-JPEG files; all must fail to decode."""
    folder.mkdir(parents=True, exist_ok=True)
    empty = folder / "empty.jpg"
    empty.write_bytes(b"")
    text = folder / "notes.jpg"
    text.write_text("this is not an image\n")
    return [empty, write_truncated_jpeg(folder / "truncated.jpg"), text]


def write_png_bomb(path: Path, width: int, height: int) -> Path:
    """A tiny PNG whose header declares ``width`` x ``height`` RGB pixels (its data stops after a few
    rows): what a decompression bomb looks like before it is decoded."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    rows = zlib.compress(b"\0" * (3 * width + 1) * 4, 9)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", rows)
        + chunk(b"IEND", b"")
    )
    return path
