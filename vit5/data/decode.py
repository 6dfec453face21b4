"""Decode an image file with OpenCV into RGB ``uint8`` HxWx3, whatever its storage format.

Conversions, so every caller sees one layout:

* grayscale and 1-bit images are replicated to three channels;
* palette PNGs are expanded by libpng;
* 16-bit images are scaled to 8 bits by ``round(v / 257)`` (65535 -> 255, exact for 8-bit data
  stored as 16-bit), not truncated by a shift;
* alpha is **dropped** by default (what PIL's ``convert("RGB")`` does in the torchvision / timm
  loaders that trained ViT-5), or composited over ``alpha_background`` when given;
* EXIF orientation is applied (OpenCV does this for every read mode except ``IMREAD_UNCHANGED``).

Files that cannot be turned into an image raise :class:`BadImageError`, which names the file and
the reason, so a data set can skip and count them instead of crashing a long run.
"""

from __future__ import annotations

import os
import stat

import cv2
import numpy as np

from vit5.errors import Vit5Error

# OpenCV's thread pool is not fork-safe: a DataLoader worker forked while the pool's state is
# locked hangs on its next OpenCV threading call (seen as a deadlocked test run). Data loading
# parallelises over worker processes instead, so OpenCV runs its functions sequentially.
cv2.setNumThreads(0)

_JPEG_SOI = b"\xff\xd8"
_JPEG_SOS = b"\xff\xda"
_JPEG_EOI = b"\xff\xd9"
_ORIENTED_ANY_DEPTH = cv2.IMREAD_ANYDEPTH | cv2.IMREAD_ANYCOLOR


class BadImageError(Vit5Error):
    """A file that cannot be decoded into an image; carries ``path`` and ``reason``."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")

    def __reduce__(self) -> tuple[type[BadImageError], tuple[str, str]]:
        # Default exception pickling replays ``self.args`` (one string) into __init__, which takes
        # two; DataLoader workers and multiprocessing need the real constructor arguments.
        return type(self), (self.path, self.reason)


def decode_image(
    path: str | os.PathLike[str],
    alpha_background: tuple[int, int, int] | None = None,
) -> np.ndarray:
    """Read ``path`` into a contiguous RGB ``uint8`` array of shape (H, W, 3).

    Args:
        path: image file; any format the installed OpenCV decodes (JPEG, PNG, WebP, TIFF, BMP, ...).
        alpha_background: RGB colour to composite transparent images over. ``None`` (default)
            drops the alpha channel. Compositing needs OpenCV's ``IMREAD_UNCHANGED`` mode, which
            ignores EXIF orientation, so files *with* alpha are not EXIF-rotated in that mode.

    Raises:
        BadImageError: unreadable, empty, truncated, non-image or unsupported-depth file.
        ValueError: ``alpha_background`` is not an RGB triple in 0..255.
    """
    if alpha_background is not None and (
        len(alpha_background) != 3 or not all(0 <= c <= 255 for c in alpha_background)
    ):
        raise ValueError(f"alpha_background must be an (R, G, B) triple in 0..255, got {alpha_background!r}")
    data = _read_bytes(path)
    if alpha_background is not None and not data.startswith(_JPEG_SOI):
        raw = _imdecode(data, cv2.IMREAD_UNCHANGED, path)
        if raw.ndim == 3 and raw.shape[2] == 4:
            return _composite(raw, alpha_background, path)
    image = _imdecode(data, _ORIENTED_ANY_DEPTH, path)
    image = _to_uint8(image, path)
    if image.ndim == 2:
        return cv2.cvtColor(image, cv2.COLOR_GRAY2RGB)
    if image.shape[2] == 3:
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    raise BadImageError(path, f"unsupported channel count {image.shape[2]} (expected 1, 3 or 4)")


def _read_bytes(path: str | os.PathLike[str]) -> bytes:
    try:
        # O_NONBLOCK: opening a FIFO named *.png must not wait forever for a writer; it is then
        # refused as not a regular file (the flag changes nothing for regular files)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise BadImageError(path, "not a regular file (a FIFO, socket or device)")
            data = f.read()
    except OSError as e:
        raise BadImageError(path, f"cannot read file ({e.strerror or e})") from e
    if not data:
        raise BadImageError(path, "empty file (0 bytes)")
    if data.startswith(_JPEG_SOI) and data.rfind(_JPEG_EOI) < data.rfind(_JPEG_SOS):
        # OpenCV < 5 returns truncated JPEGs grey-filled instead of failing; the end-of-image
        # marker must follow the last scan.
        raise BadImageError(path, "truncated JPEG (no end-of-image marker after the last scan)")
    return data


def _imdecode(data: bytes, flags: int, path: str | os.PathLike[str]) -> np.ndarray:
    try:
        image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), flags)
    except cv2.error as e:
        raise BadImageError(path, f"OpenCV error while decoding: {str(e).strip()}") from e
    if image is None or image.size == 0:
        raise BadImageError(
            path, "OpenCV cannot decode it (not an image, an unsupported format, or corrupt/truncated data)"
        )
    return image


def _to_uint8(image: np.ndarray, path: str | os.PathLike[str]) -> np.ndarray:
    if image.dtype == np.uint8:
        return image
    if image.dtype == np.uint16:
        return cv2.convertScaleAbs(image, alpha=1.0 / 257.0)
    raise BadImageError(path, f"unsupported sample type {image.dtype}; convert the file to 8 or 16 bit")


def _composite(
    bgra: np.ndarray, background: tuple[int, int, int], path: str | os.PathLike[str]
) -> np.ndarray:
    if bgra.dtype not in (np.uint8, np.uint16):
        raise BadImageError(path, f"unsupported sample type {bgra.dtype}; convert the file to 8 or 16 bit")
    max_value = float(np.iinfo(bgra.dtype).max)
    rgb = cv2.cvtColor(bgra, cv2.COLOR_BGRA2RGBA).astype(np.float32) * (255.0 / max_value)
    alpha = rgb[..., 3:] / 255.0
    out = rgb[..., :3] * alpha + np.asarray(background, dtype=np.float32) * (1.0 - alpha)
    return np.ascontiguousarray(np.rint(out).clip(0, 255).astype(np.uint8))
