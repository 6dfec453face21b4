"""WebDataset shards: who reads which sample (processes x loader workers), shuffling, exact resume,
bad samples, and the ImageFolder -> shards conversion (resumable, atomic, class names)."""

import io
import json
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path

import pytest
import torch
from shard_support import IndexTransform, index_of, write_indexed_folder

from vit5.data import BadImageWarning, ShardDataset, ShardError, shard_loader, write_shards
from vit5.data.decode import decode_bytes
from vit5.data.shards import INFO_FILE, count_samples, expand_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """53 samples in 6 shards (5 of 10, one of 3), 3 classes."""
    root = tmp_path_factory.mktemp("shards")
    write_indexed_folder(root / "src" / "train", 53)
    report = write_shards(root / "src" / "train", root / "out", 10)
    assert (report.shards, report.samples, report.written) == (6, 53, 6)
    return root / "out"


def read_epoch(path, *, train, world, workers, batch=4, epoch=1, skip=0, buffer=5, seed=0):
    """Per rank: the list of batches (index lists, label lists) one epoch yields."""
    out = []
    for rank in range(world):
        dataset = ShardDataset(
            path,
            IndexTransform(),
            batch_size=batch,
            train=train,
            num_replicas=world,
            rank=rank,
            num_workers=workers,
            seed=seed,
            shuffle_buffer=buffer,
        )
        dataset.set_epoch(epoch, skip)
        batches = [
            (x.tolist(), y.tolist()) for x, y in shard_loader(dataset, persistent_workers=False)
        ]
        # the same on every rank: no process waits for another
        assert len(batches) == len(dataset) == dataset.batches - skip // (world * batch)
        assert all(len(x) == batch for x, _ in batches)
        out.append(batches)
    return out


@pytest.mark.parametrize("world,workers", [(1, 0), (2, 2), (3, 1), (4, 2)])
def test_each_sample_read_once_per_epoch_across_processes_and_workers(shards, world, workers):
    # 6 shards over up to 8 readers: ranges split inside shards, none dropped or read twice
    ranks = read_epoch(shards, train=True, world=world, workers=workers)
    seen = [i for batches in ranks for x, y in batches for i in x]
    per_rank = 53 // (world * 4)
    assert (
        len(seen) == len(set(seen)) == per_rank * world * 4
    )  # no duplicates; the tail < one global batch
    labels = {i: lab for batches in ranks for x, y in batches for i, lab in zip(x, y)}
    assert all(labels[i] == i % 3 for i in seen)

    ranks = read_epoch(shards, train=False, world=world, workers=workers)
    counted = [i for batches in ranks for x, y in batches for i, lab in zip(x, y) if lab >= 0]
    assert sorted(counted) == list(
        range(53)
    )  # validation: every sample exactly once, padding marked -1


def test_shuffle_is_fixed_by_seed_and_epoch(shards):
    def order(epoch, seed=0):
        return [
            b
            for batches in read_epoch(
                shards, train=True, world=1, workers=0, epoch=epoch, seed=seed
            )
            for b in batches
        ]

    first = order(1)
    assert order(1) == first  # repeatable
    assert order(2) != first and order(1, seed=5) != first
    stream = [i for x, _ in first for i in x]
    assert stream != sorted(stream)


@pytest.mark.parametrize("world,workers", [(1, 0), (1, 3), (2, 2)])
def test_resume_skips_exactly_the_consumed_batches(shards, world, workers):
    full = read_epoch(shards, train=True, world=world, workers=workers, batch=2, epoch=3)
    for done in (1, 2, len(full[0]) - 1, len(full[0])):
        resumed = read_epoch(
            shards,
            train=True,
            world=world,
            workers=workers,
            batch=2,
            epoch=3,
            skip=done * 2 * world,
        )
        assert resumed == [batches[done:] for batches in full], done  # same batches, same order


def test_resume_with_another_world_size_keeps_the_epoch_length(shards):
    # 4 global batches of 8 consumed under 2 processes; resumed under 1: it skips 4 of its 13 batches
    (resumed,) = read_epoch(shards, train=True, world=1, workers=0, skip=4 * 4 * 2)
    assert len(resumed) == 53 // 4 - 8


