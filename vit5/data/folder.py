"""ImageFolder data set (``root/<split>/<class>/**/<image>``) that survives bad files: a bad file is replaced
by the next readable index (timm ``Mixup`` needs even batches) and flagged in shared memory (workers too)."""

import os
import stat
import warnings
from array import array
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from vit5.data.decode import BadImageError, decode_image
from vit5.errors import Vit5Error, name_list

IMAGE_EXTENSIONS: tuple[str, ...] = tuple(
    f".{e}" for e in "jpg jpeg jpe png bmp webp tif tiff ppm pgm pbm pnm".split()
)
_SPLIT_NAMES = frozenset({"train", "val", "valid", "validation", "test"})


class ImageFolderError(Vit5Error, RuntimeError):
    """The folder layout or its content cannot form a data set (message names the fix)."""


class BadImageWarning(UserWarning):
    """An image file could not be decoded and is being skipped."""


class BadSamples:
    """Per-sample "unreadable" flags in shared memory (set by DataLoader workers too), for a data set with
    ``sample_name(index)``. Under multi-process training reduce :attr:`bad_mask` across ranks with max."""

    @property
    def bad_mask(self) -> torch.Tensor:
        return self._bad.clone()

    @property
    def num_bad(self) -> int:
        return int(self._bad.sum())

    @property
    def bad_files(self) -> list[str]:
        flagged = torch.nonzero(self._bad).flatten().tolist()
        return [self.sample_name(i) for i in flagged]  # type: ignore[attr-defined]

    def _flag(self, index: int, message: str) -> None:
        """Flag sample ``index``; the first process to flag it warns."""
        if not self._bad[index]:
            self._bad[index] = True
            warnings.warn(message, BadImageWarning, stacklevel=3)


