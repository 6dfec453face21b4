"""The base class of every error that is the user's to fix (command lines print it, or an OSError, as one
``error:`` line; anything else is a bug and keeps its traceback), and readable messages for OS errors."""

from __future__ import annotations

import codecs
import errno
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class Vit5Error(Exception):
    """A user error (bad input, a missing or damaged file); the message names the problem and the fix."""


class InputError(Vit5Error, ValueError):
    """Input a tool cannot use (an unsupported model, a size, layer or option out of range, no image)."""


class StorageError(Vit5Error, OSError):
    """A file or folder cannot be read or written (disk full, read-only, permission, not a folder)."""


_FIXES = {
    errno.ENOSPC: ("no space left on device", "free space there or choose another folder"),
    errno.EDQUOT: ("disk quota exceeded", "free space there or choose another folder"),
    errno.EROFS: ("read-only file system", "choose a writable folder"),
    errno.EACCES: ("permission denied", "fix its permissions or choose another folder"),
    errno.EPERM: ("operation not permitted", "fix its permissions or choose another folder"),
    errno.ENOTDIR: ("a path component is a file, not a folder", "choose a folder path"),
    errno.EISDIR: ("it is a folder, not a file", "give the path of a file"),
    errno.ENOENT: ("no such file or folder", "check the path"),
    errno.EEXIST: ("it already exists", "remove it or choose another path"),
    errno.ENAMETOOLONG: ("the name is too long", "choose a shorter path"),
}


def os_error_reason(err: OSError) -> str:
    """Why an OS call failed and the fix, e.g. ``"no space left on device; free space there or ..."``."""
    reason, fix = _FIXES.get(err.errno or -1, ((err.strerror or str(err)).lower(), ""))
    return f"{reason}; {fix}" if fix else reason


def describe_os_error(
    err: OSError, path: str | os.PathLike[str] | None = None, doing: str = "write"
) -> str:
    """``"cannot write runs/x/final: no space left on device; free space there or ..."``."""
    where = os.fsdecode(path if path is not None else err.filename or "")
    return f"cannot {doing}{' ' + where if where else ''}: {os_error_reason(err)}"


def shorten(value: Any, limit: int = 120) -> str:
    """``repr(value)`` cut to about ``limit`` characters with the full length said (one line)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 20]}...{text[-8:]} ({len(text):,} characters)"


def name_list(names: Any, limit: int = 6) -> str:
    """``a, b, c, ... (+7 more)``: a list of names for a one-line message."""
    names = [str(n) for n in names]
    shown = ", ".join(n if len(n) <= 40 else f"{n[:37]}..." for n in names[:limit])
    return shown + (f", ... (+{len(names) - limit} more)" if len(names) > limit else "") or "none"


@dataclass(frozen=True)
class Rule:
    """One validation rule as data: the settings it covers (space-separated names), the check each value
    must pass, and what the value must be, said in the message. A rule whose ``must`` ends in "or null"
    lets ``None`` pass."""

    names: str
    check: Callable[[Any], bool]
    must: str

    def problems(self, values: Mapping[str, Any]) -> list[str]:
        """``"name=value must be ..."`` for each covered value that fails (one line each)."""
        found = []
        for name in self.names.split():
            value = values[name]
            if value is None:
                passes = self.must.endswith("or null")
            else:
                passes = self.check(value)
            if not passes:
                found.append(f"{name}={shorten(value)} must be {self.must}")
        return found


def rule_problems(values: Mapping[str, Any], rules: Iterable[Rule]) -> list[str]:
    """The one rule engine of vit5 (model, training and tool settings): every problem of ``values``
    under ``rules``, in rule order; the caller raises its own error with the first or with all."""
    return [problem for rule in rules for problem in rule.problems(values)]


def storage_error(err: OSError, path: str | os.PathLike[str], doing: str = "write") -> StorageError:
    """A :class:`StorageError` for ``err`` naming ``path`` (raise it ``from err``)."""
    return (
        err if isinstance(err, StorageError) else StorageError(describe_os_error(err, path, doing))
    )


def user_message(err: BaseException) -> str | None:
    """The one-line message of a user error (:class:`Vit5Error`, :class:`OSError`), else None (a bug)."""
    if isinstance(err, Vit5Error):
        return str(err)
    if isinstance(err, OSError):
        return describe_os_error(err, doing="read or write")
    return None


def _escape_undecodable(err: UnicodeEncodeError) -> tuple[str, int]:
    """A surrogate-escaped file name byte (U+DC80..U+DCFF) becomes ``\\xNN``; others backslash escapes."""
    char = err.object[err.start]
    if 0xDC80 <= ord(char) <= 0xDCFF:
        return f"\\x{ord(char) - 0xDC00:02x}", err.start + 1
    return char.encode("ascii", "backslashreplace").decode(), err.start + 1


ESCAPE_UNDECODABLE = (
    "vit5.escape"  # a codec error handler: text.encode("utf-8", errors=ESCAPE_UNDECODABLE)
)
codecs.register_error(ESCAPE_UNDECODABLE, _escape_undecodable)
