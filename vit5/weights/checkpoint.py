"""Saving and loading weights: our hub-ready directory (``config.json`` + ``model.safetensors``),
official ViT-5 ``.pth`` and timm checkpoints.

Sizes are checked from the headers before anything is allocated, a ``.pth`` is loaded with
``weights_only=True``, and loading is strict except what a :class:`LoadReport` states: a head
reset, a resampled position embedding, a patch embedding resampled to another patch size.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import pickle
import re
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from safetensors.torch import save as save_safetensors
from timm.layers import resample_patch_embed
from timm.models import clean_state_dict

from vit5.errors import InputError, shorten, storage_error
from vit5.files import atomic_write_bytes
from vit5.layers import resample_pos_embed
from vit5.model.config import ConfigError, ViT5Config
from vit5.model.footprint import DEFAULT_MAX_PARAMS, check_size, parameter_count
from vit5.model.presets import PRESETS, closest_preset, preset_config
from vit5.model.vit import ViT5, default_pretrained_cfg
from vit5.outputs import write_json
from vit5.weights import catalog
from vit5.weights.convert import CheckpointError, HeadMismatchError, Source, convert, detect_source

CONFIG_NAME = "config.json"
PATCH_KEY = "patch_embed.proj.weight"
WEIGHTS_NAME = "model.safetensors"
EMA_WEIGHTS_NAME = "model_ema.safetensors"
# the manifest of a training checkpoint (RUN/checkpoints/ckpt-N, vit5.train.checkpointing): the state a
# run resumes from, not a model folder
TRAINING_MANIFEST = "checkpoint.json"
HEAD_KEYS = ("head.weight", "head.bias")
# stored, verified and rebuilt at run time: not parameters
ROPE_BUFFERS = ("rope.freqs", "rope_reg.freqs")
_CORRUPT = "{} is corrupt or truncated, not a readable safetensors file ({})"
Pretrained = str | os.PathLike | bool | None


@dataclass
class Checkpoint:
    """Raw weights read from disk, before conversion to a model."""

    state_dict: dict[str, torch.Tensor]
    source: Source
    config: ViT5Config | None = None  # only our format stores the config
    path: str = ""
    # our format: config.json's label_names (what each output means)
    class_names: list[str] | None = None


@dataclass
class LoadReport:
    """What a load did beyond copying tensors: the keys newly initialised, resampled, dropped."""

    source: str
    path: str = ""
    reset: list[str] = field(default_factory=list)
    resampled: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"loaded {self.path or 'weights'} ({self.source} format), strict"]
        if self.reset:
            reset = ", ".join(self.reset)
            lines.append(f"  newly initialised (not in the checkpoint's shape): {reset}")
        lines += [f"  resampled {item}" for item in self.resampled]
        if self.dropped:
            buffers = f"{len(self.dropped)} RoPE frequency buffers"
            lines.append(f"  verified and dropped (rebuilt at run time): {buffers}")
        return "\n".join(lines)


def save_pretrained(
    model: ViT5,
    directory: str | os.PathLike,
    ema_state_dict: dict[str, torch.Tensor] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (+ ``model_ema.safetensors``) atomically, in
    the layout that ``vit5.load_model`` and timm's ``hf-hub:`` / ``local-dir:`` read; ``extra`` adds
    top-level keys."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise storage_error(err, directory, "create") from err
    config = hub_config(model)
    write_json(directory / CONFIG_NAME, {**config, **(extra or {})})
    atomic_write_bytes(directory / WEIGHTS_NAME, safetensors_bytes(model.state_dict()))
    if ema_state_dict is not None:
        atomic_write_bytes(directory / EMA_WEIGHTS_NAME, safetensors_bytes(ema_state_dict))
    return directory


def hub_config(model: ViT5) -> dict[str, Any]:
    """The ``config.json`` timm's hub loader reads (``timm/models/_hub.py``, ``_parse_model_cfg``);
    ``model_args`` holds every config field, ``label_names`` sits at the top level as timm's
    ``push_to_hf_hub`` writes it."""
    cfg = model.cfg
    pretrained_cfg = default_pretrained_cfg(cfg.img_size, cfg.in_chans, cfg.num_classes)
    pretrained_cfg["paper_ids"] = catalog.PAPER_ID
    pretrained_cfg["paper_name"] = catalog.PAPER_NAME
    config = {
        "architecture": closest_preset(cfg),
        "num_classes": cfg.num_classes,
        "num_features": cfg.embed_dim,
    }
    if model.global_pool:
        config["global_pool"] = model.global_pool
    config["model_args"] = cfg.to_dict()
    config["pretrained_cfg"] = pretrained_cfg
    names = model.pretrained_cfg.get("label_names")
    if names and len(names) == cfg.num_classes:
        config["label_names"] = list(names)
    return config


def safetensors_bytes(state_dict: dict[str, torch.Tensor]) -> bytes:
    """A state dict as the bytes of a safetensors file (CPU, contiguous), ready for an atomic
    write."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}
    return save_safetensors(tensors, metadata={"format": "pt"})


