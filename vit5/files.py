"""Files that a kill, a crash or a full disk cannot leave half-written, and one writer per folder: files are
renamed into place, directories swapped in with ``renameat2(RENAME_EXCHANGE)`` (else moved aside and
recovered), and a ``flock`` the kernel drops when its holder exits. OS errors become StorageErrors."""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import errno
import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from vit5.errors import (
    ESCAPE_UNDECODABLE,
    InputError,
    StorageError,
    Vit5Error,
    os_error_reason,
    storage_error,
)
from vit5.schema import parse

LOCK_NAME = ".lock"
_STAGING = ".tmp-"
_ASIDE = ".old-"
AT_FDCWD = -100  # renameat2: a path relative to the working directory (linux/fcntl.h)
RENAME_EXCHANGE = 2  # renameat2: swap the two paths (linux/fs.h)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, durable: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically (permissions follow the umask); StorageError on failure."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(partial, path)
    except OSError as err:
        partial.unlink(missing_ok=True)
        raise storage_error(err, path) from err
    if durable:
        sync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str, durable: bool = True) -> Path:
    """UTF-8 :func:`atomic_write_bytes`; file name bytes of another encoding become ``\\xNN``."""
    return atomic_write_bytes(path, text.encode("utf-8", errors=ESCAPE_UNDECODABLE), durable)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a written file's content to disk (before renaming it into place)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(directory: str | os.PathLike[str]) -> None:
    """Flush a folder's entries (a rename into it) to disk; a no-op where folders cannot be opened."""
    with contextlib.suppress(OSError):
        fsync_file(directory)


def staging_dir(final: str | os.PathLike[str]) -> Path:
    """A fresh, empty sibling of ``final`` to build its new content in (``.tmp-NAME``)."""
    final = Path(final)
    staged = final.with_name(f"{_STAGING}{final.name}")
    try:
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir(parents=True)
    except OSError as err:
        raise storage_error(err, staged, "create") from err
    return staged


def replace_dir(staged: str | os.PathLike[str], final: str | os.PathLike[str]) -> Path:
    """Put the complete directory ``staged`` in place of ``final`` in one step; the old one is removed."""
    staged = Path(staged)
    final = Path(final)
    sync_dir(staged)
    try:
        if not final.exists():
            os.rename(staged, final)
        elif _exchange(staged, final):
            shutil.rmtree(staged, ignore_errors=True)  # now holds the old content
        else:
            aside = final.with_name(f"{_ASIDE}{final.name}")
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(final, aside)
            os.rename(staged, final)  # a crash before this line: recover_dir() moves `aside` back
            shutil.rmtree(aside, ignore_errors=True)
    except OSError as err:
        raise storage_error(err, final) from err
    sync_dir(final.parent)
    return final


def recover_dir(final: str | os.PathLike[str]) -> None:
    """After a crash inside :func:`replace_dir`: restore a directory moved aside, remove staging leftovers."""
    final = Path(final)
    aside = final.with_name(f"{_ASIDE}{final.name}")
    staged = final.with_name(f"{_STAGING}{final.name}")
    if aside.is_dir() and not final.exists():
        os.rename(aside, final)
    shutil.rmtree(aside, ignore_errors=True)
    shutil.rmtree(staged, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with Linux ``renameat2(RENAME_EXCHANGE)``; False where unsupported."""
    linux = sys.platform.startswith("linux")  # CDLL(None): the C library the interpreter runs on
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None) if linux else None
    if renameat2 is None:
        return False
    here = AT_FDCWD
    if renameat2(here, os.fsencode(a), here, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # the file system cannot exchange
        return False
    raise OSError(code, os.strerror(code), os.fspath(b))


def check_output_dir(path: str | os.PathLike[str], option: str = "the output folder") -> Path:
    """Create ``path`` if needed and prove it writable before any work (StorageError naming ``option``)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise StorageError(f"{option} {path} is a file, not a folder: give a folder path")
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()  # proves files can be created there
    except OSError as err:
        raise StorageError(f"{option} {path} cannot be written: {os_error_reason(err)}") from err
    return path


class FolderLocked(Vit5Error):
    """Another live process is writing into the same folder."""


class FolderLock:
    """An exclusive ``flock`` on ``folder/.lock`` for one writer, recording who holds it. The kernel drops
    it when the holder exits, however it exits, so there is never a stale lock to delete by hand.
    :meth:`acquire` raises :class:`FolderLocked` naming a live holder."""

    def __init__(self, folder: str | os.PathLike[str], purpose: str) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.purpose = purpose
        self._fd: int | None = None

    def acquire(self) -> FolderLock:
        import fcntl

        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as err:
            raise storage_error(err, self.path, "create the lock file") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            try:
                holder = json.loads(os.pread(fd, 4096, 0).decode("utf-8", errors="replace") or "{}")
            except (OSError, ValueError):
                holder = {}
            os.close(fd)
            if err.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise FolderLocked(self._held_message(holder)) from None
            raise storage_error(err, self.path, "lock") from err
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "purpose": self.purpose,
            "command": " ".join(sys.argv),
            "since": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(record).encode("utf-8", errors=ESCAPE_UNDECODABLE))
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __del__(self) -> None:
        with contextlib.suppress(
            Exception
        ):  # at interpreter shutdown the process exit releases it anyway
            self.release()

    def __enter__(self) -> FolderLock:  # noqa: PYI034 (typing.Self needs Python 3.11)
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _held_message(self, holder: dict[str, Any]) -> str:
        who = f"pid {holder.get('pid', '?')}"
        if holder.get("host") and holder.get("host") != socket.gethostname():
            who += f" on host {holder['host']}"
        what = f"{holder.get('purpose', 'writing')}, `{holder.get('command', '?')}`"
        return (
            f"{self.folder} is in use by {who} ({what}, since {holder.get('since', '?')}): only one process "
            f"may write there at a time. Wait for it to finish or stop it (kill {holder.get('pid', 'PID')}). "
            f"The lock ({self.path}) is released the moment that process exits, so a lock left by a killed "
            f"run never needs clearing; if it still shows, a process it started holds it "
            f"(`fuser {self.path}` names it)"
        )


def read_json(path: str | os.PathLike[str], schema: Any = Any) -> Any:
    """A JSON file this package wrote or reads (manifest, dataset.json) as ``schema``
    (:func:`vit5.schema.parse`); a broken one is one InputError naming the file and the field."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{path} is not readable JSON ({err}): fix or delete it") from err
    try:
        return parse(schema, document)
    except ValueError as err:
        raise InputError(f"{path}: {err}; fix or delete it") from err
