"""Per image, the chosen blocks' patch grids, CLS and registers (vit5 and timm ViTs), in memory
or on disk (``<image path>.safetensors`` + ``manifest.json``; each file records the run and its
source's size and mtime, so a rerun redoes exactly what is missing). Each image runs at a fixed
size or its own (patch-rounded, ``max_side``); equal sizes are batched together, so the yield
order is not the listing order."""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from vit5.data import BadImageError, BadImageWarning, decode_image, resize_transform
from vit5.errors import InputError, Rule, rule_problems
from vit5.eval.common import (
    EVAL_FIX,
    LoadedModel,
    Size,
    check_settings,
    dense_features,
    feature_names,
    list_images,
    own_size,
)
from vit5.eval.outliers import artifact_score, fill_outliers
from vit5.eval.registers import RegisterNeuron, use_test_time_registers
from vit5.files import FolderLock, atomic_write_bytes, check_output_dir, read_json
from vit5.introspect import ModelInfo, Preprocessing, describe
from vit5.model import take_indices
from vit5.model.vit import unwrap
from vit5.outputs import to_jsonable, write_json

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_PENDING_BATCHES = 4  # decoded images allowed to wait in buckets, in batches
FORMAT = "vit5-features/1"
MANIFEST = "manifest.json"
SUFFIX = ".safetensors"
ARTIFACT_RULE = (
    "per image and exported block, on the patch tokens before the final norm: outliers have a "
    "norm above exp(median + {k} * 1.4826 * MAD) of the image's log-norms; outlier_share is "
    "their share, max_median the max / median patch norm"
)
_META_KEY = "vit5_features"
ENTRY_KEYS = ("path", "file", "image_size", "input_size", "grid")


# the manifest's fields, each checked (a crafted one is one clear error), and the defaults of
# those an older manifest may lack
MANIFEST_DEFAULTS = {"num_images": 0, "source_root": None, "images": None, "failed": []}
MANIFEST_RULES = (
    Rule("num_images", lambda v: type(v) is int and v >= 0, "a count"),
    Rule("source_root", lambda v: isinstance(v, str), "a str"),
    Rule("images", lambda v: isinstance(v, list), "a list"),
    Rule(
        "failed",
        lambda v: isinstance(v, list) and all(type(f) is dict for f in v),
        "a list of entries",
    ),
)


CLEAN = ("none", "ttr", "drop-outliers")
# settings added for artifact-aware features: left out of a run's identity at these values, so
# that a plain export keeps its run id and files (and resumes an older export)
_NEW_DEFAULTS = {"clean": "none", "outlier_k": 5.0, "neurons": ()}
_SETTINGS_RULES = (
    Rule("clean", lambda v: v in CLEAN, f"one of {CLEAN}"),
    Rule("outlier_k", lambda v: v > 0, "> 0"),
    Rule("dtype", lambda v: v in DTYPES, f"one of {sorted(DTYPES)}"),
    Rule("max_side", lambda v: v >= 1, ">= 1 or null"),
    Rule("batch_size", lambda v: v >= 1, ">= 1"),
    Rule("num_workers", lambda v: v >= 0, ">= 0"),
)


@dataclass(frozen=True)
class FeatureSettings:
    """What to extract; ``dtype`` is the storage dtype (the model runs in its own)."""

    layers: tuple[int, ...] = (-1,)  # blocks to take (negative counts from the end)
    # fixed input (H, W), patch multiples; None: each image's own size
    size: tuple[int, int] | None = None
    # with size=None: shrink images whose longer side exceeds it (aspect kept)
    max_side: int | None = None
    # the model's final norm on every block output (as DINO features are)
    norm: bool = False
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    batch_size: int = 8
    num_workers: int = 0
    # against artifacts: "ttr" runs with test-time registers fed by ``neurons`` (Jiang et al.,
    # arXiv 2506.08010); "drop-outliers" replaces outlier patches (the artifact metrics' rule,
    # ``outlier_k``) by the mean of their non-outlier 3x3 neighbours
    clean: Literal["none", "ttr", "drop-outliers"] = "none"
    outlier_k: float = 5.0  # MAD multiplier of the outlier rule (score and drop-outliers)
    neurons: tuple[RegisterNeuron, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(int(i) for i in self.layers))
        object.__setattr__(self, "neurons", tuple(self.neurons))
        if (self.clean == "ttr") != bool(self.neurons):
            raise InputError(
                "clean='ttr' needs register neurons (vit5 viz ttr's register_neurons.json, or "
                "the search), and neurons are only used by it"
            )
        if self.size is not None:
            object.__setattr__(self, "size", (int(self.size[0]), int(self.size[1])))
        check_settings(self, _SETTINGS_RULES)
        if self.size is not None and self.max_side is not None:
            raise InputError(
                f"max_side={self.max_side} and size={self.size}: give either a fixed size or "
                "max_side, which limits each image's own size, not both",
            )