def read_checkpoint(
    path: str | os.PathLike,
    use_ema: bool = False,
    source: Source | None = None,
    max_params: float = DEFAULT_MAX_PARAMS,
) -> Checkpoint:
    """Read our directory (or a run directory's ``final/``), a ``.safetensors`` file or a ``.pth``.

    Nothing is allocated unless a directory holds the model its ``config.json`` describes (at most
    ``max_params``), a file at most ``max_params`` values, a ``.pth`` at most ``16 * max_params``
    bytes (weights, EMA, AdamW).
    """
    path = Path(path)
    if not path.exists():
        hint = ""
        if catalog.is_weights_name(str(path)):
            hint = f" (released weights: {catalog.RELEASED_NAMES})"
        raise CheckpointError(f"checkpoint {path} does not exist{hint}")
    if path.is_dir():
        return _read_directory(checkpoint_dir(path), use_ema, max_params)
    if path.suffix == ".safetensors":
        values = sum(safetensors_header(path).values())
        if values > max_params:
            raise CheckpointError(
                f"{path} declares {values:,} values, more than the limit of "
                f"{max_params:,.0f} parameters: not loaded "
                "(pass max_params= to allow a larger model)"
            )
        sd = _load_safetensors(path)
    else:
        limit = int(16 * max_params)
        loaded = safe_torch_load(path, hint=_RESAVE_HINT, max_bytes=limit)
        sd = _unwrap(loaded, use_ema, path)
    return Checkpoint(state_dict=sd, source=source or detect_source(sd), path=str(path))


def checkpoint_dir(path: Path) -> Path:
    """``path`` itself, or the checkpoint directory of a run directory (``final/``, else its only
    one)."""
    if not path.is_dir() or (path / CONFIG_NAME).exists():
        return path
    found = sorted(d for d in path.iterdir() if _is_checkpoint_dir(d))
    if path / "final" in found:
        return path / "final"
    if len(found) > 1:
        choices = ", ".join(map(str, found))
        raise InputError(f"{path} holds several checkpoint directories, pick one: {choices}")
    # none: _read_directory explains what a checkpoint directory needs
    return found[0] if found else path


def _is_checkpoint_dir(path: Path) -> bool:
    return (path / CONFIG_NAME).is_file() and (path / WEIGHTS_NAME).is_file()