class ImageFolderDataset(BadSamples, Dataset):
    """Classification images laid out as ``root/<split>/<class>/**/<image>`` (``split=None``: ``root`` is the
    split). Classes: the sorted non-hidden sub-folders, or ``class_names`` (the train set's, for val: the
    split must have exactly these); images: :func:`image_files` with ``extensions`` (any case). ``transform``
    maps the decoded RGB uint8 array (:func:`~vit5.data.decode.decode_image`) to the returned image."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        split: str | None = None,
        transform: Callable[[np.ndarray], Any] | None = None,
        *,
        class_names: Sequence[str] | None = None,
        extensions: Iterable[str] = IMAGE_EXTENSIONS,
        alpha_background: tuple[int, int, int] | None = None,
    ) -> None:
        self.root = _split_dir(Path(root), split)
        self.transform = transform
        self.alpha_background = alpha_background
        self.extensions = tuple(sorted({f".{e.lower().lstrip('.')}" for e in extensions}))
        self.class_names = _class_names(self.root, split, class_names)
        self.class_to_idx = {name: i for i, name in enumerate(self.class_names)}
        self.samples: list[tuple[str, int]] = []
        for name in self.class_names:
            folder = self.root / name
            files = _image_paths(folder, self.extensions, follow_outside=False, stacklevel=3)
            if not files:
                raise ImageFolderError(
                    f"class folder {folder} has no images with extensions "
                    f"{list(self.extensions)}. Add images or delete the folder."
                )
            self.samples.extend(zip(files, repeat(self.class_to_idx[name])))
        self.targets = [target for _, target in self.samples]
        self._bad = torch.zeros(len(self.samples), dtype=torch.bool).share_memory_()
        # decoded images, after verify(keep=True)
        self._images: list[np.ndarray | None] | None = None
        self._preloaded: tuple[torch.Tensor, torch.Tensor] | None = None  # preloaded()

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        count = len(self.samples)
        error: BadImageError | None = None
        for i in ((index + step) % count for step in range(count)):
            if self._bad[i]:
                continue
            path, target = self.samples[i]
            try:
                if self._images is None:
                    image = decode_image(path, self.alpha_background)
                else:
                    image = self._images[i]
            except BadImageError as e:
                error = e
                message = f"skipping unreadable image {e}; using the next readable file instead"
                self._flag(i, message)
                continue
            if self.transform is not None:
                image = self.transform(image)
            return image, target
        raise self._all_bad_error(error)

    def sample_name(self, index: int) -> str:
        return self.samples[index][0]

    def verify(
        self, num_threads: int = 8, *, keep: bool = False, progress: bool = False
    ) -> list[BadImageError]:
        """Decode every file once, up front, ``num_threads`` at a time (reads and decoding release the GIL);
        flag and return the failures (one summary warning). ``keep`` holds the decoded images in memory
        (``data.preload``), so no later epoch reads a file: for small data sets on slow or network disks,
        where a cold 28 px PNG costs more than training on it. Refused beyond half the machine's memory."""
        budget = _physical_memory() // 2

        def decode(path: str) -> np.ndarray | BadImageError | None:
            try:
                image = decode_image(path, self.alpha_background)
            except BadImageError as e:
                return e
            # a transform that wrote in place would change later epochs
            image.flags.writeable = False
            return image if keep else None

        kept = 0
        held = []
        with ThreadPoolExecutor(max_workers=max(1, num_threads)) as pool:
            results = pool.map(decode, (path for path, _ in self.samples))
            bar = tqdm(
                results,
                total=len(self.samples),
                desc=f"decoding {self.root.name}",
                unit="img",
                disable=not progress,
                leave=False,
            )
            for result in bar:
                held.append(result)
                if isinstance(result, np.ndarray):
                    kept += result.nbytes
                    if kept > budget:
                        pool.shutdown(cancel_futures=True)
                        raise ImageFolderError(
                            f"the decoded images under {self.root} pass half of this machine's "
                            f"memory ({budget / 2**30:.1f} GiB) after {len(held)} of "
                            f"{len(self.samples)} files: set data.preload=false "
                            "(files are then read each epoch)"
                        )
        failed = [isinstance(e, BadImageError) for e in held]
        errors = [e for e in held if isinstance(e, BadImageError)]
        self._bad |= torch.tensor(failed, dtype=torch.bool)
        if keep:
            self._images = [None if bad else e for e, bad in zip(held, failed)]
            self._preloaded = None
        if len(errors) == len(self.samples):
            raise self._all_bad_error(errors[-1])
        if errors:
            warnings.warn(
                f"{len(errors)} of {len(self.samples)} files under {self.root} cannot be decoded "
                f"and will be replaced by their next readable neighbour, e.g. {errors[0]}",
                BadImageWarning,
                stacklevel=2,
            )
        return errors

    def preloaded(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """After ``verify(keep=True)``: every sample's image as one uint8 tensor ``[N, H, W, 3]`` and its
        labels ``[N]`` (an unreadable file's are its next readable neighbour's, as :meth:`__getitem__`),
        for batch augmentation (:mod:`vit5.data.batched`); the kept images become views of it (no second
        copy). ``None`` when no images are kept or they differ in size."""
        if self._preloaded is not None or self._images is None:
            return self._preloaded
        readable = [i for i, image in enumerate(self._images) if image is not None]
        if len({self._images[i].shape for i in readable}) != 1:  # type: ignore[union-attr]
            return None
        stacked = np.stack([self._images[i] for i in readable])  # type: ignore[misc]
        # row of each sample: its own, or the next readable one's (cyclic)
        rows = np.searchsorted(readable, np.arange(len(self.samples))) % len(readable)
        if len(readable) < len(self.samples):
            stacked = stacked[rows]
        self._images = list(stacked)
        for image in self._images:
            image.flags.writeable = False
        labels = torch.tensor(self.targets)[torch.from_numpy(np.asarray(readable)[rows])]
        self._preloaded = (torch.from_numpy(stacked), labels)
        return self._preloaded

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(root={str(self.root)!r}, samples={len(self)}, "
            f"classes={len(self.class_names)}, bad={self.num_bad})"
        )

    def _all_bad_error(self, example: BadImageError | None) -> ImageFolderError:
        return ImageFolderError(
            f"none of the {len(self.samples)} files under {self.root} can be decoded "
            f"(e.g. {example}). "
            "Check that the folder holds real images (not LFS pointers or archives)."
        )


def _physical_memory() -> int:
    """Bytes of RAM (POSIX ``sysconf``); where it is unknown, no limit."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 2**62


def missing_split(root: Path, split: str) -> str | None:
    """What is wrong with the folder ``root`` when ``root / split`` is no folder, naming the data root
    when ``root`` is one level too deep (a split given as the root); None when the split is there.
    The data set and the training config both ask it."""
    split_dir = root / split
    if split_dir.is_dir():
        return None
    if (root.parent / split).is_dir():
        return (
            f"split folder {split_dir} does not exist, but {root.parent / split} does: the data "
            f"root is {root.parent}"
        )
    folders = [p.name for p in root.iterdir() if p.is_dir()]
    available = sorted(name for name in folders if not name.startswith("."))
    return (
        f"split folder {split_dir} does not exist (sub-folders of {root}: "
        f"{name_list(available, 8)}): the data root must hold {split}/<class>/<image>"
    )


def _split_dir(root: Path, split: str | None) -> Path:
    if not root.is_dir():
        raise ImageFolderError(
            f"data set root {root} does not exist or is not a folder; check the path.",
        )
    if split is None:
        return root
    problem = missing_split(root, split)
    if problem is not None:
        raise ImageFolderError(problem)
    return root / split


def _class_names(split_dir: Path, split: str | None, expected: Sequence[str] | None) -> list[str]:
    folders = [e for e in _listing(str(split_dir), str(split_dir.parent), set(), []) if e.is_dir()]
    found = sorted(e.name for e in folders)
    # a class folder that links to the split (or above) would hold every class
    for entry in folders:
        if not entry.is_symlink():
            continue
        target = os.path.realpath(entry.path)
        if _inside(os.path.realpath(split_dir), target):
            raise ImageFolderError(
                f"class folder {entry.path} is a link to {target}, which "
                f"contains {split_dir} itself: remove the link"
            )
    if not found:
        raise ImageFolderError(
            f"{split_dir} has no class sub-folders; expected {split_dir}/<class>/<image>.",
        )
    if split is None and set(found) <= _SPLIT_NAMES:
        raise ImageFolderError(
            f"{split_dir} looks like a data set root (sub-folders {found}), not a split folder; "
            f"pass split={found[0]!r} (or the split you want)."
        )
    if expected is None:
        return found
    if len(set(expected)) != len(expected):
        raise ImageFolderError(f"class_names has duplicates: {list(expected)}")
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    if missing or extra:
        raise ImageFolderError(
            f"class folders in {split_dir} do not match class_names: "
            f"missing {missing}, unexpected {extra}. "
            f"Every split needs the same class folders (an empty class cannot be evaluated)."
        )
    return list(expected)


def class_names_change(old: Sequence[str], new: Sequence[str]) -> str:
    """How class list ``new`` differs from ``old``, for a message: names gone, names new, or the order."""
    gone = [n for n in old if n not in set(new)]
    added = [n for n in new if n not in set(old)]
    if not gone and not added:
        if list(old) != list(new):
            return "the same names in another label order"
        return "no difference"
    parts = []
    if gone:
        parts.append(f"gone: {name_list(gone)}")
    if added:
        parts.append(f"new: {name_list(added)}")
    return "; ".join(parts)


def image_files(
    folder: str | os.PathLike[str],
    extensions: Iterable[str] = IMAGE_EXTENSIONS,
    *,
    follow_outside: bool = False,
) -> list[Path]:
    """Every image file under ``folder``, each once, sorted by path: links followed, each folder entered once,
    links outside ``folder`` skipped unless ``follow_outside``, only regular files, no hidden entries; skips
    summarised in one :class:`BadImageWarning`."""
    return [Path(p) for p in _image_paths(folder, extensions, follow_outside, stacklevel=3)]


def _image_paths(
    folder: str | os.PathLike[str],
    extensions: Iterable[str],
    follow_outside: bool,
    stacklevel: int = 2,
) -> list[str]:
    """:func:`image_files` as strings, with one ``scandir`` per folder and no ``stat`` per file (entries
    cache their kind and inode); sorted visiting (a folder sorts as ``name/``) yields sorted paths."""
    suffixes = tuple({e.lower() for e in extensions})
    top = os.fspath(folder)
    root = os.path.realpath(top)
    visited: set[tuple[int, int]] = set()
    files: list[str] = []
    inodes = array("Q")  # of each file listed, in order: 8 bytes a file, no Python objects
    skipped: list[str] = []
    first = _listing(top, top, visited, skipped)
    stack = [(first, 0)] if first else []
    while stack:
        entries, i = stack.pop()
        while i < len(entries):
            entry = entries[i]
            i += 1
            # a regular file, not a link: the common case
            if entry.is_file(follow_symlinks=False):
                if entry.name.lower().endswith(suffixes):
                    files.append(entry.path)
                    inodes.append(entry.inode())
                continue
            info = None
            if entry.is_symlink():
                target = os.path.realpath(entry.path)
                if not follow_outside and not _inside(target, root):
                    skipped.append(f"{entry.path} (a link to {target}, outside {folder})")
                    continue
                try:
                    info = entry.stat()  # follows the link
                except OSError:
                    skipped.append(f"{entry.path} (a broken link)")
                    continue
            if info:
                is_folder = stat.S_ISDIR(info.st_mode)
            else:
                is_folder = entry.is_dir(follow_symlinks=False)
            if is_folder:
                listing = _listing(entry.path, top, visited, skipped)
                if listing:
                    stack += [(entries, i), (listing, 0)]
                    break
            elif entry.name.lower().endswith(suffixes):
                info = info or entry.stat(follow_symlinks=False)
                if stat.S_ISREG(info.st_mode):  # through a link
                    files.append(entry.path)
                    inodes.append(info.st_ino)
                else:
                    kind = _file_kind(info.st_mode)
                    skipped.append(f"{entry.path} (not a regular file: {kind})")
    files = _one_path_per_file(files, inodes)
    if skipped:
        entries = "entry" if len(skipped) == 1 else "entries"
        more = f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""
        warnings.warn(
            f"skipped {len(skipped)} {entries} under {folder}: {skipped[0]}{more}",
            BadImageWarning,
            stacklevel=stacklevel,
        )
    return files


def _one_path_per_file(files: list[str], inodes: array) -> list[str]:
    """``files`` without later paths to a file listed before; only shared inode numbers are ``stat``-ed."""
    if len(inodes):
        numbers = np.frombuffer(inodes, dtype=np.uint64)
    else:
        numbers = np.zeros(0, np.uint64)
    values, counts = np.unique(numbers, return_counts=True)
    if counts.max(initial=0) < 2:
        return files
    keep = np.ones(len(files), dtype=bool)
    seen: set[tuple[int, int]] = set()
    for index in np.flatnonzero(np.isin(numbers, values[counts > 1])).tolist():
        info = os.stat(files[index])
        keep[index] = (info.st_dev, info.st_ino) not in seen
        seen.add((info.st_dev, info.st_ino))
    return [path for path, kept in zip(files, keep.tolist()) if kept]


def _listing(
    directory: str, top: str, visited: set[tuple[int, int]], skipped: list[str]
) -> list[os.DirEntry[str]]:
    """The non-hidden entries of ``directory`` in path order; empty for a folder already listed (a loop)."""
    try:
        info = os.stat(directory)
        if (info.st_dev, info.st_ino) in visited:
            skipped.append(f"{directory} (a link back to a folder already listed)")
            return []
        visited.add((info.st_dev, info.st_ino))
        with os.scandir(directory) as listing:
            entries = [e for e in listing if not e.name.startswith(".")]
    except OSError as err:
        raise ImageFolderError(
            f"cannot read folder {directory}: {(err.strerror or str(err)).lower()}; "
            f"fix its permissions (e.g. chmod a+rx) or move it out of {top}"
        ) from err
    return sorted(entries, key=_path_order)


def _path_order(entry: os.DirEntry[str]) -> str:
    """A folder sorts where its files sort as full paths (``a.png`` < ``a/x`` < ``a0``)."""
    try:
        return entry.name + "/" if entry.is_dir() else entry.name
    except OSError:
        return entry.name


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _file_kind(mode: int) -> str:
    kinds = {
        stat.S_IFIFO: "a FIFO",
        stat.S_IFSOCK: "a socket",
        stat.S_IFCHR: "a character device",
        stat.S_IFBLK: "a block device",
    }
    return kinds.get(stat.S_IFMT(mode), "not a file")