@dataclass
class ImageFeatures:
    path: Path
    features: dict[str, torch.Tensor]  # per image: patches [C, h, w], cls [C], registers [R, C]
    image_size: Size  # decoded image (H, W)
    input_size: Size  # what the model saw
    # per exported block: outlier share, max / median patch norm (before the final norm)
    artifacts: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class FailedImage:
    path: Path
    reason: str


@dataclass
class _ResizedImages(Dataset):
    """``index -> (index, image or None, (H, W) or None, why it failed)``."""

    paths: Sequence[Path]
    settings: FeatureSettings
    patch_size: int
    preprocessing: Preprocessing

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor | None, Size | None, str]:
        try:
            image = decode_image(self.paths[index])
        except BadImageError as err:
            return index, None, None, err.reason
        image_size = (image.shape[0], image.shape[1])
        max_side = self.settings.max_side
        size = self.settings.size or own_size(image_size, self.patch_size, max_side)
        pre = self.preprocessing
        resized = resize_transform(size, mean=pre.mean, std=pre.std)(image)
        return index, resized, image_size, ""


def _as_is(item: tuple) -> tuple:
    return item


@dataclass(frozen=True)
class Prepared:
    """A model ready to give features: the module, its preprocessing and description, and the
    absolute blocks asked for."""

    module: nn.Module
    preprocessing: Preprocessing
    info: ModelInfo
    blocks: list[int]


def prepare(model: nn.Module | LoadedModel, settings: FeatureSettings) -> Prepared:
    """A bad size or block index fails here, first. A :class:`LoadedModel` brings its
    description and preprocessing; a bare module is described now."""
    if isinstance(model, LoadedModel):
        module = model.model
        info = model.info or describe(module)
        preprocessing = model.preprocessing
    else:
        module = model
        info = describe(module)
        preprocessing = info.preprocessing
    if settings.size is not None:
        info.grid(settings.size, EVAL_FIX)
    blocks = take_indices(info.depth, settings.layers, unique=True)
    return Prepared(module=module, preprocessing=preprocessing, info=info, blocks=blocks)


@contextmanager
def _block_outputs(module: nn.Module, blocks: Sequence[int]) -> Iterator[dict]:
    """``{block: output [B, N, C]}`` of the chosen blocks (before the final norm) and
    ``"layout"``, the token layout the blocks ran with (test-time registers included)."""
    net = unwrap(module)
    found: dict = {}

    def sizing(mod, args) -> None:
        found["layout"] = describe(net).layout(tuple(args[0].shape[-2:]))

    with ExitStack() as stack:
        stack.callback(net.patch_embed.register_forward_pre_hook(sizing).remove)
        for b in blocks:

            def keep(mod, args, output, b=b) -> None:
                found[b] = output.detach()

            stack.callback(net.blocks[b].register_forward_hook(keep).remove)
        yield found


def _patch_norms(raw: dict, block: int) -> np.ndarray:
    """``[B, P]`` float32 norms of a block's patch tokens, as the viz metrics take them."""
    return raw["layout"].patches(raw[block]).float().norm(dim=-1).cpu().numpy()


@torch.inference_mode()
def _features_from(
    raw: dict, module: nn.Module, batch: torch.Tensor, info: ModelInfo, blocks, norm: bool
) -> dict[str, torch.Tensor]:
    """:func:`dense_features`' names and shapes, read from the block outputs of one forward
    pass (with test-time registers, whose tokens timm's ``forward_intermediates`` cannot split);
    the registers are the trained ones, the test-time tokens are left out."""
    net = unwrap(module)
    net.forward_features(batch)
    layout = raw["layout"]
    features = {}
    # sliced first, then normed token by token (the final norm drops test-time tokens)
    finish = net.norm if norm else nn.Identity()
    for b in blocks:
        tokens = raw[b]
        patches = finish(layout.patches(tokens))
        features[f"blocks.{b}.patches"] = layout.to_nchw(patches)
        if info.num_cls:
            features[f"blocks.{b}.cls"] = finish(tokens[:, layout.cls_index])
        if info.num_registers:
            trained = layout.registers(tokens)[:, : info.num_registers]
            features[f"blocks.{b}.registers"] = finish(trained)
    return features