def _not_a_model_folder(path: Path, weights_name: str) -> str:
    """Why ``path`` cannot be loaded as a model, and what to give instead when it belongs to a run:
    a training checkpoint, or the folder of them, holds the state to resume from, not a model."""
    if (path / TRAINING_MANIFEST).is_file():
        run = path.parent.parent
        what = f"{path} is a training checkpoint (the state `vit5 train --resume` continues from)"
    elif any((child / TRAINING_MANIFEST).is_file() for child in path.glob("ckpt-*")):
        run = path.parent
        what = f"{path} holds a run's training checkpoints (the states `vit5 train --resume` continues from)"
    else:
        return (
            f"{path} is not a vit5 checkpoint directory: it needs {CONFIG_NAME} and {weights_name}"
        )
    folders = [str(run / name) for name in ("final", "best") if _is_checkpoint_dir(run / name)]
    if not folders:
        return (
            f"{what}, not a model folder, and its run {run} has no model folder yet: best/ is "
            f"written after the first validation, final/ at the end; `vit5 train --resume {run}` continues it"
        )
    return f"{what}, not a model folder; the run's model folders: {', '.join(folders)}"


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Load a safetensors file; safetensors checks each entry (dtype, span, overlaps) on opening
    it."""
    try:
        # the checks alone: a crafted file never reaches load_file
        with safe_open(str(path), "pt"):
            pass
        return load_file(str(path))
    # RuntimeError: the file could not be mapped
    except (SafetensorError, OSError, RuntimeError) as err:
        raise CheckpointError(_CORRUPT.format(path, err)) from err


def _read_directory(path: Path, use_ema: bool, max_params: float) -> Checkpoint:
    """Our directory; its config must be a vit5 model of at most ``max_params`` parameters, and
    exactly the model its weights file's header declares (a config edited or mixed up with another
    run is refused)."""
    config_file = path / CONFIG_NAME
    weights = path / (EMA_WEIGHTS_NAME if use_ema else WEIGHTS_NAME)
    if use_ema and _is_checkpoint_dir(path) and not weights.exists():
        raise CheckpointError(
            f"{path} holds no EMA weights ({EMA_WEIGHTS_NAME}): it was saved without them (a "
            "run with ema.enabled=false, or save_pretrained without ema_state_dict); load its "
            "raw weights (--weights raw on the command line, use_ema=False from Python)"
        )
    if not config_file.exists() or not weights.exists():
        raise CheckpointError(_not_a_model_folder(path, weights.name))
    try:
        data = json.loads(config_file.read_text())
        config = ViT5Config.from_dict(vit5_config(data))
    except ConfigError as err:
        raise ConfigError(f"{config_file}: {err}") from err
    # JSONDecodeError is a ValueError
    except (UnicodeDecodeError, TypeError, ValueError) as err:
        raise CheckpointError(
            f"{config_file} is corrupt or not a vit5 config ({type(err).__name__}: {err})"
        ) from err
    check_size(config, max_params, source=str(config_file))
    described = parameter_count(config)
    header = safetensors_header(weights)
    held = sum(n for k, n in header.items() if not k.endswith(ROPE_BUFFERS))
    if described != held:
        raise ConfigError(
            f"{config_file} describes a model of {described:,} parameters, "
            f"but {weights.name} holds {held:,}: the config does not belong to these weights "
            "(edited, or copied from another run)"
        )
    names = data.get("label_names")
    if names is not None and not _is_name_list(names):
        raise CheckpointError(
            f"{config_file}: label_names must be a list of class names, not {shorten(names)}"
        )
    return Checkpoint(
        state_dict=_load_safetensors(weights),
        source="vit5",
        config=config,
        path=str(path),
        class_names=names,
    )


def _is_name_list(names: Any) -> bool:
    return isinstance(names, list) and all(isinstance(n, str) for n in names)


def safetensors_header(path: str | os.PathLike) -> dict[str, int]:
    """Each tensor's number of values, from the header alone (safetensors checks the offsets on
    loading)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            header = json.loads(f.read(_header_length(f.read(8), size)))
        shapes = {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
        for name, shape in shapes.items():
            if not _is_shape(shape):
                wanted = "a list of non-negative integers"
                raise ValueError(f"tensor {name!r} has shape {shape!r}, not {wanted}")
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read ({err.strerror or err})") from err
    # not JSON, not an object of objects
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise CheckpointError(_CORRUPT.format(path, err)) from err
    return {name: math.prod(shape) for name, shape in shapes.items()}


def _header_length(prefix: bytes, size: int) -> int:
    """The header length a safetensors file's first 8 bytes declare, within safetensors' own limit
    (100 MB) and the file."""
    length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
    if not 0 < length <= min(100_000_000, size - 8):
        raise ValueError(f"it declares a header of {length:,} bytes in a file of {size:,}")
    return length


def _is_shape(shape: Any) -> bool:
    return isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)


