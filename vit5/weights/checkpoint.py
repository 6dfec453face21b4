"""Saving and loading weights: our hub-ready directory (``config.json`` + ``model.safetensors``), official
ViT-5 ``.pth`` and timm checkpoints; sizes checked from headers before allocation, ``.pth`` loaded with
``weights_only=True``, strict except what a :class:`LoadReport` states (a head reset, a resampled APE)."""

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
from timm.models import clean_state_dict

from vit5.errors import InputError, shorten, storage_error
from vit5.files import atomic_write_bytes
from vit5.layers import resample_pos_embed
from vit5.model.config import ConfigError, ViT5Config
from vit5.model.footprint import DEFAULT_MAX_PARAMS, check_size, parameter_count
from vit5.model.presets import PRESETS, closest_preset, preset_config
from vit5.model.vit import ViT5, default_pretrained_cfg
from vit5.outputs import write_json
from vit5.weights import hub
from vit5.weights.convert import CheckpointError, HeadMismatchError, Source, convert, detect_source

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
EMA_WEIGHTS_NAME = "model_ema.safetensors"
HEAD_KEYS = ("head.weight", "head.bias")
ROPE_BUFFERS = ("rope.freqs", "rope_reg.freqs")  # stored, verified, rebuilt at run time: not parameters
_CORRUPT = "{} is corrupt or truncated, not a readable safetensors file ({})"
Pretrained = str | os.PathLike | bool | None


@dataclass
class Checkpoint:
    """Raw weights read from disk, before conversion to a model."""

    state_dict: dict[str, torch.Tensor]
    source: Source
    config: ViT5Config | None = None  # only our format stores the config
    path: str = ""
    class_names: list[str] | None = None  # our format: config.json's label_names (what each output means)


@dataclass
class LoadReport:
    source: str
    path: str = ""
    reset: list[str] = field(default_factory=list)
    resampled: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"loaded {self.path or 'weights'} ({self.source} format), strict"]
        if self.reset:
            lines.append(f"  newly initialised (not in the checkpoint's shape): {', '.join(self.reset)}")
        lines += [f"  resampled {item}" for item in self.resampled]
        if self.dropped:
            lines.append(
                f"  verified and dropped (rebuilt at run time): {len(self.dropped)} RoPE frequency buffers"
            )
        return "\n".join(lines)


