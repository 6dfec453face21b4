"""Fashion-MNIST (Xiao, Rasul and Vollgraf, arXiv 1708.07747) as an ImageFolder tree of PNG files.

``vit5 data fashion-mnist OUT`` writes ``OUT/{train,val,test}/<class>/<index>.png``: ``test`` the
10,000 test images, ``val`` a fixed, seeded, class-stratified hold-out of the 60,000 training images
(5,000 by default) and ``train`` the rest, so models are selected on ``val`` and ``test`` is read once per
reported model. A file is named by the sample's position in its IDX file (``test/ankle_boot/09999.png`` is
the last test image; a ``train``/``val`` file's number is its index among the 60,000 training images), so
every image can be traced back to its source.

The four source files are the data set's own gzipped IDX files (github.com/zalandoresearch/fashion-mnist),
read by :func:`read_idx` (the IDX format of yann.lecun.com/exdb/mnist: a magic number giving the element
type and the number of dimensions, the dimensions as big-endian int32, then the data). They are found in
``--source DIR``, else the Debian package ``dataset-fashion-mnist`` (:data:`DEBIAN_DIR`), else through
torchvision's ``FashionMNIST(download=True)`` when a network is there.

The export is idempotent and resumable like the digits one (:mod:`vit5.data.digits.export`): every file
is written atomically, a file that already holds the right bytes is left alone, so an interrupted export
finishes on the next call, and a tree written with another seed or val size is refused rather than merged
(its val images would leak into train).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
from sklearn.model_selection import train_test_split

from vit5.errors import InputError
from vit5.files import atomic_write_bytes, atomic_write_json

#: Class names in label order (0..9), as folder names: the data set's labels, lower-case, ``_`` for ``/``.
FASHION_MNIST_CLASSES: tuple[str, ...] = (
    "t_shirt_top",
    "trouser",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle_boot",
)
#: Source part -> (images file, labels file), without the ``.gz`` the published files carry.
IDX_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
INSTALL_HINT = "apt-get install dataset-fashion-mnist"
SPLITS = ("train", "val", "test")
DEFAULT_VAL_SIZE = 5000
MANIFEST = "fashion_mnist.json"
_EXPORTED_NAME = re.compile(r"^\d{5}\.png$")
_GZIP_MAGIC = b"\x1f\x8b"
# IDX element types (the third byte of the magic number) -> numpy dtype, big-endian as the format says.
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class FashionMnistError(InputError):
    """The Fashion-MNIST source files are missing, damaged or inconsistent (the message names the fix)."""


# --------------------------------------------------------------------------------------- reading
def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one IDX file, gzipped or raw, into an array of the shape its header gives.

    Raises:
        FashionMnistError: not an IDX file, a truncated or corrupt gzip stream, or fewer / more data
            bytes than the header's dimensions call for.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
        if data[:2] == _GZIP_MAGIC:
            data = gzip.decompress(data)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise FashionMnistError(f"{path} is a truncated or corrupt gzip file ({e}); {_refetch(path)}") from e
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] not in _IDX_TYPES or data[3] == 0:
        raise FashionMnistError(
            f"{path} is not an IDX file (magic number {data[:4].hex() or 'missing'}); {_refetch(path)}"
        )
    dtype, ndim = np.dtype(_IDX_TYPES[data[2]]), data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise FashionMnistError(f"{path} is truncated inside its IDX header; {_refetch(path)}")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(data) - header != expected:
        state = "truncated" if len(data) - header < expected else "longer than its header says"
        raise FashionMnistError(
            f"{path} is {state}: its IDX header gives shape {dims} ({expected} data bytes) but it holds "
            f"{len(data) - header}; {_refetch(path)}"
        )
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def _refetch(path: Path) -> str:
    return f"replace it (e.g. `{INSTALL_HINT} --reinstall`, or delete it and download again)"


@dataclass(frozen=True)
class FashionMnistPart:
    """One source part: ``images`` (N, 28, 28) uint8 and ``labels`` (N,) int64 in IDX order."""

    images: np.ndarray
    labels: np.ndarray


def load_part(source: str | os.PathLike[str], part: str) -> FashionMnistPart:
    """Read and check the images and labels of ``part`` (``"train"`` or ``"test"``) in ``source``.

    Raises:
        FashionMnistError: a file missing or damaged, images that are not (N, H, W) uint8, labels that
            are not (N,) uint8 in 0..9, or image and label files of different lengths.
    """
    images_path, labels_path = (_idx_path(Path(source), stem) for stem in IDX_FILES[part])
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise FashionMnistError(
            f"{images_path}: expected (N, height, width) unsigned bytes, got shape {images.shape} of "
            f"{images.dtype}; is it an image file?"
        )
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise FashionMnistError(
            f"{labels_path}: expected (N,) unsigned bytes, got shape {labels.shape} of {labels.dtype}; "
            f"is it a label file?"
        )
    if len(images) != len(labels):
        raise FashionMnistError(
            f"{images_path} holds {len(images)} images but {labels_path} {len(labels)} labels; "
            f"the two files are from different releases or one is damaged: {_refetch(images_path)}"
        )
    if labels.size and int(labels.max()) >= len(FASHION_MNIST_CLASSES):
        raise FashionMnistError(
            f"{labels_path} holds label {int(labels.max())}, Fashion-MNIST has 0..9; {_refetch(labels_path)}"
        )
    return FashionMnistPart(images=images, labels=labels.astype(np.int64))


def _idx_path(source: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (source / name).is_file():
            return source / name
    raise FashionMnistError(f"{source} has no {stem}.gz (or {stem}); {_where_hint()}")


def has_source(folder: Path) -> bool:
    """Whether ``folder`` holds all four IDX files (gzipped or raw)."""
    return all(
        any((folder / name).is_file() for name in (f"{stem}.gz", stem))
        for stems in IDX_FILES.values()
        for stem in stems
    )


def _where_hint() -> str:
    return f"give --source DIR holding the four IDX files of Fashion-MNIST, or `{INSTALL_HINT}`"


def torchvision_download(cache: Path) -> Path:
    """Download the four files with torchvision (``FashionMNIST(download=True)``) into ``cache``;
    returns the folder holding them. Any failure (no torchvision, no network) raises ``OSError``."""
    try:
        from torchvision.datasets import FashionMNIST
    except ImportError as e:
        raise OSError(f"torchvision is not installed ({e})") from e
    try:
        FashionMNIST(str(cache), train=True, download=True)
        FashionMNIST(str(cache), train=False, download=True)
    except Exception as e:  # URLError, timeouts, checksum RuntimeError: all mean "not downloadable here"
        raise OSError(str(e).splitlines()[0] if str(e) else type(e).__name__) from e
    return cache / "FashionMNIST" / "raw"


def default_cache() -> Path:
    """Where a torchvision download goes: ``$XDG_CACHE_HOME/vit5/fashion-mnist`` (``~/.cache/...``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vit5" / "fashion-mnist"


def resolve_source(
    source: str | os.PathLike[str] | None = None,
    *,
    debian_dir: Path = DEBIAN_DIR,
    download: Callable[[Path], Path] | None = torchvision_download,
    cache: Path | None = None,
) -> Path:
    """The folder to read: ``source`` when given (it must hold the files: no fallback), else
    ``debian_dir`` when it holds them, else a cached or fresh ``download`` (``None``: no download).

    Raises:
        FashionMnistError: one line naming ``apt-get install dataset-fashion-mnist`` and ``--source``.
    """
    if source is not None:
        folder = Path(source).expanduser()
        if not folder.is_dir():
            raise FashionMnistError(f"--source {folder} is not a folder; {_where_hint()}")
        if not has_source(folder):
            missing = [
                stem
                for stems in IDX_FILES.values()
                for stem in stems
                if not any((folder / n).is_file() for n in (f"{stem}.gz", stem))
            ]
            raise FashionMnistError(f"--source {folder} lacks {', '.join(missing)} (.gz); {_where_hint()}")
        return folder
    if has_source(debian_dir):
        return debian_dir
    cache = cache or default_cache()
    if has_source(cache / "FashionMNIST" / "raw"):
        return cache / "FashionMNIST" / "raw"
    reason = "no download tried"
    if download is not None:
        try:
            folder = download(cache)
            if has_source(folder):
                return folder
            reason = f"the download left no IDX files in {folder}"
        except OSError as e:
            reason = f"torchvision's download failed: {e}"
    raise FashionMnistError(
        f"Fashion-MNIST not found in {debian_dir} and {reason}; run `{INSTALL_HINT}` "
        f"(or pass --source DIR holding the four IDX files)"
    )


# ------------------------------------------------------------------------------------------ split
def split_indices(labels: np.ndarray, val_size: int = DEFAULT_VAL_SIZE, seed: int = 0) -> np.ndarray:
    """Sorted indices of the val hold-out: ``val_size`` of ``labels``, stratified by class, fixed by ``seed``.

    Raises:
        FashionMnistError: ``val_size`` leaves a split without some class.
    """
    classes = len(np.unique(labels))
    if (
        isinstance(val_size, bool)
        or not isinstance(val_size, int)
        or not classes <= val_size <= len(labels) - classes
    ):
        raise FashionMnistError(
            f"--val-size {val_size} must be an integer from {classes} to {len(labels) - classes} "
            f"(each split needs every class) for {len(labels)} training images"
        )
    _, val = train_test_split(np.arange(len(labels)), test_size=val_size, stratify=labels, random_state=seed)
    return np.sort(val)


# ----------------------------------------------------------------------------------------- export
@dataclass(frozen=True)
class FashionMnistExport:
    """What :func:`export_fashion_mnist` did; ``counts[split][class]`` = number of images."""

    root: Path
    source: Path
    written: int
    unchanged: int
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def __str__(self) -> str:
        totals = ", ".join(f"{split} {sum(c.values())}" for split, c in self.counts.items())
        return (
            f"fashion-mnist ({self.source}) -> {self.root}: {totals} images; "
            f"{self.written} written, {self.unchanged} unchanged"
        )


def export_fashion_mnist(
    root: str | os.PathLike[str],
    source: str | os.PathLike[str] | None = None,
    *,
    val_size: int = DEFAULT_VAL_SIZE,
    seed: int = 0,
    debian_dir: Path = DEBIAN_DIR,
    download: Callable[[Path], Path] | None = torchvision_download,
    cache: Path | None = None,
) -> FashionMnistExport:
    """Write the train / val / test ImageFolder tree under ``root`` (see the module docstring).

    ``source`` and the fallbacks are those of :func:`resolve_source`. Grey PNGs, one per image; a rerun
    rewrites nothing, an interrupted one completes; ``root/fashion_mnist.json`` records the split.

    Raises:
        FashionMnistError: no usable source, a damaged file or a bad ``val_size``.
        FileExistsError: ``root`` holds an export with another seed or val size.
    """
    root = Path(root)
    folder = resolve_source(source, debian_dir=debian_dir, download=download, cache=cache)
    train, test = load_part(folder, "train"), load_part(folder, "test")
    val_idx = split_indices(train.labels, val_size, seed)
    in_val = np.zeros(len(train.labels), dtype=bool)
    in_val[val_idx] = True
    parts = {
        "train": (train, np.flatnonzero(~in_val)),
        "val": (train, val_idx),
        "test": (test, np.arange(len(test.labels))),
    }
    manifest = {
        "dataset": "fashion-mnist",
        "seed": seed,
        "val_size": val_size,
        "counts": {split: len(indices) for split, (_, indices) in parts.items()},
    }
    _check_previous(root, manifest)
    planned = {
        root / split / FASHION_MNIST_CLASSES[part.labels[i]] / f"{i:05d}.png"
        for split, (part, indices) in parts.items()
        for i in indices
    }
    stale = sorted(p for p in _existing_exports(root) if p not in planned)
    if stale:
        raise FileExistsError(
            f"{root} holds {len(stale)} image(s) this export would not write (e.g. {stale[0]}): an export "
            f"with other arguments; delete {root} or export to another folder"
        )
    written = 0
    counts: dict[str, dict[str, int]] = {}
    for split, (part, indices) in parts.items():
        counts[split] = dict.fromkeys(FASHION_MNIST_CLASSES, 0)
        for name in FASHION_MNIST_CLASSES:
            (root / split / name).mkdir(parents=True, exist_ok=True)
        for i in indices:
            name = FASHION_MNIST_CLASSES[part.labels[i]]
            counts[split][name] += 1
            path = root / split / name / f"{i:05d}.png"
            payload = _encode_png(part.images[i])
            if path.is_file() and path.read_bytes() == payload:
                continue
            atomic_write_bytes(path, payload, durable=False)
            written += 1
    atomic_write_json(root / MANIFEST, manifest)
    return FashionMnistExport(
        root=root, source=folder, written=written, unchanged=len(planned) - written, counts=counts
    )


def _check_previous(root: Path, manifest: dict[str, object]) -> None:
    path = root / MANIFEST
    if not path.is_file():
        return
    try:
        previous = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        return  # unreadable: the file-by-file check below still refuses a foreign tree
    differs = [k for k in ("seed", "val_size") if previous.get(k) != manifest[k]]
    if differs:
        was = ", ".join(f"{k}={previous.get(k)}" for k in differs)
        now = ", ".join(f"{k}={manifest[k]}" for k in differs)
        raise FileExistsError(
            f"{root} holds an export with {was} (asked: {now}); delete {root} or export to another folder"
        )


def _encode_png(grey: np.ndarray) -> bytes:
    ok, buffer = cv2.imencode(".png", np.ascontiguousarray(grey))
    if not ok:
        raise RuntimeError("OpenCV failed to encode a PNG")
    return buffer.tobytes()


def _existing_exports(root: Path) -> list[Path]:
    return [
        path
        for split in SPLITS
        for name in FASHION_MNIST_CLASSES
        if (root / split / name).is_dir()
        for path in (root / split / name).iterdir()
        if _EXPORTED_NAME.match(path.name)
    ]