def test_shard_lists_patterns_and_folders(shards):
    files = sorted(str(p) for p in shards.glob("*.tar"))
    assert expand_shards(shards) == files
    assert expand_shards(str(shards / "train-{000000..000005}.tar")) == files
    assert expand_shards([files[0], str(shards / "train-{000001..000002}.tar")]) == files[:3]
    with pytest.raises(ShardError, match="1 of 7 shards do not exist"):
        expand_shards(str(shards / "train-{000000..000006}.tar"))
    assert [count_samples(f) for f in files] == json.loads((shards / INFO_FILE).read_text())[
        "splits"
    ]["train"]["shard_lengths"]


def test_class_names_come_from_the_classes_file_or_num_classes(shards, tmp_path):
    dataset = ShardDataset(shards, IndexTransform(), batch_size=4, train=True)
    assert dataset.class_names == ["c0", "c1", "c2"]
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "a.tar").write_bytes((shards / "train-000000.tar").read_bytes())
    with pytest.raises(ShardError, match="set data.num_classes"):
        ShardDataset(bare, IndexTransform(), batch_size=4, train=True)
    assert ShardDataset(
        bare, IndexTransform(), batch_size=4, train=True, num_classes=3
    ).class_names == [
        "0",
        "1",
        "2",
    ]
    with pytest.raises(ShardError, match="names 3 classes"):
        ShardDataset(shards, IndexTransform(), batch_size=4, train=True, num_classes=5)


