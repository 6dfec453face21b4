"""Resumable training checkpoints (``RUN/checkpoints/ckpt-<updates>``) and the model folders ``best/`` and
``final/``, pickle-free (safetensors, JSON, ``torch.load(weights_only=True)``; Accelerate's ``save_state``
pickles). A checkpoint is staged in ``.tmp-ckpt-N`` and renamed into place once ``checkpoint.json`` (each
file's size and SHA-256) is written; loading verifies every file first. See docs/training.md."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import math
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object, set_seed
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from timm.utils import ModelEmaV3
from torch import nn

import vit5
from vit5.errors import StorageError, Vit5Error, storage_error, user_message
from vit5.files import atomic_write_bytes, fsync_file, replace_dir, staging_dir
from vit5.outputs import write_json
from vit5.train.errors import ResumeError
from vit5.weights.checkpoint import safe_torch_load, safetensors_bytes

FORMAT = "vit5-train-checkpoint/1"
MANIFEST = "checkpoint.json"
MODEL_FILE = "model.safetensors"
EMA_FILE = "model_ema.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "train_state.json"
VERIFIED_FILE = "verified.json"
_NAME = re.compile(r"^ckpt-(\d+)$")
# the columns of a metrics row (metrics.csv); the first six and bad_files are always set
HISTORY_FIELDS = tuple(
    "epoch updates lr train_loss train_images_per_s epoch_seconds val_loss val_top1 val_top5 val_images "
    "ema_val_loss ema_top1 ema_top5 bad_files".split()
)
_REQUIRED_ROW_FIELDS = (*HISTORY_FIELDS[:6], "bad_files")


def checkpoint_number(path: Path) -> int:
    """The update count in a ``ckpt-<updates>`` name (-1 for any other name)."""
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else -1


def rng_file(rank: int) -> str:
    return f"rng_state_{rank}.json"


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoint folders under ``directory``, oldest first; ``StorageError`` when it cannot be listed."""
    if not directory.is_dir():
        return []
    try:
        found = [p for p in directory.iterdir() if p.is_dir() and _NAME.match(p.name)]
    except OSError as err:
        raise storage_error(err, directory, "list") from err
    return sorted(found, key=checkpoint_number)


@dataclass
class TrainState:
    """Where the run is: ``epoch`` (0-based, in progress), ``batch`` (micro-batches of it trained by each
    process), ``epoch_samples`` (samples of the epoch's global order trained by all processes: where
    the data resumes), ``num_updates``, the best raw val top-1 and its epoch, time, images, metric rows."""

    epoch: int = 0
    batch: int = 0
    epoch_samples: int = 0
    num_updates: int = 0
    best_top1: float = -1.0
    best_epoch: int = -1
    train_seconds: float = 0.0
    wall_seconds: float = 0.0
    images_seen: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Resumable:
    """What a checkpoint saves and restores (``model`` is the unwrapped module the optimizer updates)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    ema: ModelEmaV3 | None
    state: TrainState


class _Damaged(ResumeError):
    """A checkpoint file is missing, damaged or refused; the message gains the last good checkpoint."""


@dataclass(frozen=True)
class Restored:
    """How a load went: not ``exact`` when random states were missing and allowed to be, or re-derived
    for another number of processes (``elastic_from``: the processes that wrote it); ``warning`` says how."""

    exact: bool
    warning: str = ""
    elastic_from: int | None = None


@dataclass(frozen=True)
class EpochLayout:
    """What an epoch position is checked against: the per-process micro-batch, micro-batches per step,
    this run's micro-batches per epoch and process, and the samples of an epoch (x repeated aug)."""

    batch_size: int
    accum_steps: int
    batches_per_epoch: int
    epoch_samples: int


