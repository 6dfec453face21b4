"""Write an ImageFolder split as WebDataset shards (``vit5 data shards SRC OUT --shard-size N``): files in a
seeded order, ``<key>.<ext>`` (bytes as stored; formats other than jpg/png/webp as PNG) + ``<key>.cls``, plus
``classes.txt`` and timm's ``_info.json``. Resumable: each shard is renamed into place when complete, and
``OUT/.<split>-plan.json`` refuses a rerun with another source, shard size or seed.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from vit5.data.decode import BadImageError, decode_image
from vit5.data.folder import ImageFolderDataset
from vit5.data.shards import CLASSES_FILE, INFO_FILE, SHARD_IMAGE_KEYS, ShardError, count_samples
from vit5.files import atomic_write_json, atomic_write_text

_STORED_AS_IS = {f".{k}": k for k in SHARD_IMAGE_KEYS} | {".jpe": "jpg"}


@dataclass(frozen=True)
class ShardReport:
    out: Path
    split: str
    shards: int  # shards of the split in OUT now
    written: int  # shards written by this call
    kept: int  # complete shards found from an earlier call
    samples: int
    skipped: list[str]  # source files that could not be stored (unreadable, not re-encodable)

    def __str__(self) -> str:
        skipped = (
            f"; skipped {len(self.skipped)} unreadable file(s), e.g. {self.skipped[0]}"
            if self.skipped
            else ""
        )
        return (
            f"{self.split}: {self.samples} samples in {self.shards} shards under {self.out} "
            f"({self.written} written, {self.kept} kept from an earlier run){skipped}"
        )


def write_shards(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    shard_size: int,
    *,
    split: str | None = None,
    seed: int = 0,
) -> ShardReport:
    """Write the ImageFolder split ``src`` (class sub-folders) as shards ``out/<split>-000000.tar``, ...;
    ``split`` (default ``src``'s folder name) also names the ``_info.json`` split."""
    if shard_size < 1:
        raise ShardError(f"--shard-size must be >= 1, got {shard_size}")
    source = ImageFolderDataset(src)
    split = split or Path(os.path.abspath(src)).name
    out = Path(out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    _check_classes(out / CLASSES_FILE, source.class_names)
    plan = dict(source=os.path.abspath(src), files=len(source), shard_size=shard_size, seed=seed)
    _check_plan(out / f".{split}-plan.json", plan)
    order = np.random.default_rng(seed).permutation(len(source)).tolist()
    names, lengths, skipped = [], [], []
    written = kept = 0
    for number, first in enumerate(range(0, len(order), shard_size)):
        path = out / f"{split}-{number:06d}.tar"
        names.append(path.name)
        if path.exists():
            lengths.append(count_samples(str(path)))
            kept += 1
            continue
        count, bad = _write_shard(path, source, order[first : first + shard_size], first)
        lengths.append(count)
        skipped.extend(bad)
        written += 1
    for stale in out.glob(f"{split}-*.tar.tmp"):
        stale.unlink()
    _update_info(out / INFO_FILE, split, names, lengths)
    return ShardReport(out, split, len(names), written, kept, sum(lengths), skipped)


def _write_shard(
    path: Path, source: ImageFolderDataset, indices: list[int], first: int
) -> tuple[int, list[str]]:
    temporary = path.with_name(path.name + ".tmp")
    count, skipped = 0, []
    with (
        open(temporary, "wb") as stream,
        tarfile.open(fileobj=stream, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for position, index in enumerate(indices, start=first):
            file, label = source.samples[index]
            try:
                data, ext = _image_bytes(file)
            except (BadImageError, OSError) as err:
                skipped.append(str(err))
                continue
            key = f"{position:09d}"
            _add(tar, f"{key}.{ext}", data)
            _add(tar, f"{key}.cls", str(label).encode("ascii"))
            count += 1
        tar.close()
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(temporary, path)
    return count, skipped


def _image_bytes(file: str) -> tuple[bytes, str]:
    ext = _STORED_AS_IS.get(os.path.splitext(file)[1].lower())
    if ext is not None:
        return Path(file).read_bytes(), ext
    ok, encoded = cv2.imencode(".png", cv2.cvtColor(decode_image(file), cv2.COLOR_RGB2BGR))
    if not ok:
        raise BadImageError(file, "cannot be re-encoded as PNG")
    return encoded.tobytes(), "png"


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
    tar.addfile(info, io.BytesIO(data))


def _check_classes(path: Path, names: list[str]) -> None:
    if path.exists():
        found = [line for line in path.read_text(encoding="utf-8").splitlines() if line]
        if found != names:
            raise ShardError(
                f"{path} lists other classes ({len(found)}) than the source ({len(names)}): write the shards "
                "of a data set with other classes to another folder"
            )
        return
    if any("\n" in n for n in names):
        raise ShardError("a class folder name contains a line break; rename it")
    atomic_write_text(path, "".join(f"{n}\n" for n in names))


def _check_plan(path: Path, plan: dict[str, object]) -> None:
    if path.exists():
        before = json.loads(path.read_text())
        if before != plan:
            changed = ", ".join(
                f"{k} {before.get(k)!r} -> {v!r}" for k, v in plan.items() if before.get(k) != v
            )
            raise ShardError(
                f"{path.parent} holds shards written with another plan ({changed}); "
                "use a new output folder, or delete the old shards and the plan file to start over"
            )
        return
    atomic_write_json(path, plan)


def _update_info(path: Path, split: str, names: list[str], lengths: list[int]) -> None:
    info = json.loads(path.read_text()) if path.exists() else {}
    info.setdefault("splits", {})[split] = dict(
        name=split, num_samples=sum(lengths), filenames=names, shard_lengths=lengths
    )
    atomic_write_json(path, info)
