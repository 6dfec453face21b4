"""Decode an image file with OpenCV into RGB ``uint8`` HxWx3: grey, palette and 16-bit (``round(v / 257)``)
converted, alpha dropped (as PIL's ``convert("RGB")`` that trained ViT-5) or composited, EXIF orientation
applied; a bad file is a :class:`BadImageError`; decompression bombs are refused from the header."""

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
    """The most pixels an image may declare: ``VIT5_MAX_IMAGE_PIXELS`` (read at each decode, so workers see
    it; it raises PIL's limit and OpenCV's ``OPENCV_IO_MAX_IMAGE_PIXELS`` too), default PIL's 89,478,485."""
    raw = os.environ.get(MAX_PIXELS_ENV, "").strip().replace("_", "")
    if not raw:
        return DEFAULT_MAX_IMAGE_PIXELS
    if not raw.isdecimal() or int(raw) < 1:
        raise InputError(
            f"{MAX_PIXELS_ENV}={os.environ[MAX_PIXELS_ENV]!r} is not a positive whole number "
            f"of pixels (e.g. {MAX_PIXELS_ENV}=400000000 for 20000x20000 images); unset it "
            f"for the default {DEFAULT_MAX_IMAGE_PIXELS:,}"
        )
    return int(raw)


try:  # OpenCV's own limit at least ours: it takes effect only when set before cv2 loads
    if max_image_pixels() > 2**30:
        os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(max_image_pixels()))
except InputError:
    pass  # reported at the first decode
import cv2  # noqa: E402 (after its limit is set)

# OpenCV's thread pool is not fork-safe (a forked DataLoader worker can hang);
# loading uses worker processes.
cv2.setNumThreads(0)

_JPEG_SOI = b"\xff\xd8"
_JPEG_SOS = b"\xff\xda"
_JPEG_EOI = b"\xff\xd9"
_UNDECODABLE = "not an image, an unsupported format, or corrupt/truncated data"


class BadImageError(Vit5Error):
    """A file that cannot be decoded into an image; carries ``path`` and ``reason``."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")

    # pickled by DataLoader workers: both arguments
    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.path, self.reason)


def decode_image(
    path: str | os.PathLike[str], alpha_background: tuple[int, int, int] | None = None
) -> np.ndarray:
    """``path`` (any format OpenCV decodes) as a contiguous RGB ``uint8`` (H, W, 3) array.
    ``alpha_background``: the RGB colour to composite transparency on (``None``: drop alpha; not rotated)."""
    # O_NONBLOCK: a FIFO named *.png must not wait forever for a writer (no change for regular files)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise BadImageError(path, "not a regular file (a FIFO, socket or device)")
            data = f.read()
    except OSError as e:
        raise BadImageError(path, f"cannot read file ({e.strerror or e})") from e
    return decode_bytes(data, path, alpha_background)


def decode_bytes(
    data: bytes, path: str | os.PathLike[str], alpha_background: tuple[int, int, int] | None = None
) -> np.ndarray:
    """:func:`decode_image` of bytes in memory (a shard member); ``path`` is what errors name."""
    if alpha_background is not None and (
        len(alpha_background) != 3 or not all(0 <= c <= 255 for c in alpha_background)
    ):
        raise ValueError(
            f"alpha_background must be an (R, G, B) triple in 0..255, got {alpha_background!r}",
        )
    if not data:
        raise BadImageError(path, "empty file (0 bytes)")
    if data.startswith(_JPEG_SOI) and data.rfind(_JPEG_EOI) < data.rfind(_JPEG_SOS):
        # OpenCV < 5 returns truncated JPEGs grey-filled instead of failing
        raise BadImageError(path, "truncated JPEG (no end-of-image marker after the last scan)")
    # refused from the header; data PIL cannot parse is left to OpenCV's limit
    limit = max_image_pixels()
    if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < limit:
        # a raised limit applies to PIL too (it refuses at twice this)
        Image.MAX_IMAGE_PIXELS = limit
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as header:
                width, height = header.size
    except Image.DecompressionBombError as err:  # PIL's own limit, twice its MAX_IMAGE_PIXELS
        declared = re.search(r"\((\d+) pixels\)", str(err))
        if declared is None:
            reason = f"{err} (not decoded; {MAX_PIXELS_ENV} raises the limit)"
            raise BadImageError(path, reason) from err
        raise _too_many(path, int(declared.group(1)), limit, "") from err
    except Exception:  # not parsable by PIL: OpenCV decides, under its own limit
        width = height = 0
    check_pixels(path, width, height, limit)
    if alpha_background is not None and not data.startswith(_JPEG_SOI):
        raw = _imdecode(data, cv2.IMREAD_UNCHANGED, path)
        if raw.ndim == 3 and raw.shape[2] == 4:
            scale = 255.0 / np.iinfo(raw.dtype).max
            rgba = cv2.cvtColor(raw, cv2.COLOR_BGRA2RGBA).astype(np.float32) * scale
            alpha = rgba[..., 3:] / 255.0
            background = np.asarray(alpha_background, dtype=np.float32)
            out = rgba[..., :3] * alpha + background * (1.0 - alpha)
            return np.ascontiguousarray(np.rint(out).clip(0, 255).astype(np.uint8))
    image = _imdecode(data, cv2.IMREAD_ANYDEPTH | cv2.IMREAD_ANYCOLOR, path)  # EXIF-oriented
    if image.dtype == np.uint16:
        image = cv2.convertScaleAbs(image, alpha=1.0 / 257.0)
    if image.ndim == 2:
        return cv2.cvtColor(image, cv2.COLOR_GRAY2RGB)
    if image.shape[2] == 3:
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    raise BadImageError(path, f"unsupported channel count {image.shape[2]} (expected 1, 3 or 4)")


def check_pixels(
    path: str | os.PathLike[str],
    width: int,
    height: int,
    limit: int | None = None,
) -> None:
    """Refuse a ``width`` x ``height`` image over the pixel limit (:func:`max_image_pixels`)."""
    limit = max_image_pixels() if limit is None else limit
    if width * height > limit:
        raise _too_many(path, width * height, limit, f"{width}x{height} = ")


def _too_many(path: str | os.PathLike[str], pixels: int, limit: int, dims: str) -> BadImageError:
    return BadImageError(
        path,
        f"declares {dims}{pixels:,} pixels ({3 * pixels / 2**30:.1f} GiB decoded), "
        f"over the limit of {limit:,}: not decoded (a decompression bomb, or a genuinely "
        f"huge image: to allow it, set the environment variable {MAX_PIXELS_ENV}={pixels})",
    )


def _imdecode(data: bytes, flags: int, path: str | os.PathLike[str]) -> np.ndarray:
    try:
        image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), flags)
    except cv2.error as e:
        raise BadImageError(path, f"OpenCV error while decoding: {str(e).strip()}") from e
    if image is None or image.size == 0:
        raise BadImageError(path, f"OpenCV cannot decode it ({_UNDECODABLE})")
    if image.dtype not in (np.uint8, np.uint16):
        raise BadImageError(
            path,
            f"unsupported sample type {image.dtype}; convert the file to 8 or 16 bit",
        )
    return image
