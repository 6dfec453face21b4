"""Images for the tools: files, folders, ``sklearn-samples``, ``digits-train`` / ``digits-val`` (labelled),
ImageFolders with ``folder_labels``. Decoded by :func:`vit5.data.decode_image`, resized to cover the size and
centre-cropped (:func:`vit5.data.eval_transform`), kept as ``uint8`` RGB so that models compared see, and
figures draw, the same pixels; unreadable or sub-patch images are skipped and reported."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from vit5.data import IMAGE_EXTENSIONS, BadImageError, decode_image, eval_transform, image_files
from vit5.errors import InputError
from vit5.layers.patch_embed import grid_of

SKLEARN_SAMPLES = "sklearn-samples"
DIGITS_SOURCES = ("digits-train", "digits-val")


@dataclass(frozen=True)
class LoadedImage:
    name: str  # unique within a run, safe as a file name
    rgb: np.ndarray  # (H, W, 3) uint8: the pixels the model sees
    label: int | None = None  # class index, for labelled sources


@dataclass(frozen=True)
class ImageSource:
    name: str
    path: str | None = None  # a file, or None for an in-memory sample
    array: np.ndarray | None = None
    label: int | None = None


def list_sources(sources: Sequence[str], folder_labels: bool = False) -> list[ImageSource]:
    """Files, folders (their image files, recursively, sorted) and the literals ``sklearn-samples``,
    ``digits-train`` and ``digits-val``; with ``folder_labels``, folders are labelled ImageFolders."""
    found: list[ImageSource] = []
    for source in sources:
        path = Path(source)
        if source == SKLEARN_SAMPLES:
            from sklearn.datasets import load_sample_images

            samples = load_sample_images()
            for file, array in zip(samples.filenames, samples.images):
                found.append(ImageSource(name=Path(file).stem, array=array))
        elif source in DIGITS_SOURCES:
            from vit5.data import load_digits_split

            split = load_digits_split(source.removeprefix("digits-"), size=32)
            for i, img, t in zip(split.source_indices, split.images, split.targets):
                found.append(ImageSource(name=f"{source}_{i:04d}", array=img, label=int(t)))
        elif path.is_dir():
            files = image_files(path)
            if not files:
                extensions = ", ".join(IMAGE_EXTENSIONS)
                raise InputError(f"folder {path} holds no image files ({extensions})")
            relative = [p.relative_to(path) for p in files]
            classes = sorted({r.parts[0] for r in relative if len(r.parts) > 1})
            if folder_labels and not classes:
                raise InputError(
                    f"folder {path} has no class subfolders: labelled folders are ImageFolders "
                    "(<folder>/<class>/<image>)"
                )
            for p, r in zip(files, relative):
                label = None
                if folder_labels and len(r.parts) > 1:
                    label = classes.index(r.parts[0])
                found.append(ImageSource(name=str(r.with_suffix("")), path=str(p), label=label))
        elif path.is_file():
            found.append(ImageSource(name=path.stem, path=str(path)))
        else:
            raise InputError(
                f"image source {source!r} does not exist: give image files, folders, "
                f"{SKLEARN_SAMPLES!r} or {' / '.join(DIGITS_SOURCES)}"
            )
    # names made safe for files and unique: a repeated one gets _2, _3, ...
    seen: dict[str, int] = {}
    unique = []
    for src in found:
        base = re.sub(r"[^A-Za-z0-9._-]+", "_", src.name).strip("_") or "image"
        seen[base] = seen.get(base, 0) + 1
        name = base if seen[base] == 1 else f"{base}_{seen[base]}"
        unique.append(replace(src, name=name))
    return unique


def default_size(
    sources: Sequence[str],
    model_size: tuple[int, int],
    patch: int,
) -> tuple[int, int]:
    """(height, width) keeping the images' aspect, so 640x427 photos on a 224 px model are read at 224x336:
    the short side is ``min(model_size)`` rounded to a patch multiple, the long side the short side times
    the images' median long / short ratio (sizes read from the file headers) rounded to a patch multiple,
    in the majority's orientation. Unreadable files are left to :func:`load_images`."""
    short = max(patch, round(min(model_size) / patch) * patch)
    shapes = [s for s in map(_shape, list_sources(sources)) if s]
    if not shapes:
        return short, short
    ratios = np.array([max(h, w) / min(h, w) for h, w in shapes])
    long = max(short, round(short * float(np.median(ratios)) / patch) * patch)
    portrait = sum(h > w for h, w in shapes) > len(shapes) / 2
    return (long, short) if portrait else (short, long)


def _shape(src: ImageSource) -> tuple[int, int] | None:
    """(height, width) of a source as it will be decoded (EXIF orientation applied), or None."""
    if src.array is not None:
        return src.array.shape[:2]
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(src.path) as img:
            width, height = img.size
            # EXIF orientation 5 to 8: a quarter turn
            rotated = img.getexif().get(0x0112, 1) in (5, 6, 7, 8)
    except (OSError, UnidentifiedImageError, ValueError):
        return None
    return (width, height) if rotated else (height, width)


def load_images(
    sources: Sequence[str],
    size: tuple[int, int],
    patch_size: int,
    folder_labels: bool = False,
    max_images: int | None = None,
) -> tuple[list[LoadedImage], list[str]]:
    """Load ``sources`` at ``size`` (height, width), at most ``max_images`` of them (in listing order);
    returns the images and one line per skipped file."""
    grid_of(size, patch_size, "use --size {h}x{w}", InputError)
    # resized pixels / 255
    fit = eval_transform(size, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    images = []
    skipped = []
    for src in list_sources(sources, folder_labels):
        if max_images is not None and len(images) >= max_images:
            break
        try:
            rgb = src.array if src.array is not None else decode_image(src.path)
        except BadImageError as err:
            skipped.append(f"{err.path}: {err.reason}")
            continue
        if min(rgb.shape[:2]) < patch_size:
            skipped.append(
                f"{src.path or src.name}: {rgb.shape[0]}x{rgb.shape[1]} pixels is smaller than "
                f"one {patch_size}x{patch_size} patch, so it holds no token's worth of content"
            )
            continue
        # exact multiples of 1/255: the resize works on uint8
        unit = fit(np.ascontiguousarray(rgb))
        shown = (unit * 255.0).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
        pixels = np.ascontiguousarray(shown)
        images.append(LoadedImage(name=src.name, rgb=pixels, label=src.label))
    if not images:
        listed = "".join(f"\n  skipped {s}" for s in skipped)
        raise InputError(f"no usable image in {', '.join(map(str, sources))}{listed}")
    return images, skipped


def to_batch(
    images: Sequence[LoadedImage],
    mean: Sequence[float],
    std: Sequence[float],
) -> torch.Tensor:
    """``[B, 3, H, W]`` float32: ``(rgb / 255 - mean) / std`` with the model's own mean and std."""
    pixels = torch.from_numpy(np.stack([img.rgb for img in images]))
    x = pixels.permute(0, 3, 1, 2).float() / 255.0
    return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


def batches(
    images: Sequence[LoadedImage],
    info,
    batch_size: int,
    device: str,
) -> Iterator[torch.Tensor]:
    """``images`` as :func:`to_batch` batches normalised with ``info.mean`` / ``info.std``, on ``device``."""
    for start in range(0, len(images), batch_size):
        yield to_batch(images[start : start + batch_size], info.mean, info.std).to(device)
