"""Fashion-MNIST (arXiv 1708.07747) as ``OUT/{train,val,test}/<class>/<index in its IDX file>.png``: ``val`` a
seeded, stratified hold-out of the training images. The IDX files (github.com/zalandoresearch/fashion-mnist)
come from ``--source DIR``, else the Debian package, else torchvision's download; the export is idempotent."""

import gzip
import os
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from vit5.data.digits import ExportReport, stratified_split, write_image_tree
from vit5.errors import InputError

#: Class names in label order (0..9), as folder names: the data set's labels, lower-case, ``_`` for ``/``.
FASHION_MNIST_CLASSES: tuple[str, ...] = tuple(
    "t_shirt_top trouser pullover dress coat sandal shirt sneaker bag ankle_boot".split()
)
#: Source part -> (images file, labels file), without the ``.gz`` the published files carry.
IDX_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
INSTALL_HINT = "apt-get install dataset-fashion-mnist"
DEFAULT_VAL_SIZE = 5000
_REFETCH = f"replace it (e.g. `{INSTALL_HINT} --reinstall`, or delete it and download again)"
_WHERE = f"give --source DIR holding the four IDX files of Fashion-MNIST, or `{INSTALL_HINT}`"
# IDX element types (the third byte of the magic number) -> numpy dtype, big-endian as the format says.
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class FashionMnistError(InputError):
    """The Fashion-MNIST source files are missing, damaged or inconsistent (the message names the fix)."""


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """One IDX file (yann.lecun.com/exdb/mnist: magic number with element type and ndim, big-endian int32
    dims, data), gzipped or raw, as an array; a damaged file is a :class:`FashionMnistError`."""
    path = Path(path)
    try:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        reason = f"{path} is a truncated or corrupt gzip file ({e})"
        raise FashionMnistError(f"{reason}; {_REFETCH}") from e
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] not in _IDX_TYPES or data[3] == 0:
        raise FashionMnistError(
            f"{path} is not an IDX file (magic number {data[:4].hex() or 'missing'}); {_REFETCH}"
        )
    dtype = np.dtype(_IDX_TYPES[data[2]])
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise FashionMnistError(f"{path} is truncated inside its IDX header; {_REFETCH}")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(data) - header != expected:
        state = "truncated" if len(data) - header < expected else "longer than its header says"
        raise FashionMnistError(
            f"{path} is {state}: its IDX header gives shape {dims} ({expected} data bytes) "
            f"but it holds {len(data) - header}; {_REFETCH}"
        )
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return array.astype(dtype.newbyteorder("="))


def load_part(source: Path, part: str) -> tuple[np.ndarray, np.ndarray]:
    """The checked ``(images (N, H, W) uint8, labels (N,) int64 in 0..9)`` of ``part`` ("train"/"test")."""
    images_path, labels_path = (_idx_path(source, stem) for stem in IDX_FILES[part])
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    for path, array, ndim, shape, kind in (
        (images_path, images, 3, "(N, height, width)", "an image"),
        (labels_path, labels, 1, "(N,)", "a label"),
    ):
        if array.ndim != ndim or array.dtype != np.uint8:
            raise FashionMnistError(
                f"{path}: expected {shape} unsigned bytes, "
                f"got shape {array.shape} of {array.dtype}; is it {kind} file?"
            )
    if len(images) != len(labels):
        raise FashionMnistError(
            f"{images_path} holds {len(images)} images but {labels_path} {len(labels)} labels; "
            f"the two files are from different releases or one is damaged: {_REFETCH}"
        )
    if labels.max(initial=0) >= len(FASHION_MNIST_CLASSES):
        raise FashionMnistError(
            f"{labels_path} holds label {labels.max()}, Fashion-MNIST has 0..9; {_REFETCH}"
        )
    return images, labels.astype(np.int64)


def _idx_path(source: Path, stem: str) -> Path | None:
    return next((source / n for n in (f"{stem}.gz", stem) if (source / n).is_file()), None)


def _missing(folder: Path) -> list[str]:
    stems = [stem for pair in IDX_FILES.values() for stem in pair]
    return [stem for stem in stems if _idx_path(folder, stem) is None]


def torchvision_download(cache: Path) -> Path:
    """Download the four files with torchvision into ``cache``; the folder holding them. Any failure
    (no torchvision, no network) raises ``OSError``."""
    try:
        from torchvision.datasets import FashionMNIST

        FashionMNIST(str(cache), train=True, download=True)
        FashionMNIST(str(cache), train=False, download=True)
    # ImportError, URLError, timeouts, checksum RuntimeError: all mean "not downloadable here"
    except Exception as e:
        raise OSError(str(e).splitlines()[0] if str(e) else type(e).__name__) from e
    return cache / "FashionMNIST" / "raw"


def resolve_source(
    source: str | os.PathLike[str] | None = None,
    *,
    debian_dir: Path = DEBIAN_DIR,
    download: Callable[[Path], Path] | None = torchvision_download,
    cache: Path | None = None,
) -> Path:
    """The folder to read: ``source`` when given (no fallback), else ``debian_dir``, else a cached or fresh
    ``download`` (``None``: none) into ``cache`` (default ``$XDG_CACHE_HOME/vit5/fashion-mnist``)."""
    if source is not None:
        folder = Path(source).expanduser()
        if not folder.is_dir():
            raise FashionMnistError(f"--source {folder} is not a folder; {_WHERE}")
        missing = _missing(folder)
        if missing:
            raise FashionMnistError(f"--source {folder} lacks {', '.join(missing)} (.gz); {_WHERE}")
        return folder
    if cache is None:
        cache_home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        cache = Path(cache_home) / "vit5" / "fashion-mnist"
    for folder in (debian_dir, cache / "FashionMNIST" / "raw"):
        if not _missing(folder):
            return folder
    reason = "no download tried"
    if download is not None:
        try:
            folder = download(cache)
            if not _missing(folder):
                return folder
            reason = f"the download left no IDX files in {folder}"
        except OSError as e:
            reason = f"torchvision's download failed: {e}"
    raise FashionMnistError(
        f"Fashion-MNIST not found in {debian_dir} and {reason}; run `{INSTALL_HINT}` "
        f"(or pass --source DIR holding the four IDX files)"
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
) -> ExportReport:
    """Write the train / val / test tree under ``root`` (grey PNGs; see the module docstring) from the
    source :func:`resolve_source` finds; ``val_size`` images of the training part, class-stratified and
    fixed by ``seed``, form val. A tree from an export with other arguments is a ``FileExistsError``."""
    folder = resolve_source(source, debian_dir=debian_dir, download=download, cache=cache)
    train_images, train_labels = load_part(folder, "train")
    test_images, test_labels = load_part(folder, "test")
    classes = len(np.unique(train_labels))
    count = len(train_labels)
    if type(val_size) is not int or not classes <= val_size <= count - classes:
        raise FashionMnistError(
            f"--val-size {val_size} must be an integer from {classes} to {count - classes} "
            f"(each split needs every class) for {count} training images"
        )
    train_idx, val_idx = stratified_split(train_labels, val_size, seed)
    parts = {
        "train": (train_images, train_labels, train_idx),
        "val": (train_images, train_labels, val_idx),
        "test": (test_images, test_labels, np.arange(len(test_labels))),
    }
    splits = {
        split: zip(indices.tolist(), labels[indices].tolist(), images[indices])
        for split, (images, labels, indices) in parts.items()
    }
    name = f"fashion-mnist ({folder})"
    return write_image_tree(Path(root), splits, FASHION_MNIST_CLASSES, 5, name)