@dataclass
class CheckpointManager:
    """Saves, prunes, verifies and loads the training checkpoints of one run; every method is collective.
    ``config`` (the config as run) is recorded in every checkpoint for ``--resume`` to compare."""

    accelerator: Accelerator
    directory: Path
    keep_last: int
    parts: Resumable
    config: dict[str, Any]
    layout: EpochLayout
    newest_saved: int = -1  # the update count of the newest checkpoint this session wrote

    def save(self, num_updates: int) -> Path:
        """Write the full training state atomically and prune old ones; ``StorageError`` on every process
        when any cannot write (earlier checkpoints intact, the partial folder removed)."""
        acc, parts = self.accelerator, self.parts
        final = self.directory / f"ckpt-{num_updates:09d}"
        tmp = final.with_name(f".tmp-{final.name}")  # what staging_dir makes
        on_main(acc, lambda: staging_dir(final))
        files: dict[str, bytes] = {}
        if acc.is_main_process:
            scaler = getattr(acc, "scaler", None)
            files = _state_files(parts, acc.step, scaler.state_dict() if scaler is not None else None)
        files[rng_file(acc.process_index)] = _json_bytes(capture_rng())
        error = _attempt(
            lambda: [atomic_write_bytes(tmp / name, data, durable=False) for name, data in files.items()]
        )
        first = _first_error(acc, error)  # every process's files are written before the manifest
        if acc.is_main_process:
            first = first or _attempt(lambda: self._publish(tmp, final, files))
            if first is None:
                self.newest_saved = num_updates
            else:
                shutil.rmtree(tmp, ignore_errors=True)
        raise_agreed(
            acc,
            first and f"{first} (checkpoint {final.name} was not saved; the ones saved before are intact)",
        )
        return final

    def _publish(self, tmp: Path, final: Path, files: dict[str, bytes]) -> None:
        listed = {name: _digest(data) for name, data in files.items()}
        for rank in range(1, self.accelerator.num_processes):  # written by the other processes
            listed[rng_file(rank)] = _digest((tmp / rng_file(rank)).read_bytes())
        for name in listed:  # flushed to disk before the manifest that vouches for them
            fsync_file(tmp / name)
        write_json(
            tmp / MANIFEST, _manifest(self.parts.state, self.accelerator.num_processes, self.config, listed)
        )
        replace_dir(tmp, final)  # the same update count saved again: swapped, never a moment without one
        self._prune(self.parts.state.num_updates)

    def _prune(self, newest: int) -> None:
        """Keep ``keep_last`` checkpoints up to ``newest`` (this session's) and the newest good one."""
        for stale in self.directory.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        mine_or_older = [c for c in list_checkpoints(self.directory) if checkpoint_number(c) <= newest]
        good = next((c for c in reversed(mine_or_older) if is_verified(c)), None)
        for old in mine_or_older[: -self.keep_last]:
            if old != good:
                shutil.rmtree(old, ignore_errors=True)

    def confirm(self, path: Path, how: str) -> None:
        """Record that ``path``'s weights gave a finite loss (``how``); prune what that makes redundant."""

        def mark() -> None:
            write_json(path / VERIFIED_FILE, {"verified_by": how}, durable=False)
            if self.newest_saved >= 0:
                self._prune(self.newest_saved)

        on_main(self.accelerator, mark)

    def set_aside(self, path: Path) -> Path:
        """Move a checkpoint whose weights diverged out of ``--resume``'s way (``ckpt-N.diverged``)."""
        target = path.with_name(path.name + ".diverged")

        def move() -> None:
            shutil.rmtree(target, ignore_errors=True)
            path.rename(target)

        on_main(self.accelerator, move)
        return target

    def load(self, path: Path, allow_inexact: bool = False) -> Restored:
        """Verify every file of ``path``, then restore weights, EMA, optimizer, progress and random states.
        ``ResumeError`` names a missing, damaged or refused file and the last good checkpoint, or says
        the checkpoint was written for another model, optimizer or EMA setting."""
        restored, error = Restored(exact=False), None
        try:
            restored = self._restore(path, allow_inexact)
        except (Vit5Error, OSError) as err:
            error = _with_last_good(err, path)
        raise_agreed(self.accelerator, error, ResumeError)
        return restored

    def _restore(self, path: Path, allow_inexact: bool) -> Restored:
        acc, parts = self.accelerator, self.parts
        manifest, data = _read_shared(path, parts.ema is not None)
        written_by = manifest["num_processes"]
        # the state first: a crafted position is refused before anything is loaded
        state, step = _read_state(path, data[STATE_FILE], manifest, self.layout, acc)
        _load_weights(path, MODEL_FILE, data[MODEL_FILE], parts.model)
        if parts.ema is not None:
            _load_weights(path, EMA_FILE, data[EMA_FILE], parts.ema.module)
        _load_optimizer(path, data[OPTIMIZER_FILE], parts.optimizer)
        vars(parts.state).update(vars(state))
        acc.step = step
        if written_by != acc.num_processes:
            return self._elastic(path, written_by)
        name = rng_file(acc.process_index)
        try:
            restore_rng(json.loads(_verified(path, name, manifest)))
        except (_Damaged, ValueError) as err:
            reason = str(err) if isinstance(err, _Damaged) else f"{path / name} is damaged ({err})"
            if not allow_inexact:
                raise _Damaged(
                    f"{reason}: without this process's random state the resumed run would not continue "
                    "exactly (other augmentations, drop-path masks and Mixup pairs); to accept an inexact "
                    "resume, set checkpoint.allow_inexact_resume=true"
                ) from err
            return Restored(
                exact=False,
                warning=f"WARNING: {reason}; continuing WITHOUT restoring the random generators "
                "(checkpoint.allow_inexact_resume=true): this is not an exact continuation, and the summary "
                "records resume_exact=false",
            )
        return Restored(exact=True)

    def _elastic(self, path: Path, written_by: int) -> Restored:
        """A checkpoint of ``written_by`` processes on this run's number: the position in samples carries
        over, each process's generators are re-derived from (seed, epoch, update, rank)."""
        acc, state, layout = self.accelerator, self.parts.state, self.layout
        world = acc.num_processes
        state.batch = state.epoch_samples // (layout.batch_size * world)
        seed = [int(self.config["run"]["seed"]), state.epoch, state.num_updates, acc.process_index]
        set_seed(int(np.random.SeedSequence(seed).generate_state(1)[0]))
        old_batch, new_batch = (layout.batch_size * n * layout.accum_steps for n in (written_by, world))
        warning = (
            f"elastic resume: {path.name} was written by {written_by} process(es), this run has {world}. "
            f"Exact: weights, optimizer, EMA, update count, lr-schedule position and, from sample "
            f"{state.epoch_samples} of epoch {state.epoch + 1} on, the remaining samples of the epoch and "
            f"their augmentations. Not exact: drop-path masks and Mixup/CutMix pairs (each process's random "
            f"generators re-derived from seed, epoch, update and rank), and the global batch "
            f"({old_batch} -> {new_batch}; {layout.batches_per_epoch // layout.accum_steps} optimizer steps "
            f"per epoch from now on, the lr schedule continues from the same fraction of the run)"
        )
        return Restored(exact=False, warning=warning, elastic_from=written_by)


