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

Decompression bombs: a 124 KB PNG may declare 32000x32000 pixels, 3 GB once decoded. Every image's
pixel count is read from its header first, with PIL's lazy ``Image.open`` (it parses the header and
decodes nothing; OpenCV has no header-only read, and its ``IMREAD_REDUCED_*`` modes still decode a
PNG in full), and an image over :func:`max_image_pixels` is refused before any pixel is decoded.
The limit defaults to PIL's own (``PIL.Image.MAX_IMAGE_PIXELS``, about 89 megapixels, a quarter of
a GiB of RGB) and is raised with the environment variable ``VIT5_MAX_IMAGE_PIXELS`` (read at each
decode, so DataLoader workers see it too); PIL's limit is raised with it, and so is OpenCV's
``OPENCV_IO_MAX_IMAGE_PIXELS`` (default 2**30), which OpenCV reads once, when it is loaded, and
which stays the backstop for the rare file PIL cannot parse.
"""

from __future__ import annotations

import io
import os
import re
import stat
import warnings

import numpy as np
from PIL import Image

from vit5.errors import InputError, Vit5Error

MAX_PIXELS_ENV = "VIT5_MAX_IMAGE_PIXELS"
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485  # PIL's default MAX_IMAGE_PIXELS: 1 GiB / 4 bytes / 3


def max_image_pixels() -> int:
    """The most pixels an image may declare (``VIT5_MAX_IMAGE_PIXELS``, default PIL's 89,478,485).

    Raises:
        InputError: the variable is not a positive whole number.
    """
    raw = os.environ.get(MAX_PIXELS_ENV, "").strip().replace("_", "")
    if not raw:
        return DEFAULT_MAX_IMAGE_PIXELS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise InputError(
            f"{MAX_PIXELS_ENV}={os.environ[MAX_PIXELS_ENV]!r} is not a positive whole number of pixels "
            f"(e.g. {MAX_PIXELS_ENV}=400000000 for 20000x20000 images); unset it for the default "
            f"{DEFAULT_MAX_IMAGE_PIXELS:,}"
        )
    return value


def _opencv_limit() -> None:
    """Make OpenCV's own limit at least ours; it takes effect only when this runs before cv2 loads."""
    try:
        limit = max_image_pixels()
    except InputError:
        return  # reported at the first decode
    if limit > 2**30:
        os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(limit))


_opencv_limit()
import cv2  # noqa: E402 (after its limit is set)

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
    _check_background(alpha_background)
    return decode_bytes(_read_bytes(path), path, alpha_background)


def decode_bytes(
    data: bytes,
    name: str | os.PathLike[str],
    alpha_background: tuple[int, int, int] | None = None,
) -> np.ndarray:
    """:func:`decode_image` of a file's bytes already in memory (a WebDataset shard member);
    ``name`` is what a :class:`BadImageError` names.

    Raises:
        BadImageError: empty, truncated, non-image or unsupported-depth data.
        ValueError: ``alpha_background`` is not an RGB triple in 0..255.
    """
    _check_background(alpha_background)
    _check_bytes(data, name)
    check_declared_size(data, name)
    path = name  # what the errors name
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


def _check_background(alpha_background: tuple[int, int, int] | None) -> None:
    if alpha_background is not None and (
        len(alpha_background) != 3 or not all(0 <= c <= 255 for c in alpha_background)
    ):
        raise ValueError(f"alpha_background must be an (R, G, B) triple in 0..255, got {alpha_background!r}")


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
    return data


def _check_bytes(data: bytes, path: str | os.PathLike[str]) -> None:
    if not data:
        raise BadImageError(path, "empty file (0 bytes)")
    if data.startswith(_JPEG_SOI) and data.rfind(_JPEG_EOI) < data.rfind(_JPEG_SOS):
        # OpenCV < 5 returns truncated JPEGs grey-filled instead of failing; the end-of-image
        # marker must follow the last scan.
        raise BadImageError(path, "truncated JPEG (no end-of-image marker after the last scan)")


def check_declared_size(data: bytes, path: str | os.PathLike[str]) -> None:
    """Refuse an image whose header declares more than :func:`max_image_pixels`, decoding nothing.

    Data PIL cannot parse passes on to OpenCV, whose ``OPENCV_IO_MAX_IMAGE_PIXELS`` then applies.

    Raises:
        BadImageError: naming the declared size, the limit and how to raise it.
    """
    limit = max_image_pixels()
    if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < limit:
        Image.MAX_IMAGE_PIXELS = limit  # a raised limit applies to PIL too (it refuses at twice this)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as header:
                width, height = header.size
    except Image.DecompressionBombError as err:  # PIL's own limit, twice its MAX_IMAGE_PIXELS
        declared = re.search(r"\((\d+) pixels\)", str(err))
        if declared is None:
            raise BadImageError(path, f"{err} (not decoded; {MAX_PIXELS_ENV} raises the limit)") from err
        raise _too_many(path, int(declared.group(1)), limit, "") from err
    except Exception:  # not parsable by PIL: OpenCV decides, under its own limit
        return
    check_pixels(path, width, height, limit)


def check_pixels(path: str | os.PathLike[str], width: int, height: int, limit: int | None = None) -> None:
    """Refuse a ``width`` x ``height`` image over the pixel limit (:func:`max_image_pixels`).

    Raises:
        BadImageError: naming the size, the memory it would take and how to raise the limit.
    """
    limit = max_image_pixels() if limit is None else limit
    if width * height > limit:
        raise _too_many(path, width * height, limit, f"{width}x{height} = ")


def _too_many(path: str | os.PathLike[str], pixels: int, limit: int, dims: str) -> BadImageError:
    return BadImageError(
        path,
        f"declares {dims}{pixels:,} pixels ({3 * pixels / 2**30:.1f} GiB decoded), over the limit of "
        f"{limit:,}: not decoded (a decompression bomb, or a genuinely huge image: to allow it, set the "
        f"environment variable {MAX_PIXELS_ENV}={pixels})",
    )


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
