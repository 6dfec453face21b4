"""Hostile folders: link loops, links outside the root, FIFOs, unreadable folders, undecodable names.

One walker (:func:`vit5.data.image_files`) serves training, evaluation and visualisation, so each case
is checked once on it and once through the tool that hit it.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from pathlib import Path

import pytest
from data_images import random_rgb, write_png

from vit5.data import (
    BadImageError,
    BadImageWarning,
    ImageFolderDataset,
    ImageFolderError,
    decode_image,
    image_files,
)

pytestmark = pytest.mark.skipif(
    sys.platform == "win32", reason="POSIX links, FIFOs and byte file names"
)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """``train/<0|1>/`` with 3 PNGs each."""
    for label in ("0", "1"):
        for i in range(3):
            write_png(
                tmp_path / "train" / label / f"{i}.png", random_rgb(8, 8, seed=10 * int(label) + i)
            )
    return tmp_path


def listed(dataset: ImageFolderDataset) -> list[tuple[str, int]]:
    return [(Path(p).relative_to(dataset.root).as_posix(), t) for p, t in dataset.samples]


def test_a_link_loop_lists_each_image_once_with_its_own_label(data):
    clean = listed(ImageFolderDataset(data, "train"))
    os.symlink("..", data / "train" / "0" / "loop")  # a link loop once made 60 images 2460
    os.symlink(".", data / "train" / "1" / "self")
    with pytest.warns(BadImageWarning) as caught:
        looped = listed(ImageFolderDataset(data, "train"))
    assert looped == clean
    messages = sorted(str(w.message) for w in caught)
    assert "loop (a link to" in messages[0] and "outside" in messages[0]
    assert "self (a link back to a folder already listed)" in messages[1]


def test_links_are_followed_inside_the_root_once_and_outside_only_when_asked(data, tmp_path):
    outside = tmp_path / "elsewhere"
    write_png(outside / "x.png", random_rgb(8, 8, seed=7))
    folder = data / "train" / "0"
    os.symlink(folder / "0.png", folder / "same_file.png")  # a second path to one file
    (folder / "sub").mkdir()
    os.symlink(outside, folder / "sub" / "out")
    with pytest.warns(BadImageWarning, match="outside"):
        names = [p.relative_to(folder).as_posix() for p in image_files(folder)]
    assert names == ["0.png", "1.png", "2.png"]  # each file once, nothing from outside
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opted_in = [
            p.relative_to(folder).as_posix() for p in image_files(folder, follow_outside=True)
        ]
    assert opted_in == ["0.png", "1.png", "2.png", "sub/out/x.png"]


def test_a_fifo_named_like_an_image_is_never_opened(data):
    fifo = data / "train" / "0" / "pipe.png"
    os.mkfifo(fifo)
    with pytest.warns(BadImageWarning, match=r"pipe.png \(not a regular file: a FIFO\)"):
        dataset = ImageFolderDataset(data, "train")
    assert str(fifo) not in [p for p, _ in dataset.samples]
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            decode_image(fifo)
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 (reported to the test thread)
            outcome.append(err)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # release the blocked open before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("decode_image blocked on a FIFO")
    assert isinstance(outcome[0], BadImageError) and "not a regular file" in str(outcome[0])


def test_an_unreadable_folder_is_reported_as_unreadable(data, monkeypatch):
    blocked = str(data / "train" / "1")
    scandir = os.scandir

    def no_permission(path="."):
        if os.fspath(path) == blocked:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", no_permission)
    with pytest.raises(ImageFolderError, match=rf"cannot read folder {blocked}: permission denied"):
        ImageFolderDataset(data, "train")


def test_undecodable_file_names_are_listed_and_reported_safely(data, tmp_path):
    raw = os.fsencode(data / "train" / "1") + b"/caf\xe9-\xff.png"  # Latin-1 bytes, not UTF-8
    with open(raw, "wb") as f:
        f.write(b"not a png")
    dataset = ImageFolderDataset(data, "train")
    bad = [p for p, _ in dataset.samples if os.fsencode(p) == raw]
    assert len(bad) == 1
    with pytest.raises(BadImageError) as caught:
        decode_image(bad[0])
    assert os.fsencode(caught.value.path) == raw

    from vit5.train.rundir import format_summary, write_summary

    summary = {
        "run_dir": "r",
        "status": "completed",
        "epochs": 1,
        "updates": 1,
        "model": "m",
        "best_top1": None,
        "best_epoch": -1,
        "final_top1": None,
        "final_top5": None,
        "ema_top1": None,
        "best_ema_top1": None,
        "wall_seconds": 1.0,
        "train_seconds": 1.0,
        "train_images_per_s": 1.0,
        "num_processes": 1,
        "bad_files": 1,
        "bad_file_paths": bad,
    }
    write_summary(tmp_path, summary)
    text = (tmp_path / "summary.txt").read_text(encoding="utf-8")  # valid UTF-8, the name escaped
    assert "caf\\xe9-\\xff.png" in text and text.startswith(format_summary(summary).splitlines()[0])


def test_listing_order_hard_links_and_names_that_sort_around_folders(tmp_path):
    # the walk lists without a stat per file: paths still come out sorted as strings (a folder sorts as
    # "name/"), a hard link is a second path to a listed file, and a symlinked file sorts by its name
    root = tmp_path / "c"
    for name in ("a.png", "a/x.png", "a-b.png", "a0.png", "b/c/d.png"):
        write_png(root / name, random_rgb(4, 4))
    os.link(root / "a0.png", root / "hard.png")
    os.symlink(root / "b" / "c" / "d.png", root / "0link.png")
    names = [p.relative_to(root).as_posix() for p in image_files(root)]
    assert names == ["0link.png", "a-b.png", "a.png", "a/x.png", "a0.png"]  # b/c/d.png is 0link.png
    assert names == sorted(names)
