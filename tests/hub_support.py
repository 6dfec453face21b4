"""Offline Hugging Face Hub fixtures: files placed in a cache exactly as huggingface_hub stores a download.

``hub/models--OWNER--NAME/blobs/<sha256>`` holds the bytes, ``snapshots/<commit>/<file>`` is a
relative symlink to the blob and ``refs/<branch>`` holds the commit hash, so ``hf_hub_download``
(and timm, which calls it) finds the files with ``HF_HUB_OFFLINE=1`` and never goes online.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def lay_out_download(
    hub_cache: Path,
    repo_id: str,
    files: dict[str, Path | bytes],
    commit: str | None = None,
    ref: str = "main",
) -> str:
    """Store ``files`` (name -> path or bytes) as revision ``commit`` of ``repo_id``; ``ref`` points at it."""
    datas = {
        name: content.read_bytes() if isinstance(content, Path) else content
        for name, content in files.items()
    }
    commit = commit or hashlib.sha1(b"".join(sorted(datas.values()))).hexdigest()
    root = hub_cache / f"models--{repo_id.replace('/', '--')}"
    for name, data in datas.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = root / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(commit)
    return commit


def lay_out_folder(hub_cache: Path, repo_id: str, folder: Path, commit: str | None = None) -> str:
    """Store every file of ``folder`` (e.g. what push_to_hub uploaded) as one revision of ``repo_id``."""
    files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
    return lay_out_download(hub_cache, repo_id, files, commit)