def _with_last_good(err: BaseException, damaged: Path) -> str | None:
    """The message of ``err``; a damaged file's names the last good checkpoint of the run (or what to do)."""
    if not isinstance(err, _Damaged):
        return user_message(err)
    checkpoints = list_checkpoints(damaged.parent)
    good = next((c for c in reversed(checkpoints) if c != damaged and _intact(c)), None)
    if good is None:
        run_dir = damaged.parent.parent
        return (
            f"{err}. This run has no other intact checkpoint: start it again, or fine-tune from its weights "
            f"(model.pretrained={run_dir / 'final'} or {run_dir / 'best'}, if present)"
        )
    newer = (
        f" (it continues in a new run directory since newer checkpoints exist; delete {damaged} first "
        "to continue in place)"
    )
    return (
        f"{err}. The last good checkpoint of this run is {good}: resume with `vit5 train --resume {good}`"
        + (newer if good != checkpoints[-1] else "")
    )


def _intact(path: Path) -> bool:
    """Whether every file of checkpoint ``path`` matches its recorded size and SHA-256."""
    try:
        manifest = read_manifest(path)
        for name in manifest["files"]:
            _verified(path, name, manifest)
    except ResumeError:
        return False
    return True


def is_verified(path: Path) -> bool:
    """Whether ``path``'s weights are known to give a finite loss (``verified.json``)."""
    return (path / VERIFIED_FILE).is_file()


