"""WebDataset shards (tar files, https://github.com/webdataset/webdataset#the-webdataset-format): the reader
(:class:`ShardDataset`, each sample read exactly once per epoch) and the writer (:func:`write_shards`). Beside
the shards, ``classes.txt`` names the classes and timm's ``_info.json`` gives the shard lengths (else the tar
headers are counted). Process, worker and resume layout: docs/training.md, "WebDataset shards"."""

import io
import json
import math
import os
import random
import tarfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from vit5.data.decode import BadImageError, decode_bytes, decode_image
from vit5.data.folder import BadImageWarning, BadSamples, ImageFolderDataset
from vit5.errors import InputError
from vit5.files import atomic_write_text, fsync_file
from vit5.outputs import write_json

SHARD_IMAGE_KEYS: tuple[str, ...] = ("jpg", "jpeg", "png", "webp")
_STORED_AS_IS = {f".{k}": k for k in SHARD_IMAGE_KEYS} | {".jpe": "jpg"}
CLASSES_FILE = "classes.txt"
INFO_FILE = "_info.json"
PAD_LABEL = -1  # validation padding: not counted
# ``(sample id, raw sample or None if unreadable)`` in stream order
RawSamples = Iterator[tuple[int, dict[str, Any] | None]]
Batches = Iterator[tuple[torch.Tensor, torch.Tensor]]


class ShardError(InputError):
    """The shards cannot form a data set (the message names the fix)."""


def _webdataset() -> Any:
    try:
        import webdataset
    except ImportError as err:  # an optional extra
        needs = "data.dataset=wds needs the webdataset package"
        raise ShardError(f"{needs}: pip install 'vit5[wds]'") from err
    return webdataset


def expand_shards(spec: str | os.PathLike[str] | Sequence[str]) -> list[str]:
    """The shard files of ``spec``: a brace pattern (``/data/train-{000000..001023}.tar``), a directory
    (its ``*.tar``, sorted), or a list of either; every file must exist."""
    items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    shards: list[str] = []
    for item in items:
        text = os.path.expanduser(os.fspath(item))
        if os.path.isdir(text):
            shards.extend(sorted(str(p) for p in Path(text).glob("*.tar")))
        else:
            shards.extend(_webdataset().shardlists.expand_urls(text))
    if not shards:
        raise ShardError(
            f"no shards in {spec!r}: give a brace pattern, a list or a directory holding *.tar",
        )
    missing = [s for s in shards if not os.path.isfile(s)]
    if missing:
        problem = f"{len(missing)} of {len(shards)} shards do not exist, e.g. {missing[0]}"
        raise ShardError(f"{problem}; check data.*_shards")
    return shards


def count_samples(path: str) -> int:
    """Samples in one shard, counted from the tar headers as webdataset groups them (consecutive members
    sharing a key; metadata and non-regular members skipped)."""
    key_of = _webdataset().tariterators.base_plus_ext
    count = 0
    last = None
    try:
        tar = tarfile.open(path, "r:")
    except (tarfile.TarError, OSError) as err:
        raise ShardError(f"{path} is not a readable tar file ({err}); re-create the shard") from err
    with tar:
        try:
            for info in tar:
                # metadata, as webdataset skips it
                if not info.isreg() or info.name.startswith("__"):
                    continue
                key, _ = key_of(info.name)
                if key is not None and key != last:
                    count += 1
                    last = key
        # truncated: what it has is read, the rest is lost
        except (tarfile.TarError, OSError) as err:
            message = f"{path} is damaged after {count} samples ({err})"
            warnings.warn(message, BadImageWarning, stacklevel=2)
    return count