def extract(
    model: nn.Module | LoadedModel,
    paths: Sequence[str | os.PathLike[str]],
    settings: FeatureSettings,
) -> Iterator[ImageFeatures | FailedImage]:
    """Features (CPU, storage dtype) for each of ``paths``, or why an image failed; bucketed
    order."""
    prepared = prepare(model, settings)
    module = prepared.module
    info = prepared.info
    blocks = prepared.blocks
    paths = [Path(p) for p in paths]
    data = _ResizedImages(paths, settings, info.patch_size, prepared.preprocessing)
    loader = DataLoader(data, batch_size=None, num_workers=settings.num_workers, collate_fn=_as_is)
    device = next(module.parameters()).device
    module.eval()
    buckets: dict[Size, list[tuple]] = {}

    def run(items: list[tuple]) -> Iterator[ImageFeatures]:
        batch = torch.stack([image for _, image, _, _ in items]).to(device)
        with ExitStack() as stack:
            if settings.clean == "ttr":
                stack.enter_context(use_test_time_registers(module, settings.neurons))
            raw = stack.enter_context(_block_outputs(module, blocks))
            if settings.clean == "ttr":
                features = _features_from(raw, module, batch, info, blocks, settings.norm)
            else:
                features = dense_features(module, batch, info, blocks, norm=settings.norm)
        norms = {b: _patch_norms(raw, b) for b in blocks}
        features = {k: v.to(DTYPES[settings.dtype]).cpu() for k, v in features.items()}
        for i, (index, _, image_size, _) in enumerate(items):
            per_image = {k: v[i].clone() for k, v in features.items()}
            scores = {}
            for b in blocks:
                image_norms = norms[b][i]
                scores[f"blocks.{b}"] = artifact_score(image_norms, settings.outlier_k)
                if settings.clean == "drop-outliers":
                    name = f"blocks.{b}.patches"
                    outliers = image_norms > scores[f"blocks.{b}"]["threshold"]
                    grid = torch.from_numpy(outliers.reshape(per_image[name].shape[1:]))
                    per_image[name] = fill_outliers(per_image[name], grid)
                    scores[f"blocks.{b}"]["replaced"] = int(outliers.sum())
            size = tuple(batch.shape[-2:])
            yield ImageFeatures(paths[index], per_image, image_size, size, scores)

    for item in loader:
        index, image, _, reason = item
        if image is None:
            yield FailedImage(paths[index], reason)
            continue
        size = tuple(image.shape[-2:])
        buckets.setdefault(size, []).append(item)
        if len(buckets[size]) == settings.batch_size:
            yield from run(buckets.pop(size))
        elif sum(map(len, buckets.values())) >= _PENDING_BATCHES * settings.batch_size:
            for waiting in list(buckets):
                yield from run(buckets.pop(waiting))
    for waiting in list(buckets):
        yield from run(buckets.pop(waiting))


def iter_features(
    model: nn.Module | LoadedModel,
    images: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    settings: FeatureSettings = FeatureSettings(),
) -> Iterator[tuple[Path, dict[str, torch.Tensor]]]:
    """``(path, {name: tensor})`` for a folder (recursive), a file or a list of files; unreadable images
    are skipped with a :class:`~vit5.data.BadImageWarning`."""
    paths = list_images(images)[1] if isinstance(images, (str, os.PathLike)) else list(images)
    for item in extract(model, paths, settings):
        if isinstance(item, FailedImage):
            warnings.warn(
                f"skipping unreadable image {item.path}: {item.reason}",
                BadImageWarning,
                stacklevel=2,
            )
        else:
            yield item.path, item.features