def read_manifest(path: Path) -> dict[str, Any]:
    """The ``checkpoint.json`` of ``path``, checked for shape (not the files it lists); else ResumeError."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise ResumeError(f"{path} is not a complete training checkpoint: it has no {MANIFEST}")
    try:
        manifest = json.loads(manifest_path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _Damaged(f"{manifest_path} is damaged (not readable JSON: {err})") from err
    get = manifest.get if isinstance(manifest, dict) else lambda key: None
    files, processes = get("files"), get("num_processes")
    digests = isinstance(files, dict) and all(
        isinstance(d, dict) and isinstance(d.get("sha256"), str) and _is_count(d.get("bytes"))
        for d in files.values()
    )
    if not (
        get("format") == FORMAT and isinstance(get("config"), dict) and digests and _is_count(processes, 1)
    ):
        raise _Damaged(f"{manifest_path} is damaged or not a {FORMAT} manifest")
    unsafe = [name for name in files if Path(name).name != name or name.startswith(".")]
    if unsafe:
        raise _Damaged(f"{manifest_path} lists files outside the checkpoint folder ({unsafe[0]!r}); refused")
    return manifest


def resolve_resume(path: Path) -> tuple[Path, Path]:
    """``(run_dir, checkpoint)`` from a run directory (latest checkpoint) or a checkpoint directory."""
    if _NAME.match(path.name) and path.is_dir():
        return path.parent.parent, path
    if not path.is_dir():
        raise ResumeError(f"--resume {path}: no such run directory")
    latest = list_checkpoints(path / "checkpoints")
    if not latest:
        raise ResumeError(
            f"--resume {path}: the run has no complete checkpoint yet "
            f"(nothing under {path / 'checkpoints'}); start it again without --resume"
        )
    return path, latest[-1]


def checkpoint_config(checkpoint: Path) -> dict[str, Any]:
    """The config a checkpoint was written with; ResumeError (naming the last good one) without a manifest."""
    try:
        return read_manifest(checkpoint)["config"]
    except _Damaged as err:
        raise ResumeError(_with_last_good(err, checkpoint)) from err


def save_single(directory: Path, parts: Resumable, config: dict[str, Any]) -> None:
    """The checkpoint of a one-process run without Accelerate nor EMA (the register study): the files and
    manifest of :meth:`CheckpointManager.save` without random states, swapped into place in one step."""
    files = _state_files(parts, 0, None)
    staged = staging_dir(directory)
    for name, data in files.items():
        atomic_write_bytes(staged / name, data)
    listed = {name: _digest(data) for name, data in files.items()}
    write_json(staged / MANIFEST, _manifest(parts.state, 1, config, listed))
    replace_dir(staged, directory)


def load_single(directory: Path, parts: Resumable) -> None:
    """Verify every file of a :func:`save_single` checkpoint, then restore weights, optimizer and
    progress; ResumeError when a file is missing, damaged, refused or does not fit ``parts``."""
    _, data = _read_shared(directory, ema=False)
    _load_weights(directory, MODEL_FILE, data[MODEL_FILE], parts.model)
    _load_optimizer(directory, data[OPTIMIZER_FILE], parts.optimizer)
    try:
        vars(parts.state).update(vars(_typed_state(json.loads(data[STATE_FILE])["train_state"])))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise _Damaged(f"{directory / STATE_FILE} is damaged ({err})") from err


def save_model_dir(
    accelerator: Accelerator, model: nn.Module, ema: ModelEmaV3 | None, directory: Path, extra: dict[str, Any]
) -> None:
    """Export raw (and EMA) weights as our safetensors directory, swapped into place in one step;
    collective, the main process writes (the Trainer refuses sharded FSDP / DeepSpeed states)."""

    def write() -> None:
        staged = staging_dir(directory)
        try:
            unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
            ema_state = ema.module.state_dict() if ema is not None else None
            vit5.save_pretrained(unwrapped, staged, ema_state_dict=ema_state, extra=extra)
            replace_dir(staged, directory)
        finally:  # a failed write leaves no staging folder (replace_dir consumed it on success)
            shutil.rmtree(staged, ignore_errors=True)

    on_main(accelerator, write)


# ---------------------------------------------------------------------------------- helpers
def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, allow_nan=True) + "\n").encode("ascii")


def _digest(data: bytes) -> dict[str, Any]:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _is_count(value: Any, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _state_files(parts: Resumable, step: int, scaler: dict[str, Any] | None) -> dict[str, bytes]:
    """The files every process but the main one leaves out: weights, optimizer and ``train_state.json``."""
    buffer = io.BytesIO()
    torch.save(parts.optimizer.state_dict(), buffer)
    files = {MODEL_FILE: safetensors_bytes(parts.model.state_dict())}
    if parts.ema is not None:
        files[EMA_FILE] = safetensors_bytes(parts.ema.module.state_dict())
    record = {"train_state": dataclasses.asdict(parts.state), "accelerator_step": step, "grad_scaler": scaler}
    return files | {OPTIMIZER_FILE: buffer.getvalue(), STATE_FILE: _json_bytes(record)}


def _manifest(state: TrainState, processes: int, config: dict[str, Any], files: dict[str, Any]) -> dict:
    return {
        "format": FORMAT,
        **{k: getattr(state, k) for k in ("num_updates", "epoch", "batch", "epoch_samples")},
        "num_processes": processes,
        "ema": EMA_FILE in files,
        "config": config,
        "files": files,
    }


def _attempt(action: Callable[[], Any]) -> str | None:
    """Run ``action``; return the message of a user error instead of raising it."""
    try:
        action()
    except (Vit5Error, OSError) as err:
        return user_message(err)
    return None


def _first_error(acc: Accelerator, error: str | None) -> str | None:
    """The first error of any process (collective)."""
    errors = gather_object([error]) if acc.num_processes > 1 else [error]
    return next((e for e in errors if e), None)


def on_main(acc: Accelerator, action: Callable[[], Any]) -> None:
    """``action`` on the main process; its user error raised on every process (``StorageError``)."""
    raise_agreed(acc, _attempt(action) if acc.is_main_process else None)


def raise_agreed(acc: Accelerator, error: str | None, kind: type[Exception] = StorageError) -> None:
    """Raise ``kind`` on every process when any failed (no peer waits at a barrier); else a barrier."""
    first = _first_error(acc, error)
    if first is not None:
        raise kind(first)
    acc.wait_for_everyone()


def _verified(path: Path, name: str, manifest: dict[str, Any]) -> bytes:
    """The bytes of ``path/name`` after checking them against the manifest."""
    expected = manifest["files"].get(name)
    if expected is None:
        raise _Damaged(f"{path / name} is not listed in {path / MANIFEST}: the checkpoint is incomplete")
    try:
        data = (path / name).read_bytes()
    except FileNotFoundError:
        raise _Damaged(f"{path / name} is missing") from None
    except OSError as err:
        raise _Damaged(f"{path / name} cannot be read ({err.strerror or err})") from err
    if _digest(data) != {"bytes": expected["bytes"], "sha256": expected["sha256"]}:
        raise _Damaged(
            f"{path / name} is damaged: {len(data)} bytes that do not match the {expected['bytes']} "
            "bytes and SHA-256 recorded when it was written (truncated, emptied or modified)"
        )
    return data


def _read_shared(path: Path, ema: bool) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest and the verified bytes of the files every process reads."""
    manifest = read_manifest(path)
    if bool(manifest.get("ema")) != ema:
        raise ResumeError(
            f"{path} was written with ema.enabled={bool(manifest.get('ema'))}; resume with the same setting"
        )
    names = [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE] + ([EMA_FILE] if ema else [])
    return manifest, {name: _verified(path, name, manifest) for name in names}