def shard_lengths(shards: Sequence[str]) -> list[int]:
    """Samples per shard: from an ``_info.json`` beside the shards where it lists them, else counted."""
    known: dict[str, int] = {}
    for folder in sorted({os.path.dirname(s) for s in shards}):
        info_path = os.path.join(folder, INFO_FILE)
        if not os.path.isfile(info_path):
            continue
        try:
            splits = json.loads(Path(info_path).read_text()).get("splits", {})
            for split in splits.values():
                for name, length in zip(split["filenames"], split["shard_lengths"]):
                    known[os.path.join(folder, os.path.basename(name))] = int(length)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            problem = f"{info_path} is not a valid shard index ({err})"
            raise ShardError(f"{problem}; delete it to count") from err
    return [known[s] if s in known else count_samples(s) for s in shards]


def read_class_names(shards: Sequence[str], num_classes: int | None) -> list[str]:
    """Class names from ``classes.txt`` beside the first shard, else ``"0" .. str(num_classes - 1)``."""
    path = os.path.join(os.path.dirname(shards[0]), CLASSES_FILE)
    if os.path.isfile(path):
        names = _lines(Path(path))
        if num_classes is not None and num_classes != len(names):
            problem = f"data.num_classes={num_classes} but {path} names {len(names)} classes"
            raise ShardError(f"{problem}; drop one of the two")
        return names
    if num_classes is None:
        fix = "set data.num_classes (labels are 0 .. num_classes - 1)"
        raise ShardError(f"no {CLASSES_FILE} beside {shards[0]}: {fix}")
    return [str(i) for i in range(num_classes)]