@dataclass
class ExportSummary:
    out_dir: Path
    written: int
    skipped: int  # already complete from an earlier run
    failed: list[FailedImage] = field(default_factory=list)
    seconds: float = 0.0

    def __str__(self) -> str:
        rate = (
            f", {self.written / self.seconds:.1f} img/s"
            if self.seconds > 0 and self.written
            else ""
        )
        lines = [
            f"features -> {self.out_dir}: {self.written} written, {self.skipped} already done, "
            f"{len(self.failed)} failed ({self.seconds:.1f} s{rate})",
            *(f"  failed: {f.path}: {f.reason}" for f in self.failed[:10]),
        ]
        more = len(self.failed) - 10
        return "\n".join(lines + ([f"  ... {more} more in {MANIFEST}"] if more > 0 else []))


def model_fingerprint(model: nn.Module) -> str:
    """A short hash of every tensor's name, shape and a strided sample of its values (cheap, exact enough)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().flatten()
        digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(flat[:: max(1, flat.numel() // 4096)].float().cpu().numpy().tobytes())
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
    """Features of every image under ``images`` into ``out_dir`` (manifest rewritten every
    ``manifest_every_s``); InputError for features of another run (unless ``overwrite``), FolderLocked
    while another export writes there."""
    out_dir = check_output_dir(out_dir, "output folder")
    settings = settings or FeatureSettings()
    start = time.perf_counter()
    root, paths = list_images(images)
    prepared = prepare(model, settings)  # a bad size leaves no manifest behind
    module = prepared.module
    info = prepared.info
    blocks = prepared.blocks
    loop_only = ("batch_size", "num_workers")
    chosen = {k: v for k, v in asdict(settings).items() if k not in loop_only}
    for key, default in _NEW_DEFAULTS.items():
        if chosen[key] == default or key == "neurons" and not chosen[key]:
            del chosen[key]
    chosen["layers"] = blocks  # absolute: -1 and 11 are the same run
    identity = to_jsonable(
        {
            "model_fingerprint": model_fingerprint(module),
            "settings": chosen,
            "mean": tuple(prepared.preprocessing.mean),
            "std": tuple(prepared.preprocessing.std),
        },
    )
    run_id = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    header = {
        "format": FORMAT,
        "model": model.label if isinstance(model, LoadedModel) else type(module).__name__,
        **identity,
        "run_id": run_id,
        "blocks": blocks,
        "features": feature_names(info, blocks),
        **{k: getattr(info, k) for k in ("patch_size", "embed_dim", "has_cls", "num_registers")},
        "dtype": settings.dtype,
        "source_root": str(root.resolve()),
        "clean": settings.clean,
        "artifact_rule": ARTIFACT_RULE.format(k=settings.outlier_k),
    }
    with FolderLock(out_dir, "feature export"):
        old = {} if overwrite or not (out_dir / MANIFEST).is_file() else read_manifest(out_dir)
        # an empty manifest blocks nothing
        if old and old.get("run_id") != run_id and old["num_images"] > 0:
            differ = [k for k, v in identity.items() if old.get(k) != v]
            changed = "; ".join(f"{k}: {old.get(k)} -> {identity[k]}" for k in differ)
            raise InputError(
                f"{out_dir} holds features from another model or other settings "
                f"({changed or 'other format'}); use a new output folder, or overwrite to replace them",
            )
        for partial in out_dir.rglob(f"*{SUFFIX}*.partial"):  # left by a kill
            partial.unlink()
        done = {}
        if not overwrite:
            done = {path: _completed_entry(out_dir, root, path, run_id) for path in paths}
        entries: dict[str, dict[str, Any]] = {e["path"]: e for e in done.values() if e}
        todo = [path for path in paths if not done.get(path)]
        skipped = len(entries)
        failed = []

        def write_manifest(complete: bool) -> None:
            bad = [
                {"path": f.path.relative_to(root).as_posix(), "reason": f.reason} for f in failed
            ]
            images = [entries[k] for k in sorted(entries)]
            doc = dict(
                header,
                complete=complete,
                num_images=len(entries),
                images=images,
                failed=bad,
            )
            write_json(out_dir / MANIFEST, doc)

        write_manifest(complete=False)
        last_manifest = time.monotonic()
        items = extract(model, todo, settings)
        bar = tqdm(items, total=len(todo), desc="features", unit="img", disable=not progress)
        for item in bar:
            if isinstance(item, FailedImage):
                failed.append(item)
            else:
                entry = _write_image(out_dir, root, item, run_id, info.patch_size)
                entries[entry["path"]] = entry
            bar.set_postfix(failed=len(failed), refresh=False)
            if time.monotonic() - last_manifest > manifest_every_s:
                write_manifest(complete=False)
                last_manifest = time.monotonic()
        write_manifest(complete=True)
    return ExportSummary(
        out_dir,
        len(entries) - skipped,
        skipped,
        failed,
        time.perf_counter() - start,
    )


def _source_stat(path: Path) -> dict[str, int]:
    stat = path.stat()
    return {"source_bytes": stat.st_size, "source_mtime_ns": stat.st_mtime_ns}


def _write_image(
    out_dir: Path,
    root: Path,
    item: ImageFeatures,
    run_id: str,
    patch: int,
) -> dict[str, Any]:
    h, w = item.input_size
    rel = item.path.relative_to(root).as_posix()
    sizes = {
        "image_size": list(item.image_size),
        "input_size": [h, w],
        "grid": [h // patch, w // patch],
    }
    entry = {"path": rel, "file": rel + SUFFIX, **sizes}
    target = out_dir / entry["file"]
    scores = {"artifacts": item.artifacts}
    target.parent.mkdir(parents=True, exist_ok=True)
    meta = json.dumps({**entry, "run_id": run_id, **_source_stat(item.path), **scores})
    payload = save(
        {k: v.contiguous() for k, v in item.features.items()},
        metadata={_META_KEY: meta},
    )
    # many files: the manifest is the durable record
    atomic_write_bytes(target, payload, durable=False)
    return entry | scores


def _completed_entry(out_dir: Path, root: Path, path: Path, run_id: str) -> dict[str, Any] | None:
    """The manifest entry of an image whose feature file is complete and current, else None."""
    try:
        with safe_open(
            str(out_dir / (path.relative_to(root).as_posix() + SUFFIX)),
            framework="pt",
        ) as f:
            meta = json.loads((f.metadata() or {})[_META_KEY])
    except Exception:  # missing, unreadable or foreign file: compute it
        return None
    current = {"run_id": run_id, **_source_stat(path)}
    if _entry_problem(meta) or any(meta.get(k) != v for k, v in current.items()):
        return None  # foreign, crafted, of another run or of a changed source: recompute it
    if not isinstance(meta.get("artifacts"), dict):
        return None  # written before artifact scores: recompute it (same features)
    return {k: meta[k] for k in (*ENTRY_KEYS, "artifacts")}


def _entry_problem(entry: Any) -> str:
    """What is wrong with one image entry of a manifest (or a feature file's metadata), or ``""``."""
    if not isinstance(entry, dict):
        return f"is a {type(entry).__name__}, not an entry"
    for key in ("path", "file"):
        value = entry.get(key)
        if (
            not isinstance(value, str)
            or not value
            or Path(value).is_absolute()
            or ".." in Path(value).parts
        ):
            return f"has {key} {value!r}, not a path inside the folder"
    for key in ENTRY_KEYS[2:]:
        value = entry.get(key)
        if not (
            isinstance(value, list)
            and len(value) == 2
            and all(type(v) is int and v > 0 for v in value)
        ):
            return f"has {key} {value!r}, not two positive whole numbers"
    return ""


def read_manifest(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """An export's manifest, every field checked (a crafted or damaged one is one error naming the field)."""
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        raise InputError(f"{out_dir} has no {MANIFEST}; is it a feature export folder?")
    manifest = read_json(path)
    if not isinstance(manifest, dict):
        raise InputError(
            f"{path} holds a {type(manifest).__name__}, not a manifest object: fix or delete it",
        )
    if manifest.get("format") != FORMAT:
        raise InputError(f"{path} is not a {FORMAT} manifest (format {manifest.get('format')!r})")
    for key, default in MANIFEST_DEFAULTS.items():
        manifest.setdefault(key, default)
    problems = rule_problems(manifest, MANIFEST_RULES)
    if problems:
        raise InputError(f"{path}: {problems[0]}: fix or delete it")
    for i, entry in enumerate(manifest["images"]):
        if problem := _entry_problem(entry):
            raise InputError(f"{path}: images[{i}] {problem}: fix or delete it")
    return manifest


def read_features(
    out_dir: str | os.PathLike[str],
) -> Iterator[tuple[Path, dict[str, torch.Tensor]]]:
    """``(image path, {name: tensor})`` for every image of an export, in manifest order."""
    manifest = read_manifest(out_dir)
    root = Path(manifest["source_root"])
    for entry in manifest["images"]:
        yield root / entry["path"], load_file(str(Path(out_dir) / entry["file"]))