def _tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_bad_samples_are_skipped_counted_and_replaced(shards, tmp_path):
    good = tmp_path / "good.tar"
    members = []
    with tarfile.open(shards / "train-000000.tar") as tar:
        for member in tar.getmembers()[:12]:  # 6 good samples
            members.append((member.name, tar.extractfile(member).read()))
    bad = [
        ("b1.png", b"not an image"),
        ("b1.cls", b"1"),  # undecodable
        ("b2.png", members[0][1]),
        ("b2.cls", b"seven"),  # unreadable label
        ("b3.png", members[0][1]),
        ("b3.cls", b"9"),  # label out of range
        ("b4.cls", b"0"),  # no image
    ]
    _tar(good, members[:6] + bad + members[6:])
    (tmp_path / "classes.txt").write_text("c0\nc1\nc2\n")
    dataset = ShardDataset(tmp_path, IndexTransform(), batch_size=2, train=True, shuffle_buffer=0)
    assert dataset.num_samples == 10
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = [x.tolist() for x, _ in shard_loader(dataset)]
    assert len(batches) == 5 and all(len(b) == 2 for b in batches)  # batches keep their size
    stream = [i for b in batches for i in b]
    good_indices = [
        index_of(decode_bytes(data, name)) for name, data in members if name.endswith(".png")
    ]
    # the 4 bad places (positions 3..6) are taken by the next good sample
    assert stream == good_indices[:3] + [good_indices[3]] * 5 + good_indices[4:]
    assert dataset.num_bad == 4
    assert sorted(dataset.bad_files) == [f"{good}#{i}" for i in (3, 4, 5, 6)]
    messages = " ".join(str(w.message) for w in caught if issubclass(w.category, BadImageWarning))
    assert (
        "cannot decode" in messages
        and "unreadable label" in messages
        and "outside 0 .. 2" in messages
    )
    assert "no image" in messages

    val = ShardDataset(tmp_path, IndexTransform(), batch_size=4, train=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        labels = torch.cat([y for _, y in shard_loader(val)])
    assert (labels >= 0).sum() == 6 and len(labels) == 12  # bad ones are padding, not counted


def test_a_truncated_shard_loses_its_tail_not_the_run(shards, tmp_path):
    source = shards / "train-000001.tar"
    with tarfile.open(source) as tar:
        cut = tar.getmembers()[6].offset_data + 20  # inside sample 3's image
    (tmp_path / "t.tar").write_bytes(source.read_bytes()[:cut])

    def read(index_says: int | None):
        if index_says is not None:  # an index written before the shard was damaged
            lengths = [10, index_says]
            info = dict(splits=dict(t=dict(filenames=["a.tar", "t.tar"], shard_lengths=lengths)))
            (tmp_path / INFO_FILE).write_text(json.dumps(info))
        (tmp_path / "a.tar").write_bytes((shards / "train-000000.tar").read_bytes())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dataset = ShardDataset(
                tmp_path,
                IndexTransform(),
                batch_size=2,
                train=True,
                shuffle_buffer=0,
                num_classes=3,
            )
            batches = [x.tolist() for x, _ in shard_loader(dataset)]
        assert len(batches) == len(dataset) == dataset.num_samples // 2
        return dataset, " ".join(str(w.message) for w in caught)

    dataset, messages = read(None)  # counted from the headers: samples 0-3, the 4th truncated
    assert dataset.num_samples == 14 and dataset.bad_files == [f"{tmp_path / 't.tar'}#3"]
    assert (
        "t.tar is damaged after 4 samples" in messages
        and "t.tar: shard unreadable from sample 3" in messages
    )
    dataset, messages = read(10)
    assert dataset.num_samples == 20 and dataset.bad_files == [
        f"{tmp_path / 't.tar'}#{i}" for i in range(3, 10)
    ]


def test_conversion_resumes_after_a_killed_shard_and_keeps_class_names(tmp_path):
    src = tmp_path / "src"
    samples = write_indexed_folder(src, 23, classes=2)
    first = write_shards(src, tmp_path / "a", 5, split="train")
    assert (first.shards, first.samples) == (5, 23)
    assert (tmp_path / "a" / "classes.txt").read_text() == "c0\nc1\n"
    info = json.loads((tmp_path / "a" / INFO_FILE).read_text())["splits"]["train"]
    assert info["shard_lengths"] == [5, 5, 5, 5, 3] and info["num_samples"] == 23

    # a run killed while writing shard 3: shards 0-2 complete, a partial temporary file, no later shards
    out = tmp_path / "b"
    write_shards(src, out, 5, split="train")
    for name in ("train-000003.tar", "train-000004.tar", INFO_FILE):
        (out / name).unlink()
    (out / "train-000003.tar.tmp").write_bytes(b"partial")
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("*.tar")}
    report = write_shards(src, out, 5, split="train")
    assert (report.written, report.kept, report.samples) == (2, 3, 23)
    assert {
        p.name: p.stat().st_mtime_ns for p in out.glob("train-00000[012].tar")
    } == kept  # not rewritten
    assert not list(out.glob("*.tmp"))
    for name in sorted(
        p.name for p in (tmp_path / "a").glob("*.tar")
    ):  # the same shards as one clean run
        assert _members(out / name) == _members(tmp_path / "a" / name)

    dataset = ShardDataset(out, IndexTransform(), batch_size=1, train=False)
    pairs = sorted((x.item(), y.item()) for x, y in shard_loader(dataset))
    assert pairs == samples  # every image once, with its class index
    with pytest.raises(ShardError, match="another plan"):
        write_shards(src, out, 7, split="train")


def _members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def test_the_command_line_converts_and_names_a_bad_source(tmp_path):
    write_indexed_folder(tmp_path / "train", 9, classes=3)
    command = [
        sys.executable,
        "-m",
        "vit5",
        "data",
        "shards",
        str(tmp_path / "train"),
        str(tmp_path / "out"),
    ]
    done = subprocess.run(
        [*command, "--shard-size", "4"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "train: 9 samples in 3 shards" in done.stdout and "3 written, 0 kept" in done.stdout
    assert (tmp_path / "out" / "classes.txt").read_text() == "c0\nc1\nc2\n"
    done = subprocess.run(
        [*command, "--shard-size", "5"], capture_output=True, text=True, timeout=120
    )
    assert (
        done.returncode == 2 and done.stderr.startswith("error: ") and "another plan" in done.stderr
    )
    assert len(done.stderr.strip().splitlines()) == 1