class ShardDataset(BadSamples, IterableDataset):
    """Batches of ``(images, labels)`` for process ``rank`` of ``num_replicas``, each of its ``num_workers``
    workers (:func:`shard_loader`) reading its part of the epoch's stream: training ``N // (P * B)`` full
    batches (the rest :attr:`dropped`), validation every sample once (padding labelled ``-1``); bad samples
    flagged and replaced. The layout: docs/training.md, "What a process reads"."""

    def __init__(
        self,
        shards: str | os.PathLike[str] | Sequence[str],
        transform: Callable[[np.ndarray], torch.Tensor],
        *,
        batch_size: int,
        train: bool,
        num_replicas: int = 1,
        rank: int = 0,
        num_workers: int = 0,
        seed: int = 0,
        shuffle_buffer: int = 1000,
        class_names: Sequence[str] | None = None,
        num_classes: int | None = None,
        alpha_background: tuple[int, int, int] | None = None,
    ) -> None:
        if batch_size < 1 or num_workers < 0 or shuffle_buffer < 0:
            raise ValueError(
                f"need batch_size >= 1, num_workers >= 0, shuffle_buffer >= 0: {batch_size=}",
            )
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"need 0 <= rank < num_replicas; got {num_replicas=} {rank=}")
        self.shards = expand_shards(shards)
        self.lengths = shard_lengths(self.shards)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self.num_samples = int(self.offsets[-1])
        if class_names is None:
            class_names = read_class_names(self.shards, num_classes)
        self.class_names = list(class_names)
        self.transform = transform
        self.alpha_background = alpha_background
        self.batch_size = batch_size
        self.train = train
        self.num_replicas = num_replicas
        self.rank = rank
        self.num_workers = num_workers
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        if train:
            self.batches = self.num_samples // (num_replicas * batch_size)
            if self.batches == 0:
                raise ShardError(
                    f"{self.num_samples} training samples cannot fill one batch of {batch_size} "
                    f"on each of {num_replicas} process(es); lower data.batch_size"
                )
            self.dropped = self.num_samples - self.batches * num_replicas * batch_size
        else:
            if self.num_samples == 0:
                raise ShardError(f"the validation shards {self.shards[0]} ... hold no samples")
            slots = num_replicas * max(num_workers, 1)
            per_slot = math.ceil(math.ceil(self.num_samples / slots) / batch_size)
            self.batches = per_slot * max(num_workers, 1)
            self.dropped = 0
        self._bad = torch.zeros(self.num_samples, dtype=torch.bool).share_memory_()
        # the epoch and the samples to skip, seen by the workers
        self._position = torch.zeros(2, dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        """Batches this process still yields in the epoch (the same on every process)."""
        if not self.train:
            return self.batches
        return self.batches - int(self._position[1]) // (self.num_replicas * self.batch_size)

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """Read ``epoch`` next, skipping its first ``consumed`` samples (trained by all processes
        together); workers, persistent ones too, see it through shared memory."""
        total = self.batches * self.num_replicas * self.batch_size
        if not 0 <= consumed <= total:
            raise ValueError(f"consumed must be in [0, {total}], got {consumed}")
        self._position[0] = epoch
        self._position[1] = consumed

    def sample_name(self, index: int) -> str:
        """``shard.tar#i``: the ``i``-th sample of a shard."""
        shard = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return f"{self.shards[shard]}#{index - int(self.offsets[shard])}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(shards={len(self.shards)}, samples={self.num_samples}, "
            f"classes={len(self.class_names)}, train={self.train}, bad={self.num_bad})"
        )

    def __iter__(self) -> Batches:
        info = get_worker_info()
        workers = 1
        loader_worker = 0
        if info is not None:
            workers = info.num_workers
            loader_worker = info.id
        if workers != max(self.num_workers, 1):
            problem = f"built for {self.num_workers} workers but read by {workers}"
            raise RuntimeError(f"{problem}: use shard_loader(dataset)")
        epoch, skip = (int(v) for v in self._position.tolist())
        if self.train:
            yield from self._train_batches(epoch, skip, workers, loader_worker)
        else:
            yield from self._val_batches(workers, loader_worker)

    def _train_batches(self, epoch: int, skip: int, workers: int, loader_worker: int) -> Batches:
        # batches this process already took
        done = skip // (self.num_replicas * self.batch_size)
        # rotated: the loader's next turn is batch done + 1
        worker = (loader_worker + done) % workers
        counts = [len(range(w, self.batches, workers)) for w in range(workers)]
        taken = len(range(worker, done, workers))
        # in batches of the epoch's stream
        first = self.rank * self.batches + sum(counts[:worker])
        start = first * self.batch_size
        stop = (first + counts[worker]) * self.batch_size
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.shards))
        rng = random.Random(f"{self.seed}-{epoch}-{self.rank}-{worker}")
        size = self.shuffle_buffer
        shuffle = _webdataset().filters.shuffle(size, size, rng=rng)
        stream = shuffle(self._read(order, start, stop))
        # consumed before the interruption: bytes only
        for _ in range(taken * self.batch_size):
            next(stream)
        # full batches (all are)
        for batch in zip(*[self._good(stream)] * self.batch_size):
            yield tuple(default_collate(list(batch)))

    def _val_batches(self, workers: int, loader_worker: int) -> Batches:
        slots = self.num_replicas * workers
        slot = self.rank * workers + loader_worker
        start = self.num_samples * slot // slots
        stop = self.num_samples * (slot + 1) // slots
        order = np.arange(len(self.shards))
        wanted = self.batches // workers * self.batch_size
        batch: list[tuple[torch.Tensor, int]] = []
        pad: torch.Tensor | None = None
        sent = 0
        for index, raw in self._read(order, start, stop):
            decoded = self._decode(index, raw)
            if decoded is None:  # not counted: replaced by padding at the end
                continue
            pad = decoded[0]
            batch.append(decoded)
            if len(batch) == self.batch_size:
                yield tuple(default_collate(batch))
                sent += len(batch)
                batch = []
        if pad is None:  # an empty (or all-bad) range: pad with any readable sample
            pad = next(self._good(self._read(order, 0, self.num_samples)))[0]
        while sent < wanted:
            batch.extend((pad, PAD_LABEL) for _ in range(self.batch_size - len(batch)))
            yield tuple(default_collate(batch))
            sent += len(batch)
            batch = []

    def _read(self, order: np.ndarray, start: int, stop: int) -> RawSamples:
        """``(sample id, raw sample or None if unreadable)`` for stream positions ``[start, stop)``."""
        position = 0
        for shard in order.tolist():
            length = self.lengths[shard]
            lo = max(start - position, 0)
            hi = min(stop - position, length)
            position += length
            if lo < hi:
                yield from self._read_shard(shard, lo, hi)
            if position >= stop:
                return

    def _read_shard(self, shard: int, lo: int, hi: int) -> RawSamples:
        wds = _webdataset()
        url = self.shards[shard]
        base = int(self.offsets[shard])
        index = 0
        errors: list[BaseException] = []

        # end the shard at a damaged member, keep what came before
        def stop(err: BaseException) -> bool:
            errors.append(err)
            return False

        try:
            with open(url, "rb") as stream:
                sources = [dict(url=url, stream=stream)]
                members = wds.tariterators.tar_file_expander(sources, handler=stop)
                for sample in wds.tariterators.group_by_keys(members, handler=stop):
                    if index >= lo:
                        yield base + index, sample
                    index += 1
                    if index >= hi:
                        return
        except OSError as err:
            errors.append(err)
        if errors:  # a truncated or corrupt tar: the rest of the shard is unreadable
            name = type(errors[0]).__name__
            text = str(errors[0]).split(" @ ")[0]
            reason = f"shard unreadable from sample {index} on ({name}: {text})"
        else:
            expected = self.lengths[shard]
            reason = f"the shard ended after {index} samples, its index says {expected}"
        warnings.warn(f"{url}: {reason}", BadImageWarning, stacklevel=3)
        for i in range(max(index, lo), hi):
            self._bad[base + i] = True
            yield base + i, None

    def _good(self, stream: RawSamples) -> Iterator[tuple[torch.Tensor, int]]:
        """Decoded samples, one per stream position: a bad one is replaced by the next good one
        (the previous good one at the end)."""
        owed = 0
        last = None
        for index, raw in stream:
            decoded = self._decode(index, raw)
            if decoded is None:
                owed += 1
                continue
            for _ in range(owed + 1):
                yield decoded
            owed = 0
            last = decoded
        if owed and last is None:
            problem = f"none of this worker's {owed} samples of {self.shards[0]} ... decode"
            raise ShardError(f"{problem}; check the shards")
        for _ in range(owed):
            yield last  # type: ignore[misc]

    def _decode(self, index: int, raw: dict[str, Any] | None) -> tuple[torch.Tensor, int] | None:
        if raw is None or self._bad[index]:
            return None
        name = f"{self.sample_name(index)} (key {raw.get('__key__')})"
        try:
            label = self._label(raw, name)
            image_key = next((k for k in SHARD_IMAGE_KEYS if k in raw), None)
            if image_key is None:
                keys = "/".join(SHARD_IMAGE_KEYS)
                raise BadImageError(name, f"no image under {keys} (has {_keys(raw)})")
            image = decode_bytes(raw[image_key], name, self.alpha_background)
        except BadImageError as err:
            self._flag(index, f"skipping unreadable sample {err}")
            return None
        return self.transform(image), label

    def _label(self, raw: dict[str, Any], name: str) -> int:
        try:
            if "cls" in raw:
                label = int(raw["cls"].decode("ascii").strip())
            elif "json" in raw:
                label = int(json.loads(raw["json"])["label"])
            else:
                reason = f"no label (no cls, no json with label; has {_keys(raw)})"
                raise BadImageError(name, reason)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
            raise BadImageError(name, f"unreadable label ({err})") from err
        if not 0 <= label < len(self.class_names):
            raise BadImageError(name, f"label {label} outside 0 .. {len(self.class_names) - 1}")
        return label