def save_pretrained(
    model: ViT5,
    directory: str | os.PathLike,
    ema_state_dict: dict[str, torch.Tensor] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (+ ``model_ema.safetensors``) atomically, in the layout
    that ``vit5.load_model`` and timm's ``hf-hub:`` / ``local-dir:`` read; ``extra`` adds top-level keys."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise storage_error(err, directory, "create") from err
    cfg, names = model.cfg, model.pretrained_cfg.get("label_names")
    config = {  # what timm's hub loader reads (timm _hub._parse_model_cfg); model_args: every config field
        "architecture": closest_preset(cfg),
        "num_classes": cfg.num_classes,
        "num_features": cfg.embed_dim,
        **({"global_pool": model.global_pool} if model.global_pool else {}),
        "model_args": cfg.to_dict(),
        "pretrained_cfg": dict(
            default_pretrained_cfg(cfg.img_size, cfg.in_chans, cfg.num_classes),
            paper_ids=hub.PAPER_ID,
            paper_name=hub.PAPER_NAME,
        ),  # label_names at the top level, as timm's push_to_hf_hub writes them
        **({"label_names": list(names)} if names and len(names) == cfg.num_classes else {}),
    }
    write_json(directory / CONFIG_NAME, {**config, **(extra or {})})
    atomic_write_bytes(directory / WEIGHTS_NAME, safetensors_bytes(model.state_dict()))
    if ema_state_dict is not None:
        atomic_write_bytes(directory / EMA_WEIGHTS_NAME, safetensors_bytes(ema_state_dict))
    return directory


def safetensors_bytes(state_dict: dict[str, torch.Tensor]) -> bytes:
    """A state dict as the bytes of a safetensors file (CPU, contiguous), ready for an atomic write."""
    return save_safetensors(
        {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}, metadata={"format": "pt"}
    )


def read_checkpoint(
    path: str | os.PathLike,
    use_ema: bool = False,
    source: Source | None = None,
    max_params: float = DEFAULT_MAX_PARAMS,
) -> Checkpoint:
    """Read our directory (or a run directory's ``final/``), a ``.safetensors`` file or a ``.pth``; nothing is
    allocated unless a directory holds the model its ``config.json`` describes (at most ``max_params``),
    a file holds at most ``max_params`` values, a ``.pth`` ``16 * max_params`` bytes (weights, EMA, AdamW)."""
    path = Path(path)
    if not path.exists():
        hint = f" (released weights: {', '.join(hub.RELEASES)})" if hub.is_weights_name(str(path)) else ""
        raise CheckpointError(f"checkpoint {path} does not exist{hint}")
    if path.is_dir():
        return _read_directory(checkpoint_dir(path), use_ema, max_params)
    if path.suffix == ".safetensors":
        values = sum(safetensors_header(path).values())
        if values > max_params:
            raise CheckpointError(
                f"{path} declares {values:,} values, more than the limit of {max_params:,.0f} parameters: "
                "not loaded (pass max_params= to allow a larger model)"
            )
        sd = _load_safetensors(path)
    else:
        sd = _unwrap(safe_torch_load(path, hint=_RESAVE_HINT, max_bytes=int(16 * max_params)), use_ema, path)
    return Checkpoint(sd, source or detect_source(sd), path=str(path))


def checkpoint_dir(path: Path) -> Path:
    """``path`` itself, or the checkpoint directory of a run directory (``final/``, else its only one)."""
    if not path.is_dir() or (path / CONFIG_NAME).exists():
        return path
    found = sorted(d for d in path.iterdir() if (d / CONFIG_NAME).is_file() and (d / WEIGHTS_NAME).is_file())
    if path / "final" in found:
        return path / "final"
    if len(found) > 1:
        raise InputError(
            f"{path} holds several checkpoint directories, pick one: {', '.join(map(str, found))}"
        )
    return found[0] if found else path  # none: _read_directory explains what a checkpoint directory needs


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Load a safetensors file; safetensors checks each entry (dtype, span, overlaps) on opening it."""
    try:
        with safe_open(str(path), "pt"):  # the checks alone: a crafted file never reaches load_file
            pass
        return load_file(str(path))
    except (SafetensorError, OSError, RuntimeError) as err:  # RuntimeError: the file could not be mapped
        raise CheckpointError(_CORRUPT.format(path, err)) from err


def _read_directory(path: Path, use_ema: bool, max_params: float) -> Checkpoint:
    """Our directory; its config must be a vit5 model of at most ``max_params`` parameters, and exactly the
    model its weights file's header declares (a config edited or mixed up with another run is refused)."""
    config_file, weights = path / CONFIG_NAME, path / (EMA_WEIGHTS_NAME if use_ema else WEIGHTS_NAME)
    if not config_file.exists() or not weights.exists():
        raise CheckpointError(
            f"{path} is not a vit5 checkpoint directory: it needs {CONFIG_NAME} and {weights.name}"
            + (" (this run saved no EMA weights: drop use_ema)" if use_ema and config_file.exists() else "")
        )
    try:
        data = json.loads(config_file.read_text())
        config = ViT5Config.from_dict(vit5_config(data))
    except ConfigError as err:
        raise ConfigError(f"{config_file}: {err}") from err
    except (UnicodeDecodeError, TypeError, ValueError) as err:  # JSONDecodeError is a ValueError
        raise CheckpointError(
            f"{config_file} is corrupt or not a vit5 config ({type(err).__name__}: {err})"
        ) from err
    check_size(config, max_params, source=str(config_file))
    described = parameter_count(config)
    held = sum(n for k, n in safetensors_header(weights).items() if not k.endswith(ROPE_BUFFERS))
    if described != held:
        raise ConfigError(
            f"{config_file} describes a model of {described:,} parameters, but {weights.name} holds "
            f"{held:,}: the config does not belong to these weights (edited, or copied from another run)"
        )
    names = data.get("label_names")
    if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
        raise CheckpointError(
            f"{config_file}: label_names must be a list of class names, not {shorten(names)}"
        )
    sd = _load_safetensors(weights)
    return Checkpoint(sd, "vit5", config=config, path=str(path), class_names=names)


def safetensors_header(path: str | os.PathLike) -> dict[str, int]:
    """Each tensor's number of values, from the header alone (safetensors checks the offsets on loading)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size, prefix = os.fstat(f.fileno()).st_size, f.read(8)
            length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
            if not 0 < length <= min(100_000_000, size - 8):  # safetensors' own header limit
                raise ValueError(f"it declares a header of {length:,} bytes in a file of {size:,}")
            header = json.loads(f.read(length))
        shapes = {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
        for name, shape in shapes.items():
            if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
                raise ValueError(f"tensor {name!r} has shape {shape!r}, not a list of non-negative integers")
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read ({err.strerror or err})") from err
    except (ValueError, TypeError, KeyError, AttributeError) as err:  # not JSON, not an object of objects
        raise CheckpointError(_CORRUPT.format(path, err)) from err
    return {name: math.prod(shape) for name, shape in shapes.items()}


def vit5_config(data: Any) -> Any:
    """The :class:`ViT5Config` fields of a hub-ready ``config.json`` (``architecture`` + ``model_args`` over
    that preset, as timm reads it), not yet validated; anything else is a ``ValueError`` saying what it is."""
    if not isinstance(data, dict):
        raise ValueError(f"it holds a {type(data).__name__}, not an object")
    if data.get("architecture") in PRESETS:
        args = data.get("model_args", {})
        if not isinstance(args, dict):
            return args  # ViT5Config.from_dict says what it is instead of a mapping
        top = {"num_classes": data["num_classes"]} if "num_classes" in data else {}
        return {**preset_config(data["architecture"]).to_dict(), **top, **args}
    if "architecture" in data:
        raise ValueError(
            f"it describes the timm model {data['architecture']!r}, not a vit5 model: load it with "
            "timm.create_model('hf-hub:...' or 'local-dir:...', pretrained=True)"
        )
    if "model_type" in data or "architectures" in data:
        kind = ", ".join(data.get("architectures") or []) or "model"
        raise ValueError(
            f"it describes a Hugging Face transformers {kind} (model_type {data.get('model_type')!r}), "
            "not a vit5 / timm model"
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


def safe_torch_load(
    source: str | os.PathLike | bytes, hint: str = "", name: str = "", max_bytes: int | None = None
) -> Any:
    """``torch.load(weights_only=True)`` of a file or its bytes (tensors, plain containers, the official
    script's ``argparse.Namespace``; no pickled code runs), refusing from the zip directory a compressed entry
    (a DEFLATE bomb), one beyond the file's end, or over ``max_bytes``; every failure one CheckpointError."""
    label = name or (os.fspath(source) if not isinstance(source, bytes) else "the file")
    try:
        size = len(source) if isinstance(source, bytes) else os.path.getsize(source)
        with zipfile.ZipFile(io.BytesIO(source) if isinstance(source, bytes) else source) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        entries = []  # not a zip (torch's legacy format), or unreadable: torch.load says what it is
    compressed = [info for info in entries if info.compress_type != zipfile.ZIP_STORED]
    if compressed:
        worst = max(compressed, key=lambda info: info.file_size)
        raise CheckpointError(
            f"{label}: {len(compressed)} of its entries are compressed (e.g. {worst.filename}: "
            f"{worst.compress_size:,} bytes expanding to {worst.file_size:,}), which torch.save never "
            "writes: not loaded (a decompression bomb, or a re-zipped file: re-save it with torch.save)"
        )
    for info in entries:
        if info.header_offset + info.file_size > size:
            raise CheckpointError(
                f"{label}: entry {info.filename} declares {info.file_size:,} bytes beyond the end of the "
                f"file ({size:,} bytes): corrupt, truncated or crafted, not loaded"
            )
    total = sum(info.file_size for info in entries)
    if max_bytes is not None and total > max_bytes:
        raise CheckpointError(
            f"{label} holds {total:,} bytes of tensors, more than the limit of {max_bytes:,} (16 bytes per "
            "parameter of max_params): not loaded (pass max_params= to allow a larger model)"
        )
    unreadable = f"{label} is not a readable PyTorch checkpoint (corrupt or truncated"
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            file = io.BytesIO(source) if isinstance(source, bytes) else source
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        blocked, other = _BLOCKED_GLOBAL.search(str(err)), _BLOCKED_OTHER.search(str(err))
        if blocked is None:
            detail = other.group(1) if other else str(err).splitlines()[0]
            raise CheckpointError(f"{unreadable}, or not written by torch.save: {detail})") from err
        raise CheckpointError(
            f"{label} contains pickled objects other than tensors (the global {blocked[1].rstrip('.,')}), "
            f"which vit5 refuses to execute (torch.load with weights_only=True). {hint}".rstrip()
        ) from err
    except Exception as err:  # a damaged file fails in many ways (EOF, zip, struct): one message for all
        raise CheckpointError(f"{unreadable}: {type(err).__name__}: {err})") from err


def _unwrap(obj: Any, use_ema: bool, path: Path | str) -> dict[str, torch.Tensor]:
    """The state dict in a training checkpoint (``model`` / ``state_dict`` / EMA), ``module.`` stripped."""
    if isinstance(obj, dict) and not all(isinstance(v, torch.Tensor) for v in obj.values()):
        keys = ("model_ema", "state_dict_ema") if use_ema else ("model", "state_dict", "module")
        found = next((obj[k] for k in keys if isinstance(obj.get(k), dict)), None)
        if found is None:
            wanted = "EMA weights ('model_ema')" if use_ema else "a state dict ('model' or 'state_dict')"
            raise CheckpointError(f"{path} holds no {wanted}; its top-level keys are {sorted(obj)[:10]}")
        obj = found
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path} does not hold a state dict of tensors")
    return clean_state_dict(obj)  # DDP's "module." prefix removed


def load_weights(model: ViT5, ckpt: Checkpoint, ignore_head: bool = False) -> LoadReport:
    """Load ``ckpt`` into ``model`` strictly; resample the APE; reset the head only if ``ignore_head``."""
    report = LoadReport(source=ckpt.source, path=ckpt.path)
    report.dropped = [k for k in ckpt.state_dict if k.endswith(ROPE_BUFFERS)]
    converted, expected = _converted(ckpt, model, report), model.state_dict()
    for key in HEAD_KEYS if ignore_head else ():
        if key in expected and (key not in converted or converted[key].shape != expected[key].shape):
            converted[key] = expected[key]
            report.reset.append(key)
    _check_fit(converted, expected, ckpt)
    model.load_state_dict(converted, strict=True)
    return report


def checkpoint_filter_fn(state_dict: dict[str, Any], model: ViT5) -> dict[str, torch.Tensor]:
    """timm's ``pretrained_filter_fn``: an official, timm or vit5 state dict (or a training checkpoint) in
    this model's names, APE resampled, strictly checked except the head and first conv timm adapts next."""
    sd = _unwrap(state_dict, use_ema=False, path="the pretrained checkpoint")
    ckpt = Checkpoint(sd, detect_source(sd), path="the pretrained checkpoint")
    converted = _converted(ckpt, model, LoadReport(source=ckpt.source))
    _check_fit(converted, model.state_dict(), ckpt, adaptable=(*HEAD_KEYS, "patch_embed.proj.weight"))
    return converted


def _converted(ckpt: Checkpoint, model: ViT5, report: LoadReport) -> dict[str, torch.Tensor]:
    """``ckpt`` in this model's names, its APE resampled (bicubic) to the model's grid."""
    sd = convert(ckpt.state_dict, ckpt.source, model.cfg)
    pos = sd.get("pos_embed")
    if pos is None or model.pos_embed is None or pos.shape == model.pos_embed.shape:
        return sd
    side = math.isqrt(pos.shape[1])
    old_grid = ckpt.config.grid_size if ckpt.config is not None else (side, side)
    if ckpt.config is None and side * side != pos.shape[1]:
        raise CheckpointError(f"pos_embed of {pos.shape[1]} rows in {ckpt.path} is not a square grid")
    if pos.shape[-1] == model.pos_embed.shape[-1]:  # a width mismatch is reported by _check_fit
        new_grid = model.cfg.grid_size
        sd["pos_embed"] = resample_pos_embed(pos, old_grid, new_grid)
        report.resampled.append(
            f"pos_embed {old_grid[0]}x{old_grid[1]} -> {new_grid[0]}x{new_grid[1]} (bicubic)"
        )
    return sd


def _check_fit(sd: dict, expected: dict, ckpt: Checkpoint, adaptable: tuple[str, ...] = ()) -> None:
    """Raise unless ``sd`` has exactly the keys and shapes of ``expected`` (``adaptable`` keys may differ)."""
    missing = [k for k in expected if k not in sd and k not in adaptable]
    unexpected = [k for k in sd if k not in expected and k not in adaptable]
    mismatched = [k for k in sd if k in expected and sd[k].shape != expected[k].shape and k not in adaptable]
    if not (missing or unexpected or mismatched):
        return
    lines = [f"checkpoint {ckpt.path} ({ckpt.source} format) does not fit the model:"]
    for word, keys in (("missing", missing), ("unexpected", unexpected)):
        if keys:
            lines.append(f"  {word} ({len(keys)}): {', '.join(keys[:12])}{' ...' if len(keys) > 12 else ''}")
    lines += [
        f"  shape mismatch {k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in mismatched[:12]
    ]
    head = any(k in HEAD_KEYS for k in mismatched)
    if head:
        classes = sd["head.weight"].shape[0] if "head.weight" in sd else "?"
        lines.append(
            f"  the head was trained for {classes} classes: pass num_classes={classes} to keep it, or "
            "ignore_head=True (a new num_classes when fine-tuning) to start a new head"
        )
    elif missing or unexpected:
        lines.append(
            "  check the model name / config (num_registers, qk_norm, rope, norm, qkv_bias) and the source "
            "format"
        )
    raise (HeadMismatchError if head else CheckpointError)("\n".join(lines))