def _load_weights(path: Path, name: str, data: bytes, module: nn.Module) -> None:
    try:
        module.load_state_dict(load_safetensors(data), strict=True)
    except (SafetensorError, RuntimeError, ValueError) as err:
        raise ResumeError(
            f"{path / name} does not fit this run's model ({str(err).splitlines()[0]}): a checkpoint "
            "resumes only with the model it was written with"
        ) from err


def _load_optimizer(path: Path, data: bytes, optimizer: torch.optim.Optimizer) -> None:
    try:
        optimizer.load_state_dict(safe_torch_load(data, name=str(path / OPTIMIZER_FILE)))
    except vit5.CheckpointError as err:  # a refused pickle or an unreadable file
        raise _Damaged(str(err)) from err
    except (RuntimeError, ValueError, KeyError, TypeError) as err:
        raise ResumeError(
            f"{path / OPTIMIZER_FILE} does not fit this run's optimizer ({err}): a checkpoint resumes only "
            "with the optimizer and model it was written with"
        ) from err


def _read_state(
    path: Path, data: bytes, manifest: dict[str, Any], layout: EpochLayout, acc: Accelerator
) -> tuple[TrainState, int]:
    """``train_state.json`` typed, in range and consistent, the scaler restored; else ``_Damaged``."""
    try:
        record = json.loads(data)
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
        state = _typed_state(record["train_state"])
        _check_position(state, path, manifest, layout, elastic=manifest["num_processes"] != acc.num_processes)
        step, scaler = record["accelerator_step"], getattr(acc, "scaler", None)
        if not _is_count(step):
            raise ValueError(f"accelerator_step={step!r} must be a non-negative integer")
        if (record["grad_scaler"] is None) != (scaler is None):
            raise ValueError("the fp16 gradient scaler state does not match run.mixed_precision")
        if scaler is not None:
            scaler.load_state_dict(record["grad_scaler"])
        return state, step
    except (KeyError, ValueError, TypeError, UnicodeDecodeError) as err:
        detail = f"no field {err}" if isinstance(err, KeyError) else err
        raise _Damaged(f"{path / STATE_FILE} is damaged or from another vit5 ({detail})") from err