def vit5_config(data: Any) -> Any:
    """The :class:`ViT5Config` fields of a hub-ready ``config.json`` (``architecture`` +
    ``model_args`` over that preset, as timm reads it), not yet validated; anything else is a
    ``ValueError`` saying what it is."""
    if not isinstance(data, dict):
        raise ValueError(f"it holds a {type(data).__name__}, not an object")
    if data.get("architecture") in PRESETS:
        args = data.get("model_args", {})
        if not isinstance(args, dict):
            return args  # ViT5Config.from_dict says what it is instead of a mapping
        fields = preset_config(data["architecture"]).to_dict()
        if "num_classes" in data:
            fields["num_classes"] = data["num_classes"]
        return {**fields, **args}
    if "architecture" in data:
        raise ValueError(
            f"it describes the timm model {data['architecture']!r}, not a vit5 model: load it with "
            "timm.create_model('hf-hub:...' or 'local-dir:...', pretrained=True)"
        )
    if "model_type" in data or "architectures" in data:
        kind = ", ".join(data.get("architectures") or []) or "model"
        model_type = data.get("model_type")
        raise ValueError(
            f"it describes a Hugging Face transformers {kind} "
            f"(model_type {model_type!r}), not a vit5 / timm model"
        )
    raise ValueError(
        "it has none of the keys of a vit5 or timm config (architecture, model_args); "
        f"its keys: {sorted(data)[:10]}"
    )


_RESAVE_HINT = (
    "If you trust the file, re-save just its weights: "
    "torch.save(torch.load(path, weights_only=False)['model'], 'weights.pth')"
)
_BLOCKED_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) (\S+)")
_BLOCKED_OTHER = re.compile(r"WeightsUnpickler error: \s*(.+?)\s*(?:\n|$)")
FileOrBytes = str | os.PathLike | bytes


def safe_torch_load(
    source: FileOrBytes,
    hint: str = "",
    name: str = "",
    max_bytes: int | None = None,
) -> Any:
    """``torch.load(weights_only=True)`` of a file or its bytes: tensors, plain containers and the
    official script's ``argparse.Namespace``; no pickled code runs.

    The zip directory is read first: a compressed entry (a DEFLATE bomb), one beyond the file's end
    or more than ``max_bytes`` in all are refused. Every failure is one CheckpointError.
    """
    in_memory = isinstance(source, bytes)
    label = name or ("the file" if in_memory else os.fspath(source))
    _check_zip_entries(source, label, max_bytes)
    unreadable = f"{label} is not a readable PyTorch checkpoint (corrupt or truncated"
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            file = io.BytesIO(source) if in_memory else source
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        blocked = _BLOCKED_GLOBAL.search(str(err))
        if blocked is None:
            other = _BLOCKED_OTHER.search(str(err))
            detail = other.group(1) if other else str(err).splitlines()[0]
            raise CheckpointError(f"{unreadable}, or not written by torch.save: {detail})") from err
        found = blocked[1].rstrip(".,")
        raise CheckpointError(
            f"{label} contains pickled objects other than tensors (the global {found}), "
            f"which vit5 refuses to execute (torch.load with weights_only=True). {hint}".rstrip()
        ) from err
    # a damaged file fails in many ways (EOF, zip, struct): one message for all
    except Exception as err:
        raise CheckpointError(f"{unreadable}: {type(err).__name__}: {err})") from err


def _check_zip_entries(source: FileOrBytes, label: str, max_bytes: int | None) -> None:
    """Refuse a ``torch.save`` zip whose directory declares compressed entries, entries beyond the
    file's end, or more than ``max_bytes`` of tensors."""
    in_memory = isinstance(source, bytes)
    try:
        size = len(source) if in_memory else os.path.getsize(source)
        with zipfile.ZipFile(io.BytesIO(source) if in_memory else source) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return  # not a zip (torch's legacy format), or unreadable: torch.load says what it is
    compressed = [info for info in entries if info.compress_type != zipfile.ZIP_STORED]
    if compressed:
        worst = max(compressed, key=lambda info: info.file_size)
        raise CheckpointError(
            f"{label}: {len(compressed)} of its entries are compressed "
            f"(e.g. {worst.filename}: {worst.compress_size:,} bytes expanding to "
            f"{worst.file_size:,}), which torch.save never writes: not loaded "
            "(a decompression bomb, or a re-zipped file: re-save it with torch.save)"
        )
    for info in entries:
        if info.header_offset + info.file_size > size:
            raise CheckpointError(
                f"{label}: entry {info.filename} declares {info.file_size:,} bytes beyond the "
                f"end of the file ({size:,} bytes): corrupt, truncated or crafted, not loaded"
            )
    total = sum(info.file_size for info in entries)
    if max_bytes is not None and total > max_bytes:
        raise CheckpointError(
            f"{label} holds {total:,} bytes of tensors, more than the limit of {max_bytes:,} "
            "(16 bytes per parameter of max_params): not loaded "
            "(pass max_params= to allow a larger model)"
        )


