"""The Fashion-MNIST export on small IDX files written here (gzipped and raw): the reader against an
independent writer, split counts and stratification, file names, idempotence and resume, damaged or
missing sources as one clear error, and the --source precedence. The real files are never needed."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import cv2
import numpy as np
import pytest

from vit5.cli.data import main
from vit5.data.fashion_mnist import (
    FASHION_MNIST_CLASSES,
    FashionMnistError,
    export_fashion_mnist,
    read_idx,
    resolve_source,
)

PER_CLASS_TRAIN, PER_CLASS_TEST, SIDE = 8, 3, 6  # 80 training and 30 test images of 6x6 px
NO_DOWNLOAD = dict(download=None)


def write_idx(path: Path, array: np.ndarray, gz: bool) -> Path:
    """The IDX format written out by hand: 0, 0, type 0x08 (unsigned byte), ndim, big-endian dims, data."""
    payload = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload += array.astype(np.uint8).tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        payload = gzip.compress(payload)
    path.write_bytes(payload)
    return path


def make_source(
    folder: Path, gz: bool = True, seed: int = 0
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Four IDX files in ``folder``; class-balanced, shuffled labels; returns (images, labels) per part."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    parts = {}
    for part, prefix, per_class in (
        ("train", "train", PER_CLASS_TRAIN),
        ("test", "t10k", PER_CLASS_TEST),
    ):
        labels = rng.permutation(np.repeat(np.arange(10), per_class)).astype(np.uint8)
        images = rng.integers(0, 256, size=(len(labels), SIDE, SIDE), dtype=np.uint8)
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images, gz)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels, gz)
        parts[part] = (images, labels)
    return parts


def files(root: Path, split: str) -> dict[int, str]:
    """Index -> class folder of every exported PNG of ``split``."""
    return {int(p.stem): p.parent.name for p in (root / split).glob("*/*.png")}


@pytest.mark.parametrize("gz", [True, False])
def test_the_reader_returns_what_the_writer_wrote(tmp_path, gz):
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = write_idx(tmp_path / "x-idx3-ubyte", array, gz)
    read = read_idx(path)
    assert read.shape == (2, 3, 4) and read.dtype == np.uint8
    np.testing.assert_array_equal(read, array)


def test_export_counts_stratification_names_and_pixels(tmp_path):
    parts = make_source(tmp_path / "src")
    report = export_fashion_mnist(
        tmp_path / "out", tmp_path / "src", val_size=20, seed=3, **NO_DOWNLOAD
    )
    out = tmp_path / "out"
    train, val, test = files(out, "train"), files(out, "val"), files(out, "test")
    assert (len(train), len(val), len(test)) == (60, 20, 30)
    assert sorted(train.keys() | val.keys()) == list(range(80)) and not train.keys() & val.keys()
    assert sorted(test) == list(range(30))
    assert sorted(p.name for p in (out / "test").iterdir()) == sorted(FASHION_MNIST_CLASSES)
    assert all(sum(1 for c in val.values() if c == name) == 2 for name in FASHION_MNIST_CLASSES)
    assert report.counts["val"] == dict.fromkeys(FASHION_MNIST_CLASSES, 2)
    assert (report.written, report.unchanged) == (110, 0)
    for split, part in (("train", "train"), ("val", "train"), ("test", "test")):
        images, labels = parts[part]
        for index, name in files(out, split).items():
            assert name == FASHION_MNIST_CLASSES[labels[index]]
            png = cv2.imread(str(out / split / name / f"{index:05d}.png"), cv2.IMREAD_UNCHANGED)
            np.testing.assert_array_equal(png, images[index])  # grey, lossless, in IDX order


def test_the_split_is_fixed_by_the_seed(tmp_path):
    make_source(tmp_path / "src", gz=False)
    export_fashion_mnist(tmp_path / "a", tmp_path / "src", val_size=20, seed=1, **NO_DOWNLOAD)
    export_fashion_mnist(tmp_path / "b", tmp_path / "src", val_size=20, seed=1, **NO_DOWNLOAD)
    export_fashion_mnist(tmp_path / "c", tmp_path / "src", val_size=20, seed=2, **NO_DOWNLOAD)
    assert (
        files(tmp_path / "a", "val") == files(tmp_path / "b", "val") != files(tmp_path / "c", "val")
    )


def test_a_rerun_writes_nothing_and_an_interrupted_export_completes(tmp_path):
    make_source(tmp_path / "src")
    args = dict(source=tmp_path / "src", val_size=20, **NO_DOWNLOAD)
    out = tmp_path / "out"
    export_fashion_mnist(out, **args)
    again = export_fashion_mnist(out, **args)
    assert (again.written, again.unchanged) == (0, 110)
    victims = sorted((out / "train").glob("*/*.png"))[:3]
    victims[0].unlink()  # never written
    victims[1].write_bytes(b"half a png")  # a damaged file
    (victims[2].parent / f".{victims[2].name}.123.partial").write_bytes(
        b"x"
    )  # a crashed atomic write
    victims[2].unlink()
    resumed = export_fashion_mnist(out, **args)
    assert (resumed.written, resumed.unchanged) == (3, 107)
    assert all(cv2.imread(str(p), cv2.IMREAD_UNCHANGED).shape == (SIDE, SIDE) for p in victims)


def test_an_export_with_other_split_arguments_is_refused(tmp_path):
    make_source(tmp_path / "src")
    export_fashion_mnist(tmp_path / "out", tmp_path / "src", val_size=20, seed=0, **NO_DOWNLOAD)
    with pytest.raises(FileExistsError, match="would not write.*other arguments.*delete"):
        export_fashion_mnist(tmp_path / "out", tmp_path / "src", val_size=20, seed=5, **NO_DOWNLOAD)
    with pytest.raises(FileExistsError, match="would not write"):
        export_fashion_mnist(tmp_path / "out", tmp_path / "src", val_size=30, seed=0, **NO_DOWNLOAD)


def _damage(folder: Path, how: str) -> str:
    images = folder / "train-images-idx3-ubyte.gz"
    data = gzip.decompress(images.read_bytes())
    if how == "truncated":
        images.write_bytes(gzip.compress(data[:-5]))
        return "truncated: its IDX header gives shape \\(80, 6, 6\\)"
    if how == "bad gzip":
        images.write_bytes(images.read_bytes()[:-12])
        return "truncated or corrupt gzip"
    if how == "not idx":
        images.write_bytes(gzip.compress(b"GIF89a" + data))
        return "not an IDX file"
    if how == "count mismatch":
        labels = np.zeros(79, dtype=np.uint8)
        write_idx(folder / "train-labels-idx1-ubyte", labels, gz=True)
        return "80 images but .* 79 labels"
    write_idx(folder / "train-labels-idx1-ubyte", np.full(80, 12, dtype=np.uint8), gz=True)
    return "label 12, Fashion-MNIST has 0..9"


@pytest.mark.parametrize("how", ["truncated", "bad gzip", "not idx", "count mismatch", "bad label"])
def test_a_damaged_source_is_one_clear_error_and_writes_nothing(tmp_path, how, capsys):
    make_source(tmp_path / "src")
    message = _damage(tmp_path / "src", how)
    with pytest.raises(FashionMnistError, match=message):
        export_fashion_mnist(tmp_path / "out", tmp_path / "src", val_size=20, **NO_DOWNLOAD)
    assert not (tmp_path / "out").exists()
    assert main(["fashion-mnist", str(tmp_path / "out"), "--source", str(tmp_path / "src")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_a_missing_source_names_the_debian_package(tmp_path, capsys):
    empty = tmp_path / "nothing"
    empty.mkdir()
    with pytest.raises(FashionMnistError, match="run `apt-get install dataset-fashion-mnist`"):
        resolve_source(None, debian_dir=empty, download=None, cache=tmp_path / "cache")

    def offline(cache: Path) -> Path:
        raise OSError("<urlopen error [Errno -3] Temporary failure in name resolution>")

    with pytest.raises(FashionMnistError, match="download failed: <urlopen error.*apt-get install"):
        resolve_source(None, debian_dir=empty, download=offline, cache=tmp_path / "cache")
    make_source(tmp_path / "half")
    (tmp_path / "half" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FashionMnistError, match="lacks t10k-labels-idx1-ubyte"):
        resolve_source(tmp_path / "half")
    assert (
        main(["fashion-mnist", str(tmp_path / "out"), "--source", str(tmp_path / "missing")]) == 2
    )
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "is not a folder" in err
        and "apt-get install dataset-fashion-mnist" in err
    )


def test_source_wins_over_the_debian_folder_which_wins_over_a_download(tmp_path, capsys):
    source, debian = make_source(tmp_path / "src", seed=1), make_source(tmp_path / "debian", seed=2)
    assert not np.array_equal(source["test"][0], debian["test"][0])

    def must_not_download(cache: Path) -> Path:
        raise AssertionError("downloaded although a folder holds the files")

    options = dict(
        debian_dir=tmp_path / "debian", download=must_not_download, cache=tmp_path / "cache"
    )
    assert resolve_source(tmp_path / "src", **options) == tmp_path / "src"
    assert resolve_source(None, **options) == tmp_path / "debian"
    export_fashion_mnist(tmp_path / "out", tmp_path / "src", val_size=20, **options)
    first = next(iter(files(tmp_path / "out", "test").items()))
    png = cv2.imread(
        str(tmp_path / "out" / "test" / first[1] / f"{first[0]:05d}.png"), cv2.IMREAD_UNCHANGED
    )
    np.testing.assert_array_equal(png, source["test"][0][first[0]])

    fetched = tmp_path / "cache" / "FashionMNIST" / "raw"
    empty = tmp_path / "empty"
    empty.mkdir()

    def download(cache: Path) -> Path:
        make_source(fetched, gz=False)
        return fetched

    assert (
        resolve_source(None, debian_dir=empty, download=download, cache=tmp_path / "cache")
        == fetched
    )
    assert (
        main(
            [
                "fashion-mnist",
                str(tmp_path / "cli"),
                "--source",
                str(tmp_path / "src"),
                "--val-size",
                "10",
            ]
        )
        == 0
    )
    assert "train 70, val 10, test 30 images; 110 written" in capsys.readouterr().out


def test_the_command_line_defaults_are_the_library_ones():
    from vit5.cli import data as cli_data
    from vit5.data import fashion_mnist

    assert cli_data.FASHION_VAL_SIZE == fashion_mnist.DEFAULT_VAL_SIZE
    assert cli_data.FASHION_INSTALL == fashion_mnist.INSTALL_HINT