def _typed_state(record: Any) -> TrainState:
    """A :class:`TrainState` from its ``asdict`` form; ``ValueError`` unless exactly its fields and types."""
    kinds = {"int": int, "float": (int, float), "list[dict[str, Any]]": list}
    types = {f.name: str(f.type) for f in dataclasses.fields(TrainState)}
    if not isinstance(record, dict) or set(record) != set(types):
        got = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"expected the fields {sorted(types)}, got {got}")
    for name, value in record.items():
        if not isinstance(value, kinds[types[name]]) or isinstance(value, bool):
            raise ValueError(f"train_state.{name}={value!r} is not of type {types[name]}")
    if not all(isinstance(row, dict) for row in record["history"]):
        raise ValueError("history must be a list of metric rows")
    return TrainState(**record)


_COUNTS = ("epoch", "batch", "num_updates", "images_seen", "epoch_samples")
_TIMES = ("train_seconds", "wall_seconds")


def _check_position(
    state: TrainState, path: Path, manifest: dict[str, Any], layout: EpochLayout, elastic: bool
) -> None:
    """Every field of a loaded :class:`TrainState` in range and consistent (``ValueError`` naming it)."""
    s, written_by, step_samples = state, manifest["num_processes"], layout.batch_size * layout.accum_steps
    per_batch, best = s.batch * layout.batch_size * written_by, s.best_epoch
    best_row = s.history[best - 1] if 1 <= best <= len(s.history) else {}
    folder = checkpoint_number(path)  # -1: a folder not named ckpt-<updates>
    for i, row in enumerate(s.history):
        _check_row(row, i)
    rules = [(getattr(s, n) >= 0, n, "must be >= 0") for n in _COUNTS]
    rules += [
        (math.isfinite(getattr(s, n)) and getattr(s, n) >= 0, n, "must be a finite number >= 0")
        for n in _TIMES
    ]
    rules += [
        (getattr(s, n) == manifest.get(n), n, f"does not match {MANIFEST} ({n} {manifest.get(n)})")
        for n in ("epoch", "num_updates", "batch")
    ]
    rules += [
        (folder in (-1, s.num_updates), "num_updates", f"does not match the folder {path.name}"),
        (
            s.batch % layout.accum_steps == 0,
            "batch",
            f"must be a multiple of optim.accum_steps={layout.accum_steps} (checkpoints fall on optimizer "
            "steps)",
        ),
        (
            s.epoch_samples % step_samples == 0 and s.epoch_samples <= layout.epoch_samples + written_by,
            "epoch_samples",
            f"must be a multiple of data.batch_size x optim.accum_steps = {step_samples} and at most the "
            f"{layout.epoch_samples} samples of an epoch",
        ),
        (
            elastic or s.batch <= layout.batches_per_epoch,
            "batch",
            f"must be at most the {layout.batches_per_epoch} micro-batches of an epoch of this run",
        ),
        (
            elastic or s.epoch_samples == per_batch,
            "epoch_samples",
            f"must be batch x data.batch_size x {written_by} process(es) = {per_batch}",
        ),
        (s.num_updates >= s.epoch, "num_updates", f"must be at least one per finished epoch ({s.epoch})"),
        (len(s.history) == s.epoch, "history", f"must have one row per finished epoch ({s.epoch})"),
        (best != -1 or s.best_top1 == -1.0, "best_top1", "must be -1 while best_epoch is -1"),
        (best == -1 or 1 <= best <= s.epoch, "best_epoch", f"must be -1 or in [1, {s.epoch}]"),
        (
            best == -1 or best_row.get("val_top1") == s.best_top1,
            "best_top1",
            f"must equal val_top1 of history row {best} ({best_row.get('val_top1')!r})",
        ),
    ]
    for ok, name, rule in rules:
        if not ok:
            raise ValueError(f"train_state.{name}={getattr(s, name)!r}: {rule}")


