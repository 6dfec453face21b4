"""Dense features on disk: ``<relative image path>.safetensors`` per image plus ``manifest.json``, resumable.

Every file is written atomically and records the run (model fingerprint + settings) and its source's size
and mtime, so a rerun redoes exactly the images not done by the same run; features of another run are
refused (``overwrite=True`` replaces them). One writer per folder (:class:`vit5.files.FolderLock`)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save
from torch import nn
from tqdm.auto import tqdm

from vit5.errors import InputError
from vit5.eval.backbone import EVAL_FIX, feature_names
from vit5.eval.features import FailedImage, FeatureSettings, ImageFeatures, extract, resolve_model
from vit5.eval.images import list_images
from vit5.eval.load import LoadedModel
from vit5.eval.report import to_jsonable, write_json
from vit5.files import FolderLock, atomic_write_bytes, check_output_dir, read_json
from vit5.introspect import describe
from vit5.model import take_indices

FORMAT = "vit5-features/1"
MANIFEST = "manifest.json"
SUFFIX = ".safetensors"
PARTIAL = ".partial"
_META_KEY = "vit5_features"
ENTRY_KEYS = ("path", "file", "image_size", "input_size", "grid")


@dataclass
class ExportSummary:
    out_dir: Path
    written: int
    skipped: int  # already complete from an earlier run
    failed: list[FailedImage] = field(default_factory=list)
    seconds: float = 0.0

    def __str__(self) -> str:
        rate = f", {self.written / self.seconds:.1f} img/s" if self.seconds > 0 and self.written else ""
        lines = [
            f"features -> {self.out_dir}: {self.written} written, {self.skipped} already done, "
            f"{len(self.failed)} failed ({self.seconds:.1f} s{rate})"
        ]
        lines += [f"  failed: {f.path}: {f.reason}" for f in self.failed[:10]]
        return "\n".join(
            lines + ([f"  ... {len(self.failed) - 10} more in {MANIFEST}"] if len(self.failed) > 10 else [])
        )


def model_fingerprint(model: nn.Module) -> str:
    """A short hash of every tensor's name, shape and a strided sample of its values (cheap, and it
    tells different weights apart)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().flatten()
        sample = flat[:: max(1, flat.numel() // 4096)].float().cpu()
        digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:16]


def export_features(
    model: nn.Module | LoadedModel,
    images: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    settings: FeatureSettings | None = None,
    *,
    overwrite: bool = False,
    progress: bool = True,
    manifest_every_s: float = 30.0,
) -> ExportSummary:
    """Extract features for every image under ``images`` (recursive) into ``out_dir``; the manifest is
    rewritten every ``manifest_every_s`` seconds. Raises InputError (bad settings or source, features of
    another run) or FolderLocked (another export writes into ``out_dir``)."""
    out_dir, settings = check_output_dir(out_dir, "output folder"), settings or FeatureSettings()
    start = time.perf_counter()
    root, paths = list_images(images)
    module, mean, std = resolve_model(model)
    info = describe(module)
    blocks = take_indices(info.depth, settings.layers, unique=True)
    if settings.size is not None:  # before anything is written: a bad size leaves no manifest behind
        info.grid(settings.size, EVAL_FIX)
    chosen = {**settings.identity(), "layers": blocks}  # absolute: -1 and 11 are the same run
    identity = to_jsonable(
        {"model_fingerprint": model_fingerprint(module), "settings": chosen, "mean": mean, "std": std}
    )
    run_id = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    header = {
        "format": FORMAT,
        "model": model.label if isinstance(model, LoadedModel) else type(module).__name__,
        **identity,
        "run_id": run_id,
        "blocks": blocks,
        "features": feature_names(info, blocks),
        "patch_size": info.patch_size,
        "embed_dim": info.embed_dim,
        "has_cls": bool(info.num_cls),
        "num_registers": info.num_registers,
        "dtype": settings.dtype,
        "source_root": str(root.resolve()),
    }
    with FolderLock(out_dir, "feature export"):
        _check_same_run(out_dir, identity, run_id, overwrite)
        for partial in out_dir.rglob(f"*{SUFFIX}*{PARTIAL}") if out_dir.is_dir() else ():  # left by a kill
            partial.unlink()
        done = {} if overwrite else {path: _completed_entry(out_dir, root, path, run_id) for path in paths}
        entries: dict[str, dict[str, Any]] = {e["path"]: e for e in done.values() if e}
        todo = [path for path in paths if not done.get(path)]
        skipped, failed = len(entries), []

        def write_manifest(complete: bool) -> None:
            images = [entries[k] for k in sorted(entries)]
            bad = [{"path": _relative(root, f.path), "reason": f.reason} for f in failed]
            doc = {
                **header,
                "complete": complete,
                "num_images": len(entries),
                "images": images,
                "failed": bad,
            }
            write_json(out_dir / MANIFEST, doc)

        write_manifest(complete=False)
        last_manifest = time.monotonic()
        bar = tqdm(total=len(todo), desc="features", unit="img", disable=not progress)
        for item in extract(model, todo, settings):
            if isinstance(item, FailedImage):
                failed.append(item)
            else:
                entry = _write_image(out_dir, root, item, run_id, info.patch_size)
                entries[entry["path"]] = entry
            bar.update(1)
            bar.set_postfix(failed=len(failed), refresh=False)
            if time.monotonic() - last_manifest > manifest_every_s:
                write_manifest(complete=False)
                last_manifest = time.monotonic()
        bar.close()
        write_manifest(complete=True)
    return ExportSummary(out_dir, len(entries) - skipped, skipped, failed, time.perf_counter() - start)


def _relative(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def _source_stat(path: Path) -> dict[str, int]:
    stat = path.stat()
    return {"source_bytes": stat.st_size, "source_mtime_ns": stat.st_mtime_ns}


def _write_image(out_dir: Path, root: Path, item: ImageFeatures, run_id: str, patch: int) -> dict[str, Any]:
    (h, w), rel = item.input_size, _relative(root, item.path)
    sizes = {"image_size": list(item.image_size), "input_size": [h, w], "grid": [h // patch, w // patch]}
    entry = {"path": rel, "file": rel + SUFFIX, **sizes}
    target = out_dir / entry["file"]
    target.parent.mkdir(parents=True, exist_ok=True)
    meta = json.dumps({**entry, "run_id": run_id, **_source_stat(item.path)})
    payload = save({k: v.contiguous() for k, v in item.features.items()}, metadata={_META_KEY: meta})
    atomic_write_bytes(target, payload, durable=False)  # many files: the manifest is the durable record
    return entry


def _completed_entry(out_dir: Path, root: Path, path: Path, run_id: str) -> dict[str, Any] | None:
    """The manifest entry of an image whose feature file is complete and current, else None."""
    target = out_dir / (_relative(root, path) + SUFFIX)
    if not target.is_file():
        return None
    try:
        with safe_open(str(target), framework="pt") as f:
            meta = json.loads((f.metadata() or {})[_META_KEY])
    except Exception:  # unreadable or foreign file: recompute it
        return None
    current = {"run_id": run_id, **_source_stat(path)}
    if (
        not isinstance(meta, dict)
        or _entry_problem(meta)
        or any(meta.get(k) != v for k, v in current.items())
    ):
        return None  # foreign, crafted, of another run or of a changed source: recompute it
    return {k: meta[k] for k in ENTRY_KEYS}


def _check_same_run(out_dir: Path, identity: dict[str, Any], run_id: str, overwrite: bool) -> None:
    manifest = out_dir / MANIFEST
    if overwrite or not manifest.is_file():
        return
    old = checked_manifest(read_json(manifest), manifest)
    if (
        old.get("run_id") != run_id and old.get("num_images", 1) > 0
    ):  # an export that wrote nothing blocks nothing
        changed = "; ".join(f"{k}: {old.get(k)} -> {v}" for k, v in identity.items() if old.get(k) != v)
        raise InputError(
            f"{out_dir} holds features from another model or other settings ({changed or 'other format'}); "
            "use a new output folder, or overwrite to replace them"
        )


def read_manifest(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        raise InputError(f"{out_dir} has no {MANIFEST}; is it a feature export folder?")
    manifest = checked_manifest(read_json(path), path)
    if manifest.get("format") != FORMAT:
        raise InputError(f"{path} is not a {FORMAT} manifest (format {manifest.get('format')!r})")
    for key, want in (("source_root", str), ("images", list)):
        if not isinstance(manifest.get(key), want):
            raise InputError(
                f"{path}: {key} is {manifest.get(key)!r}, not a {want.__name__}: fix or delete it"
            )
    return manifest


def checked_manifest(manifest: Any, path: Path) -> dict[str, Any]:
    """A manifest's fields, range-checked (a crafted or damaged one is one error naming the field):
    an object; ``num_images`` a count; every image entry with a relative ``path``, a ``file``
    inside the export folder, and sizes of two positive integers; ``failed`` a list of entries."""
    if not isinstance(manifest, dict):
        raise InputError(f"{path} holds a {type(manifest).__name__}, not a manifest object: fix or delete it")
    count = manifest.get("num_images", 0)
    if type(count) is not int or count < 0:
        raise InputError(f"{path}: num_images is {count!r}, not a count: fix or delete it")
    images = manifest.get("images", [])
    for i, entry in enumerate(images if isinstance(images, list) else ()):
        problem = _entry_problem(entry)
        if problem:
            raise InputError(f"{path}: images[{i}] {problem}: fix or delete it")
    failed = manifest.get("failed", [])
    if not isinstance(failed, list) or not all(isinstance(f, dict) for f in failed):
        raise InputError(f"{path}: failed is not a list of entries: fix or delete it")
    return manifest


def _entry_problem(entry: Any) -> str:
    """What is wrong with one image entry of a manifest (or a feature file's metadata), or ``""``."""
    if not isinstance(entry, dict):
        return f"is a {type(entry).__name__}, not an entry"
    for key in ("path", "file"):
        value = entry.get(key)
        if not isinstance(value, str) or not value or Path(value).is_absolute() or ".." in Path(value).parts:
            return f"has {key} {value!r}, not a path inside the folder"
    for key in ENTRY_KEYS[2:]:
        value = entry.get(key)
        if not (isinstance(value, list) and len(value) == 2 and all(type(v) is int and v > 0 for v in value)):
            return f"has {key} {value!r}, not two positive whole numbers"
    return ""


def read_features(out_dir: str | os.PathLike[str]) -> Iterator[tuple[Path, dict[str, torch.Tensor]]]:
    """``(image path, {name: tensor})`` for every image of an export, in manifest order."""
    manifest = read_manifest(out_dir)
    root = Path(manifest["source_root"])
    for entry in manifest["images"]:
        yield root / entry["path"], load_file(str(Path(out_dir) / entry["file"]))
