"""Files that a kill, a crash or a full disk cannot leave half-written, and one writer per folder.

* :func:`atomic_write_bytes` / :func:`atomic_write_text`: written to a hidden temporary file in the
  same folder, flushed to disk, then renamed over the target (``rename`` is atomic on POSIX), so
  the target is always either the old or the new complete file. Text is UTF-8; characters it
  cannot encode (file names of another encoding, kept by Python as surrogates) are written as
  backslash escapes instead of failing after the work is done.
* :func:`replace_dir`: a directory staged completely elsewhere is swapped into place in one step
  (``renameat2(RENAME_EXCHANGE)`` on Linux), so readers see the old or the new directory, never a
  mix of the two; where the exchange is not available the old directory is moved aside first and
  :func:`recover_dir` puts the complete one back after a crash between the two renames.
* :class:`FolderLock`: an exclusive ``flock`` on ``FOLDER/.lock``. The kernel releases it when the
  holder exits, however it exits, so a lock left by a killed process is simply taken over; a live
  holder is named (pid, host, command, start time) in the error.
* :func:`check_output_dir`: an output folder is created and proven writable before any work.

Every OS error is re-raised as a :class:`~vit5.errors.StorageError` naming the path and the fix
("no space left on device", "read-only file system", "is a file, not a folder").

A leaf module (standard library only).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime
import errno
import json
import os
import shutil
import socket
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from vit5.errors import (
    ESCAPE_UNDECODABLE,
    InputError,
    StorageError,
    Vit5Error,
    os_error_reason,
    storage_error,
)

LOCK_NAME = ".lock"
_STAGING = ".tmp-"
_ASIDE = ".old-"


# ------------------------------------------------------------------------------------------ files
def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, durable: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically (permissions follow the umask, like a plain ``open``).

    Raises:
        StorageError: the folder cannot be written (disk full, read-only, permission, not a folder).
    """
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
    """:func:`atomic_write_bytes` of ``text`` in UTF-8; file name bytes of another encoding become
    ``\\xNN``."""
    return atomic_write_bytes(path, text.encode("utf-8", errors=ESCAPE_UNDECODABLE), durable)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, durable: bool = True) -> Path:
    """``obj`` as indented JSON (ASCII, so any file name survives), written atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2) + "\n", durable)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a written file's content to disk (before renaming it into place)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(directory: str | os.PathLike[str]) -> None:
    """Flush a folder's entries (a rename into it) to disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------ directories
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
    """Put the complete directory ``staged`` in place of ``final`` in one step; the old one is removed.

    Raises:
        StorageError: the rename failed (``final`` is left as it was).
    """
    staged, final = Path(staged), Path(final)
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
    """Finish what a crash inside :func:`replace_dir` or a staging step left: restore a directory
    moved aside when its replacement never arrived, and remove staging leftovers."""
    final = Path(final)
    aside, staged = final.with_name(f"{_ASIDE}{final.name}"), final.with_name(f"{_STAGING}{final.name}")
    if aside.is_dir() and not final.exists():
        os.rename(aside, final)
    shutil.rmtree(aside, ignore_errors=True)
    shutil.rmtree(staged, ignore_errors=True)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_libc: Any = None


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with Linux ``renameat2(RENAME_EXCHANGE)``; False where unsupported."""
    global _libc
    if not sys.platform.startswith("linux"):
        return False
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    renameat2 = getattr(_libc, "renameat2", None)
    if renameat2 is None:
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # the file system cannot exchange
        return False
    raise OSError(code, os.strerror(code), os.fspath(b))


# ------------------------------------------------------------------------------------ output folders
def check_output_dir(path: str | os.PathLike[str], option: str = "the output folder") -> Path:
    """Create ``path`` if needed and prove it writable, before any work is done.

    Raises:
        StorageError: ``path`` is a file, or cannot be created or written (read-only, permission,
            disk full); the message names ``option`` (e.g. ``--out``) and the path.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise StorageError(f"{option} {path} is a file, not a folder: give a folder path")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise StorageError(f"{option} {path} cannot be written: {os_error_reason(err)}") from err
    return path


# ------------------------------------------------------------------------------------------ locks
class FolderLocked(Vit5Error):
    """Another live process is writing into the same folder."""


class FolderLock:
    """An exclusive lock on ``folder`` for one writer (``with FolderLock(run_dir, "training"):``).

    ``flock`` on ``folder/.lock``, which also records who holds it. The kernel drops the lock when
    the holding process exits, whatever the cause, so a lock left behind by a killed run is taken
    over by the next one; there is no stale lock to delete by hand.

    Raises (on :meth:`acquire`):
        FolderLocked: held by a live process; the message names it and what to do.
    """

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
            holder = _read_holder(fd)
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
        with contextlib.suppress(Exception):  # at interpreter shutdown the process exit releases it anyway
            self.release()

    def __enter__(self) -> FolderLock:  # noqa: PYI034 (typing.Self needs Python 3.11)
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def _held_message(self, holder: dict[str, Any]) -> str:
        who = f"pid {holder.get('pid', '?')}"
        if holder.get("host") and holder.get("host") != socket.gethostname():
            who += f" on host {holder['host']}"
        what = (
            f" ({holder.get('purpose', 'writing')}, `{holder.get('command', '?')}`,"
            f" since {holder.get('since', '?')})"
        )
        return (
            f"{self.folder} is in use by {who}{what}: only one process may write there at a time. Wait for "
            "it "
            f"to finish or stop it (kill {holder.get('pid', 'PID')}). The lock ({self.path}) is released the "
            f"moment that process exits, so a lock left by a killed run never needs clearing; if it still "
            f"shows, a process it started holds it (`fuser {self.path}` names it)"
        )


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode("utf-8", errors="replace") or "{}")
    except (OSError, ValueError):
        return {}


def read_json(path: Path) -> Any:
    """A JSON file this package wrote or reads (manifest, dataset.json); a broken one is an InputError."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{path} is not readable JSON ({err}): fix or delete it") from err