def _keys(raw: dict[str, Any]) -> str:
    return ", ".join(k for k in raw if not k.startswith("__")) or "nothing"


def shard_loader(
    dataset: ShardDataset, *, pin_memory: bool | None = None, persistent_workers: bool | None = None
) -> DataLoader:
    """The DataLoader for ``dataset``: its own workers, batches made by the dataset (``batch_size=None``)."""
    workers = dataset.num_workers
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    if persistent_workers is None:
        persistent_workers = True
    return DataLoader(
        dataset,
        batch_size=None,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers and workers > 0,
    )


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
        skipped = ""
        if self.skipped:
            skipped = f"; skipped {len(self.skipped)} unreadable file(s), e.g. {self.skipped[0]}"
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
    """Write the ImageFolder split ``src`` as shards ``out/<split>-000000.tar``, ...: files in a seeded order,
    ``<key>.<ext>`` (bytes as stored; other formats than jpg/png/webp as PNG) + ``<key>.cls``. Resumable: each
    shard is renamed into place when complete; ``out/.<split>-plan.json`` refuses a rerun with another source,
    shard size or seed. ``split`` (default ``src``'s folder name) names the ``_info.json`` split."""
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
    names = []
    lengths = []
    skipped = []
    kept = 0
    for number, first in enumerate(range(0, len(order), shard_size)):
        path = out / f"{split}-{number:06d}.tar"
        names.append(path.name)
        if path.exists():
            lengths.append(count_samples(str(path)))
            kept += 1
        else:
            count, bad = _write_shard(path, source, order[first : first + shard_size], first)
            lengths.append(count)
            skipped.extend(bad)
    for stale in out.glob(f"{split}-*.tar.tmp"):
        stale.unlink()
    info_path = out / INFO_FILE
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    info.setdefault("splits", {})[split] = dict(
        name=split, num_samples=sum(lengths), filenames=names, shard_lengths=lengths
    )
    write_json(info_path, info)
    return ShardReport(
        out=out,
        split=split,
        shards=len(names),
        written=len(names) - kept,
        kept=kept,
        samples=sum(lengths),
        skipped=skipped,
    )