def _unwrap(obj: Any, use_ema: bool, path: Path | str) -> dict[str, torch.Tensor]:
    """The state dict in a training checkpoint (``model`` / ``state_dict`` / EMA), ``module.``
    stripped."""
    if isinstance(obj, dict) and not _all_tensors(obj):
        if use_ema:
            keys = ("model_ema", "state_dict_ema")
        else:
            keys = ("model", "state_dict", "module")
        found = next((obj[k] for k in keys if isinstance(obj.get(k), dict)), None)
        if found is None:
            if use_ema:
                wanted = "EMA weights ('model_ema')"
            else:
                wanted = "a state dict ('model' or 'state_dict')"
            keys = sorted(obj)[:10]
            raise CheckpointError(f"{path} holds no {wanted}; its top-level keys are {keys}")
        obj = found
    if not isinstance(obj, dict) or not _all_tensors(obj):
        raise CheckpointError(f"{path} does not hold a state dict of tensors")
    return clean_state_dict(obj)  # DDP's "module." prefix removed


def _all_tensors(mapping: dict) -> bool:
    return all(isinstance(v, torch.Tensor) for v in mapping.values())


def load_weights(model: ViT5, ckpt: Checkpoint, ignore_head: bool = False) -> LoadReport:
    """Load ``ckpt`` into ``model`` strictly; resample the APE and the patch embedding; reset the
    head only if ``ignore_head``."""
    report = LoadReport(source=ckpt.source, path=ckpt.path)
    report.dropped = [k for k in ckpt.state_dict if k.endswith(ROPE_BUFFERS)]
    converted = _converted(ckpt, model, report)
    expected = model.state_dict()
    for key in HEAD_KEYS if ignore_head else ():
        if key not in expected:
            continue
        if key not in converted or converted[key].shape != expected[key].shape:
            converted[key] = expected[key]
            report.reset.append(key)
    _check_fit(converted, expected, ckpt)
    model.load_state_dict(converted, strict=True)
    return report


def checkpoint_filter_fn(state_dict: dict[str, Any], model: ViT5) -> dict[str, torch.Tensor]:
    """timm's ``pretrained_filter_fn``: an official, timm or vit5 state dict (or a training
    checkpoint) in this model's names, the APE and patch embedding resampled, strictly checked
    except the head and the first conv's channels, which timm adapts next."""
    label = "the pretrained checkpoint"
    sd = _unwrap(state_dict, use_ema=False, path=label)
    ckpt = Checkpoint(state_dict=sd, source=detect_source(sd), path=label)
    converted = _converted(ckpt, model, LoadReport(source=ckpt.source))
    adaptable = (*HEAD_KEYS, PATCH_KEY)
    _check_fit(converted, model.state_dict(), ckpt, adaptable=adaptable)
    return converted


def _converted(ckpt: Checkpoint, model: ViT5, report: LoadReport) -> dict[str, torch.Tensor]:
    """``ckpt`` in this model's names, its patch embedding and APE resampled to the model's patch
    size and grid."""
    sd = convert(ckpt.state_dict, ckpt.source, model.cfg)
    _resample_patch_embed(sd, model, report)
    _resample_ape(sd, ckpt, model, report)
    return sd