def _check_row(row: dict[str, Any], index: int) -> None:
    where = f"train_state.history[{index}]"
    missing = [k for k in _REQUIRED_ROW_FIELDS if k not in row]
    if missing:
        raise ValueError(f"{where} has no {missing[0]!r}")
    unknown = [k for k in row if k not in HISTORY_FIELDS]
    if unknown:
        raise ValueError(f"{where} has an unknown field {unknown[0]!r}")
    for key, value in row.items():
        ok = value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))
        if not ok or (key in _REQUIRED_ROW_FIELDS and value is None):
            raise ValueError(f"{where}.{key}={value!r} is not a number")
    if row["epoch"] != index + 1:
        raise ValueError(f"{where}.epoch={row['epoch']!r} must be {index + 1}")
    if not _is_count(row["updates"]):
        raise ValueError(f"{where}.updates={row['updates']!r} must be a non-negative integer")


# ---------------------------------------------------------------------------------- random states
RNG_FORMAT = "vit5-rng/1"


def capture_rng() -> dict[str, Any]:
    """Python's, NumPy's, torch's CPU and every CUDA generator, as plain JSON (no pickle)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    numpy_state = {"kind": kind, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss)}
    return {
        "format": RNG_FORMAT,
        "python": {"version": version, "state": list(internal), "gauss_next": gauss},
        "numpy": numpy_state | {"cached_gaussian": float(cached)},
        "torch": _encode(torch.get_rng_state()),
        "cuda": [_encode(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }


def restore_rng(state: Any) -> None:
    """Set every generator from :func:`capture_rng`'s output; ``ValueError`` for a missing, mistyped or
    wrongly sized field (each state is first set on a fresh generator, so nothing is half-restored)."""
    try:
        if state["format"] != RNG_FORMAT:
            raise ValueError(f"not a {RNG_FORMAT} record")
        py, npy = state["python"], state["numpy"]
        py_state = (py["version"], tuple(py["state"]), py["gauss_next"])
        if not isinstance(py["gauss_next"], (float, type(None))):  # random.setstate takes any object
            raise ValueError("the python generator's gauss_next is not a number")
        keys = np.asarray(npy["keys"], dtype=np.int64)
        if keys.shape != (624,) or keys.min() < 0 or keys.max() >= 2**32 or not 0 <= npy["pos"] <= 624:
            raise ValueError("the numpy generator state is not 624 32-bit integers and a position")
        np_state = (npy["kind"], keys.astype(np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
        random.Random().setstate(py_state)
        np.random.RandomState().set_state(np_state)
        cpu = _decode(state["torch"], torch.get_rng_state().numel(), "torch")
        torch.Generator().set_state(cpu)
        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if state["cuda"] and len(state["cuda"]) != devices:
            raise ValueError(f"{len(state['cuda'])} CUDA generator states for {devices} visible CUDA devices")
        cuda = [_decode(s, torch.cuda.get_rng_state(i).numel(), "cuda") for i, s in enumerate(state["cuda"])]
    except KeyError as err:
        raise ValueError(f"no field {err}") from None
    except (TypeError, OverflowError, RuntimeError, AttributeError) as err:
        raise ValueError(f"a generator state has the wrong type or size ({err})") from None
    random.setstate(py_state)
    np.random.set_state(np_state)
    torch.set_rng_state(cpu)
    if cuda:
        torch.cuda.set_rng_state_all(cuda)


def _encode(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode("ascii")


def _decode(text: Any, size: int, what: str) -> torch.Tensor:
    raw = base64.b64decode(text.encode("ascii"), validate=True)  # ValueError: not base64 text
    if len(raw) != size:
        raise ValueError(f"the {what} generator state has {len(raw)} bytes, not {size}")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()