def _write_shard(
    path: Path, source: ImageFolderDataset, indices: list[int], first: int
) -> tuple[int, list[str]]:
    temporary = path.with_name(path.name + ".tmp")
    count = 0
    skipped = []
    with tarfile.open(temporary, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for position, index in enumerate(indices, start=first):
            file, label = source.samples[index]
            ext = _STORED_AS_IS.get(os.path.splitext(file)[1].lower())
            try:
                if ext is not None:
                    data = Path(file).read_bytes()
                else:
                    bgr = cv2.cvtColor(decode_image(file), cv2.COLOR_RGB2BGR)
                    ok, encoded = cv2.imencode(".png", bgr)
                    if not ok:
                        raise BadImageError(file, "cannot be re-encoded as PNG")
                    data = encoded.tobytes()
                    ext = "png"
            except (BadImageError, OSError) as err:
                skipped.append(str(err))
                continue
            for suffix, member in ((ext, data), ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"{position:09d}.{suffix}")
                info.size = len(member)
                info.mtime = int(time.time())
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(member))
            count += 1
    fsync_file(temporary)
    os.replace(temporary, path)
    return count, skipped


def _check_classes(path: Path, names: list[str]) -> None:
    if not path.exists():
        if any("\n" in n for n in names):
            raise ShardError("a class folder name contains a line break; rename it")
        atomic_write_text(path, "".join(f"{n}\n" for n in names))
    elif (found := _lines(path)) != names:
        raise ShardError(
            f"{path} lists other classes ({len(found)}) than the source ({len(names)}): "
            "write the shards of a data set with other classes to another folder"
        )


def _check_plan(path: Path, plan: dict[str, object]) -> None:
    if not path.exists():
        write_json(path, plan)
    elif (before := json.loads(path.read_text())) != plan:
        changes = [f"{k} {before.get(k)!r} -> {v!r}" for k, v in plan.items() if before.get(k) != v]
        changed = ", ".join(changes)
        raise ShardError(
            f"{path.parent} holds shards written with another plan ({changed}); "
            "use a new output folder, or delete the old shards and the plan file to start over"
        )


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line]