def _resample_patch_embed(sd: dict, model: ViT5, report: LoadReport) -> None:
    """A patch embedding of another patch size, resized by the pseudo-inverse of the image resize
    (FlexiViT, arXiv 2212.08013, sec. 3.4) with timm's ``resample_patch_embed``, as timm's ViT
    loader does (bicubic, antialiased): a patch resized as the images are gives the token the
    checkpoint's kernel gives the original patch, exactly when the patch grows, in the least-squares
    sense when it shrinks."""
    kernel = sd.get(PATCH_KEY)
    target = model.patch_embed.proj.weight
    if kernel is None or kernel.ndim != 4 or kernel.shape[-2:] == target.shape[-2:]:
        return
    if kernel.shape[0] != target.shape[0]:
        return  # another width: _check_fit names it
    old = "x".join(map(str, kernel.shape[-2:]))
    new = "x".join(map(str, target.shape[-2:]))
    sd[PATCH_KEY] = resample_patch_embed(kernel, list(target.shape[-2:]))
    report.resampled.append(
        f"{PATCH_KEY} {old} -> {new} (to the model's patch_size by FlexiViT's "
        "pseudo-inverse resize, arXiv 2212.08013 sec. 3.4)"
    )


def _resample_ape(sd: dict, ckpt: Checkpoint, model: ViT5, report: LoadReport) -> None:
    """The APE resampled (bicubic) from the checkpoint's grid to the model's."""
    pos = sd.get("pos_embed")
    if pos is None or model.pos_embed is None or pos.shape == model.pos_embed.shape:
        return
    if pos.shape[-1] != model.pos_embed.shape[-1]:
        return  # a width mismatch: _check_fit names it
    side = math.isqrt(pos.shape[1])
    if ckpt.config is not None:
        old_grid = ckpt.config.grid_size
    elif side * side == pos.shape[1]:
        old_grid = (side, side)
    else:
        rows = pos.shape[1]
        raise CheckpointError(f"pos_embed of {rows} rows in {ckpt.path} is not a square grid")
    new_grid = model.cfg.grid_size
    sd["pos_embed"] = resample_pos_embed(pos, old_grid, new_grid)
    old = "x".join(map(str, old_grid))
    new = "x".join(map(str, new_grid))
    report.resampled.append(f"pos_embed {old} -> {new} (bicubic)")


def _check_fit(sd: dict, expected: dict, ckpt: Checkpoint, adaptable: tuple[str, ...] = ()) -> None:
    """Raise unless ``sd`` has exactly the keys and shapes of ``expected`` (``adaptable`` keys may
    differ)."""
    missing = [k for k in expected if k not in sd and k not in adaptable]
    unexpected = [k for k in sd if k not in expected and k not in adaptable]
    shared = [k for k in sd if k in expected and k not in adaptable]
    mismatched = [k for k in shared if sd[k].shape != expected[k].shape]
    if not (missing or unexpected or mismatched):
        return
    lines = [f"checkpoint {ckpt.path} ({ckpt.source} format) does not fit the model:"]
    for word, keys in (("missing", missing), ("unexpected", unexpected)):
        if keys:
            more = " ..." if len(keys) > 12 else ""
            lines.append(f"  {word} ({len(keys)}): {', '.join(keys[:12])}{more}")
    for k in mismatched[:12]:
        theirs = tuple(sd[k].shape)
        ours = tuple(expected[k].shape)
        lines.append(f"  shape mismatch {k}: checkpoint {theirs} vs model {ours}")
    # another number of classes (a head of another width is the width's mismatch)
    head = any(sd[k].shape[0] != expected[k].shape[0] for k in mismatched if k in HEAD_KEYS)
    if head:
        classes = sd["head.weight"].shape[0] if "head.weight" in sd else "?"
        lines.append(
            f"  the head was trained for {classes} classes: pass num_classes={classes} to keep "
            "it, or ignore_head=True (a new num_classes when fine-tuning) to start a new head"
        )
        raise HeadMismatchError("\n".join(lines))
    if missing or unexpected:
        lines.append(
            "  check the model name / config (num_registers, qk_norm, rope, norm, qkv_bias) and "
            "the source format"
        )
    raise CheckpointError("\n".join(lines))
