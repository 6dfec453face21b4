"""Resumable training checkpoints, and the exported model directories ``best/`` and ``final/``.

**Training checkpoints** (``RUN/checkpoints/ckpt-<updates>``) hold everything ``--resume`` needs,
and nothing that is unpickled: every file is safetensors, JSON, or read with
``torch.load(weights_only=True)`` (tensors and plain containers, no globals):

====================== ==========================================================================
``model.safetensors``   the raw weights
``model_ema.safetensors`` the EMA weights (when the EMA is on)
``optimizer.pt``        ``optimizer.state_dict()`` (moments, step counts, param groups)
``train_state.json``    :class:`TrainState` (epoch, batch, samples of the epoch consumed, updates,
                        history), Accelerate's step counter and the fp16 gradient scaler
``rng_state_<rank>.json`` every random generator of process ``rank`` (:func:`capture_rng`)
``checkpoint.json``     written last: the format, the config as run, the number of processes,
                        and the size and SHA-256 of every other file
====================== ==========================================================================

Accelerate's ``save_state`` / ``load_state`` are deliberately not used: they pickle the registered
objects (``custom_checkpoint_*.pkl`` is read with ``weights_only=False``, so a crafted checkpoint
runs code on ``--resume``) and only log, at info level, when the random states cannot be restored.
Accelerate still prepares the model and optimizer and runs the collectives.

**Atomic**: all processes write into ``.tmp-ckpt-<updates>``; when every one is done, the main
process writes ``checkpoint.json`` and renames the folder to its final name (a directory rename is
atomic on POSIX). A kill at any moment leaves the complete new checkpoint or a ``.tmp-*`` folder
that is ignored and removed by the next save.

**Verified**: loading checks every file against the size and SHA-256 recorded when it was
written, so a truncated, emptied or modified file is one clear error naming it and the last good
checkpoint of the run, before anything is restored. A missing or damaged random state is an error
too; ``checkpoint.allow_inexact_resume=true`` turns it into a loud warning, and the summary then
records ``resume_exact: false``.

**One process without Accelerate** (the register study): :func:`save_single` and :func:`load_single`
write and verify the same files and manifest, without random states.

**Checked at load**: every field of ``train_state.json`` is range-checked (types, non-negative,
consistent with each other, with the manifest and with the config), so a crafted or hand-edited
state is one error naming the field and the file, before any training.

**Verified good**: a checkpoint is written only from finite weights, and counts as *good* once
those weights have also given a finite loss: the validation loss at an epoch end, or, for a
mid-epoch checkpoint (and any not yet validated), the training loss of the next optimizer step. A
``verified.json`` (not part of the manifest) then records how. A checkpoint whose weights then
diverge is moved aside to ``ckpt-N.diverged`` (kept for inspection, never resumed by
``--resume RUN``).

**Retention** keeps the newest ``keep_last`` checkpoints *and the newest good one* (so a checkpoint
not yet verified never costs the last good one), and only ever deletes checkpoints older than one
the current session has written itself: resuming never deletes anything before the resumed run has
saved a newer checkpoint of its own.

**Elastic**: a checkpoint written by ``N`` processes resumes on ``M``. Weights, optimizer, EMA,
counters and the lr-schedule position are global and carry over exactly; the epoch position is
kept in samples consumed by all processes together, and the sampler splits the remaining
samples of the epoch over the new ranks (the epoch's global order depends on seed and epoch only);
per-sample augmentations follow. The per-process random generators (drop path, Mixup / CutMix)
cannot be mapped from ``N`` to ``M`` processes and are re-derived from (seed, epoch, update,
rank); the resume summary lists what was exact and what was not.

**Model directories** (``final/``, ``best/``): our safetensors format via :func:`vit5.save_pretrained`,
raw and EMA weights, built in a staging folder and swapped into place in one step
(:func:`vit5.files.replace_dir`): a kill leaves the old complete directory or the new one.

**Random states** as plain JSON (no pickle): :func:`capture_rng` reads Python's ``random``, NumPy's
global generator, torch's CPU generator and every CUDA device's generator; :func:`restore_rng` puts
them back after checking the shape of every field, so a damaged or crafted file is refused
(``ValueError``) instead of silently leaving a generator unrestored. Together with the model,
optimizer and loop position (:class:`TrainState`) this makes a resumed run draw exactly the
augmentations, drop-path masks and Mixup pairs of an uninterrupted one.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import math
import os
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
from accelerate.utils import DistributedType, gather_object, set_seed
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from timm.utils import ModelEmaV3
from torch import nn

import vit5
from vit5 import ViT5
from vit5.errors import StorageError, Vit5Error, storage_error, user_message
from vit5.files import atomic_write_bytes, atomic_write_json, replace_dir, staging_dir
from vit5.train.errors import ResumeError
from vit5.weights.checkpoint import safe_torch_load, safetensors_bytes

FORMAT = "vit5-train-checkpoint/1"
MANIFEST = "checkpoint.json"
MODEL_FILE = "model.safetensors"
EMA_FILE = "model_ema.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "train_state.json"
VERIFIED_FILE = "verified.json"
DIVERGED_SUFFIX = ".diverged"
_NAME = re.compile(r"^ckpt-(\d+)$")
_TMP_PREFIX = ".tmp-"
_LEGACY_FILES = ("custom_checkpoint_0.pkl", "random_states_0.pkl", "optimizer.bin")


def checkpoint_name(num_updates: int) -> str:
    return f"ckpt-{num_updates:09d}"


def checkpoint_number(path: Path) -> int:
    """The update count in a ``ckpt-<updates>`` name (-1 for any other name)."""
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else -1


def rng_file(rank: int) -> str:
    return f"rng_state_{rank}.json"


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoint folders under ``directory``, oldest first (by update count).

    Raises:
        StorageError: ``directory`` exists but cannot be listed.
    """
    if not directory.is_dir():
        return []
    try:
        found = [p for p in directory.iterdir() if p.is_dir() and _NAME.match(p.name)]
    except OSError as err:
        raise storage_error(err, directory, "list") from err
    return sorted(found, key=checkpoint_number)


@dataclass
class Resumable:
    """What a checkpoint saves and restores (``model`` is the unwrapped module the optimizer updates)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    ema: ModelEmaV3 | None
    state: TrainState


class _Damaged(ResumeError):
    """A checkpoint file is missing, damaged or refused; the message gains the last good checkpoint."""

    def __init__(self, message: str, consequence: str = "", alternative: str = "") -> None:
        super().__init__(message)
        self.consequence, self.alternative = consequence, alternative


@dataclass(frozen=True)
class Restored:
    """How a load went: ``exact`` is False when random states were missing and allowed to be, or
    re-derived for another number of processes (``elastic``); ``warning`` says what was not exact."""

    path: Path
    exact: bool
    warning: str = ""
    written_by: int = 1  # processes that wrote the checkpoint
    elastic: bool = False


@dataclass(frozen=True)
class EpochLayout:
    """What the position in an epoch is checked against: the per-process micro-batch, the micro-batches
    per optimizer step, this run's micro-batches per epoch and process, and the samples of an epoch
    before per-world-size rounding (data set size x repeated augmentation)."""

    batch_size: int
    accum_steps: int
    batches_per_epoch: int
    epoch_samples: int


class CheckpointManager:
    """Saves, prunes, verifies and loads the training checkpoints of one run. All methods are collective.

    Args:
        parts: what is saved and restored.
        config: the config as run (``dataclasses.asdict``), recorded in every checkpoint so that
            ``--resume`` compares against what the checkpoint was written with.
    """

    def __init__(
        self,
        accelerator: Accelerator,
        directory: Path,
        keep_last: int,
        parts: Resumable,
        config: dict[str, Any],
        layout: EpochLayout,
    ) -> None:
        self.accelerator = accelerator
        self.directory = directory
        self.keep_last = keep_last
        self.parts = parts
        self.config = config
        self.layout = layout
        self.newest_saved = -1  # the update count of the newest checkpoint this session wrote

    # ---------------------------------------------------------------------------------- saving
    def save(self, num_updates: int) -> Path:
        """Write the full training state for ``num_updates`` atomically; prune old ones.

        Raises:
            StorageError: on every process when any process cannot write (disk full, read-only,
                ...); the previous checkpoints are untouched and the partial folder is removed.
        """
        acc, parts = self.accelerator, self.parts
        final = self.directory / checkpoint_name(num_updates)
        tmp = self.directory / f"{_TMP_PREFIX}{final.name}"
        _raise_agreed(
            acc, _attempt(lambda: staging_dir(final)) if acc.is_main_process else None
        )  # creates tmp
        files: dict[str, bytes] = {}
        if acc.is_main_process:
            files[MODEL_FILE] = safetensors_bytes(parts.model.state_dict())
            if parts.ema is not None:
                files[EMA_FILE] = safetensors_bytes(parts.ema.module.state_dict())
            buffer = io.BytesIO()
            torch.save(parts.optimizer.state_dict(), buffer)
            files[OPTIMIZER_FILE] = buffer.getvalue()
            files[STATE_FILE] = _json_bytes(_train_state(acc, parts.state))
        files[rng_file(acc.process_index)] = _json_bytes(capture_rng())
        error = _attempt(
            lambda: [atomic_write_bytes(tmp / name, data, durable=False) for name, data in files.items()]
        )
        # every process's files are written before the main process lists them in the manifest
        written = gather_object([error]) if acc.num_processes > 1 else [error]
        first = next((e for e in written if e), None)
        if acc.is_main_process:
            if first is None:
                first = _attempt(lambda: self._publish(tmp, final, num_updates, parts.state, files))
            if first is None:
                self.newest_saved = num_updates
            else:
                shutil.rmtree(tmp, ignore_errors=True)  # a partial checkpoint is never left behind
        _raise_agreed(
            acc,
            f"{first} (checkpoint {final.name} was not saved; the ones saved before are intact)"
            if first
            else None,
        )
        return final

    def _publish(
        self, tmp: Path, final: Path, num_updates: int, state: TrainState, files: dict[str, bytes]
    ) -> None:
        listed = {name: _digest(data) for name, data in files.items()}
        for rank in range(1, self.accelerator.num_processes):  # written by the other processes
            listed[rng_file(rank)] = _digest((tmp / rng_file(rank)).read_bytes())
        manifest = {
            "format": FORMAT,
            "num_updates": num_updates,
            "epoch": state.epoch,
            "batch": state.batch,
            "epoch_samples": state.epoch_samples,
            "num_processes": self.accelerator.num_processes,
            "ema": EMA_FILE in files,
            "config": self.config,
            "files": listed,
        }
        for name in listed:  # flushed to disk before the manifest that vouches for them
            _fsync(tmp / name)
        atomic_write_json(tmp / MANIFEST, manifest)
        if final.exists():  # the same update count saved again: swap, never a moment without one
            replace_dir(tmp, final)
        else:
            try:
                tmp.rename(final)
            except OSError as err:
                raise storage_error(err, final) from err
        self._prune(num_updates)

    def _prune(self, newest: int) -> None:
        """Keep ``keep_last`` checkpoints up to ``newest`` (written by this session) and the newest good
        one; never touch a newer one (there is none in a run continued in place, and a fork starts a
        new directory)."""
        for stale in self.directory.glob(f"{_TMP_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
        mine_or_older = [c for c in list_checkpoints(self.directory) if checkpoint_number(c) <= newest]
        good = next((c for c in reversed(mine_or_older) if is_verified(c)), None)
        for old in mine_or_older[: -self.keep_last]:
            if old != good:
                shutil.rmtree(old, ignore_errors=True)

    def confirm(self, path: Path, how: str) -> None:
        """Record that ``path``'s weights gave a finite loss (``how``), then prune what it makes redundant.
        Collective; the main process writes."""
        error = None
        if self.accelerator.is_main_process:

            def mark() -> None:
                atomic_write_json(path / VERIFIED_FILE, {"verified_by": how}, durable=False)
                if self.newest_saved >= 0:
                    self._prune(self.newest_saved)

            error = _attempt(mark)
        _raise_agreed(self.accelerator, error)

    def set_aside(self, path: Path) -> Path:
        """Move a checkpoint whose weights diverged out of ``--resume``'s way (``ckpt-N.diverged``);
        collective, the main process renames. Returns the new path."""
        target = path.with_name(path.name + DIVERGED_SUFFIX)
        error = None
        if self.accelerator.is_main_process:

            def move() -> None:
                shutil.rmtree(target, ignore_errors=True)
                path.rename(target)

            error = _attempt(move)
        _raise_agreed(self.accelerator, error)
        return target

    # ---------------------------------------------------------------------------------- loading
    def load(self, path: Path, allow_inexact: bool = False) -> Restored:
        """Verify every file of ``path``, then restore weights, EMA, optimizer, progress and random states.

        Raises:
            ResumeError: a file is missing, damaged or refused (named, with the last good checkpoint
                of the run), or the checkpoint was written for another model, optimizer, EMA
                setting or number of processes.
        """
        restored, error = None, None
        try:
            restored = self._restore(path, self.parts, allow_inexact)
        except _Damaged as err:
            error = f"{err}{err.consequence}. {last_good_hint(path)}{err.alternative}"
        except (Vit5Error, OSError) as err:
            error = user_message(err)
        _raise_agreed(self.accelerator, error, ResumeError)
        assert restored is not None
        return restored

    def _restore(self, path: Path, parts: Resumable, allow_inexact: bool) -> Restored:
        acc = self.accelerator
        manifest = read_manifest(path)
        _check_compatible(path, manifest, parts.ema is not None)
        data = {name: _verified(path, name, manifest) for name in _shared_files(manifest)}
        # the state first: a crafted position is refused before anything is loaded
        _load_train_state(path, data[STATE_FILE], parts.state, acc, manifest, self.layout)
        _load_weights(path, MODEL_FILE, data[MODEL_FILE], parts.model)
        if parts.ema is not None:
            _load_weights(path, EMA_FILE, data[EMA_FILE], parts.ema.module)
        _load_optimizer(path, data[OPTIMIZER_FILE], parts.optimizer)
        written_by = manifest["num_processes"]
        if written_by != acc.num_processes:
            return self._elastic(path, written_by)
        name = rng_file(acc.process_index)
        try:
            restore_rng(json.loads(_verified(path, name, manifest)))
        except (_Damaged, ValueError) as err:
            reason = str(err) if isinstance(err, _Damaged) else f"{path / name} is damaged ({err})"
            if not allow_inexact:
                raise _Damaged(
                    reason,
                    consequence=": without this process's random state the resumed run would not continue "
                    "exactly (other augmentations, drop-path masks and Mixup pairs)",
                    alternative="; or accept an inexact resume with checkpoint.allow_inexact_resume=true",
                ) from err
            return Restored(
                path,
                exact=False,
                warning=f"WARNING: {reason}; continuing WITHOUT restoring the random generators "
                "(checkpoint.allow_inexact_resume=true): this is not an exact continuation, and the summary "
                "records resume_exact=false",
                written_by=written_by,
            )
        return Restored(path, exact=True, written_by=written_by)

    def _elastic(self, path: Path, written_by: int) -> Restored:
        """Continue a checkpoint of ``written_by`` processes on this run's number: the position in
        samples carries over, the per-process random generators are re-derived."""
        acc, state, layout = self.accelerator, self.parts.state, self.layout
        world = acc.num_processes
        state.batch = state.epoch_samples // (layout.batch_size * world)
        seed = int(self.config["run"]["seed"])
        set_seed(derived_seed(seed, state.epoch, state.num_updates, acc.process_index))
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
        return Restored(path, exact=False, warning=warning, written_by=written_by, elastic=True)


def last_good_hint(damaged: Path) -> str:
    """``"The last good checkpoint of this run is ...: resume with --resume ..."`` (or what to do)."""
    checkpoints = list_checkpoints(damaged.parent)
    for candidate in reversed(checkpoints):
        if candidate == damaged:
            continue
        try:
            verify_checkpoint(candidate)
        except ResumeError:
            continue
        hint = (
            f"The last good checkpoint of this run is {candidate}: "
            f"resume with `vit5 train --resume {candidate}`"
        )
        if candidate != checkpoints[-1]:
            hint += (
                f" (it continues in a new run directory since newer checkpoints exist; delete {damaged} "
                "first "
                f"to continue in place)"
            )
        return hint
    run_dir = damaged.parent.parent
    return (
        f"This run has no other intact checkpoint: start it again, or fine-tune from its weights "
        f"(model.pretrained={run_dir / 'final'} or {run_dir / 'best'}, if present)"
    )


def is_verified(path: Path) -> bool:
    """Whether ``path``'s weights are known to give a finite loss (see the module docstring)."""
    return (path / VERIFIED_FILE).is_file()


def newest_good(directory: Path) -> Path | None:
    """The newest checkpoint of ``directory`` verified good, or None."""
    return next((c for c in reversed(list_checkpoints(directory)) if is_verified(c)), None)


def derived_seed(seed: int, epoch: int, num_updates: int, rank: int) -> int:
    """A 32-bit seed for process ``rank`` at a position of the run (elastic resume)."""
    return int(np.random.SeedSequence([seed, epoch, num_updates, rank]).generate_state(1)[0])


# ---------------------------------------------------------------------------------- reading checkpoints
def read_manifest(path: Path) -> dict[str, Any]:
    """The ``checkpoint.json`` of ``path``, checked for shape (not yet the files it lists).

    Raises:
        ResumeError: missing (an unfinished save, or the older pickle-based format), unreadable or malformed.
    """
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        if any((path / legacy).exists() for legacy in _LEGACY_FILES):
            raise ResumeError(
                f"{path} was written by an older vit5 in Accelerate's pickle-based format, which --resume no "
                "longer reads: loading it can run code stored in the checkpoint folder. Start a new run "
                "from "
                f"the run's weights instead (model.pretrained={path.parent.parent / 'final'})"
            )
        raise ResumeError(f"{path} is not a complete training checkpoint: it has no {MANIFEST}")
    try:
        manifest = json.loads(manifest_path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _Damaged(f"{manifest_path} is damaged (not readable JSON: {err})") from err
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != FORMAT
        or not isinstance(files, dict)
        or not all(
            isinstance(v, dict) and isinstance(v.get("sha256"), str) and isinstance(v.get("bytes"), int)
            for v in files.values()
        )
        or not isinstance(manifest.get("num_processes"), int)
        or isinstance(manifest.get("num_processes"), bool)
        or manifest["num_processes"] < 1
        or not isinstance(manifest.get("config"), dict)
    ):
        raise _Damaged(f"{manifest_path} is damaged or not a {FORMAT} manifest")
    unsafe = [name for name in files if Path(name).name != name or name.startswith(".")]
    if unsafe:
        raise _Damaged(f"{manifest_path} lists files outside the checkpoint folder ({unsafe[0]!r}); refused")
    return manifest


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """Check every file of ``path`` against its recorded size and SHA-256; return the manifest.

    Raises:
        ResumeError: naming the first missing or damaged file.
    """
    manifest = read_manifest(path)
    for name in manifest["files"]:
        _verified(path, name, manifest)
    return manifest


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
    if len(data) != expected["bytes"] or hashlib.sha256(data).hexdigest() != expected["sha256"]:
        raise _Damaged(
            f"{path / name} is damaged: {len(data)} bytes that do not match the {expected['bytes']} bytes "
            "and "
            f"SHA-256 recorded when it was written (truncated, emptied or modified)"
        )
    return data


def _shared_files(manifest: dict[str, Any]) -> list[str]:
    return [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE] + ([EMA_FILE] if manifest.get("ema") else [])


def _check_compatible(path: Path, manifest: dict[str, Any], ema: bool) -> None:
    if bool(manifest.get("ema")) != ema:
        raise ResumeError(
            f"{path} was written with ema.enabled={bool(manifest.get('ema'))}; resume with the same setting"
        )


def _load_weights(path: Path, name: str, data: bytes, module: nn.Module) -> None:
    try:
        state = load_safetensors(data)
        module.load_state_dict(state, strict=True)
    except (SafetensorError, RuntimeError, ValueError) as err:
        raise ResumeError(
            f"{path / name} does not fit this run's model ({str(err).splitlines()[0]}): a checkpoint "
            "resumes only "
            f"with the model it was written with"
        ) from err


def _load_optimizer(path: Path, data: bytes, optimizer: torch.optim.Optimizer) -> None:
    try:
        state = safe_torch_load(data, name=str(path / OPTIMIZER_FILE))
        optimizer.load_state_dict(state)
    except vit5.CheckpointError as err:  # a refused pickle or an unreadable file
        raise _Damaged(str(err)) from err
    except (RuntimeError, ValueError, KeyError, TypeError) as err:
        raise ResumeError(
            f"{path / OPTIMIZER_FILE} does not fit this run's optimizer ({err}): a checkpoint resumes only "
            "with "
            f"the optimizer and model it was written with"
        ) from err


def _train_state(acc: Accelerator, state: TrainState) -> dict[str, Any]:
    scaler = getattr(acc, "scaler", None)
    return {
        "train_state": state.state_dict(),
        "accelerator_step": acc.step,
        "grad_scaler": scaler.state_dict() if scaler is not None else None,
    }


def _load_train_state(
    path: Path,
    data: bytes,
    state: TrainState,
    acc: Accelerator,
    manifest: dict[str, Any],
    layout: EpochLayout,
) -> None:
    try:
        record = json.loads(data)
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
        loaded = TrainState()
        loaded.load_state_dict(record["train_state"])
        if "epoch_samples" not in record["train_state"]:  # written before the field existed
            loaded.epoch_samples = loaded.batch * layout.batch_size * manifest["num_processes"]
        _check_position(
            loaded, path, manifest, layout, elastic=manifest["num_processes"] != acc.num_processes
        )
        step = record["accelerator_step"]
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"accelerator_step={step!r} must be a non-negative integer")
        scaler_state, scaler = record["grad_scaler"], getattr(acc, "scaler", None)
        if (scaler_state is None) != (scaler is None):
            raise ValueError("the fp16 gradient scaler state does not match run.mixed_precision")
        if scaler is not None:
            scaler.load_state_dict(scaler_state)
    except KeyError as err:
        raise _Damaged(f"{path / STATE_FILE} is damaged or from another vit5 (no field {err})") from err
    except (ValueError, TypeError, UnicodeDecodeError) as err:
        raise _Damaged(f"{path / STATE_FILE} is damaged or from another vit5 ({err})") from err
    for name in dataclasses.fields(state):
        setattr(state, name.name, getattr(loaded, name.name))
    acc.step = step


def _check_position(
    state: TrainState, path: Path, manifest: dict[str, Any], layout: EpochLayout, elastic: bool
) -> None:
    """Every field of a loaded :class:`TrainState` in range and consistent (``ValueError`` naming it)."""

    def need(ok: bool, field_name: str, rule: str) -> None:
        if not ok:
            raise ValueError(f"train_state.{field_name}={getattr(state, field_name)!r}: {rule}")

    for name in ("epoch", "batch", "num_updates", "images_seen", "epoch_samples"):
        need(getattr(state, name) >= 0, name, "must be >= 0")
    for name in ("train_seconds", "wall_seconds"):
        value = getattr(state, name)
        need(math.isfinite(value) and value >= 0, name, "must be a finite number >= 0")
    need(
        state.epoch == manifest.get("epoch"),
        "epoch",
        f"does not match {MANIFEST} (epoch {manifest.get('epoch')})",
    )
    need(
        state.num_updates == manifest.get("num_updates")
        and (checkpoint_number(path) in (-1, state.num_updates)),
        "num_updates",
        f"does not match {MANIFEST} ({manifest.get('num_updates')}) and the folder name {path.name}",
    )
    need(
        state.batch == manifest.get("batch"),
        "batch",
        f"does not match {MANIFEST} (batch {manifest.get('batch')})",
    )
    need(
        state.batch % layout.accum_steps == 0,
        "batch",
        f"must be a multiple of optim.accum_steps={layout.accum_steps} (checkpoints fall on optimizer steps)",
    )
    written_by = manifest["num_processes"]
    step_samples = layout.batch_size * layout.accum_steps
    need(
        state.epoch_samples % step_samples == 0 and state.epoch_samples <= layout.epoch_samples + written_by,
        "epoch_samples",
        f"must be a multiple of data.batch_size x optim.accum_steps = {step_samples} and at most the "
        f"{layout.epoch_samples} samples of an epoch",
    )
    if not elastic:
        need(
            state.batch <= layout.batches_per_epoch,
            "batch",
            f"must be at most the {layout.batches_per_epoch} micro-batches of an epoch of this run",
        )
        need(
            state.epoch_samples == state.batch * layout.batch_size * written_by,
            "epoch_samples",
            f"must be batch x data.batch_size x {written_by} process(es) = "
            f"{state.batch * layout.batch_size * written_by}",
        )
    need(
        state.num_updates >= state.epoch,
        "num_updates",
        f"must be at least one per finished epoch ({state.epoch})",
    )
    need(
        len(state.history) == state.epoch, "history", f"must have one row per finished epoch ({state.epoch})"
    )
    for i, row in enumerate(state.history):
        _check_row(row, i)
    if state.best_epoch == -1:
        need(state.best_top1 == -1.0, "best_top1", "must be -1 while best_epoch is -1")
    else:
        need(1 <= state.best_epoch <= state.epoch, "best_epoch", f"must be -1 or in [1, {state.epoch}]")
        row = state.history[state.best_epoch - 1]
        need(
            row.get("val_top1") == state.best_top1,
            "best_top1",
            f"must equal val_top1 of history row {state.best_epoch} ({row.get('val_top1')!r})",
        )


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
    if not isinstance(row["updates"], int) or row["updates"] < 0:
        raise ValueError(f"{where}.updates={row['updates']!r} must be a non-negative integer")


HISTORY_FIELDS = (
    "epoch",
    "updates",
    "lr",
    "train_loss",
    "train_images_per_s",
    "epoch_seconds",
    "val_loss",
    "val_top1",
    "val_top5",
    "val_images",
    "ema_val_loss",
    "ema_top1",
    "ema_top5",
    "bad_files",
)
_REQUIRED_ROW_FIELDS = (
    "epoch",
    "updates",
    "lr",
    "train_loss",
    "train_images_per_s",
    "epoch_seconds",
    "bad_files",
)


# ---------------------------------------------------------------------------------- helpers
def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, allow_nan=True) + "\n").encode("ascii")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _digest(data: bytes) -> dict[str, Any]:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _attempt(action: Callable[[], Any]) -> str | None:
    """Run ``action``; return the message of a user error instead of raising it (see
    :func:`_raise_agreed`)."""
    try:
        action()
    except (Vit5Error, OSError) as err:
        return user_message(err)
    return None


def _raise_agreed(acc: Accelerator, error: str | None, kind: type[Exception] = StorageError) -> None:
    """Raise ``kind(message)`` on every process when any process failed, so that none waits at a
    barrier for a peer that gave up; otherwise a barrier."""
    errors = gather_object([error]) if acc.num_processes > 1 else [error]
    first = next((e for e in errors if e), None)
    if first is not None:
        raise kind(first)
    acc.wait_for_everyone()


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
    """The config a checkpoint was written with (as recorded in its manifest).

    Raises:
        ResumeError: no readable manifest (naming the last good checkpoint when it is damaged).
    """
    try:
        return read_manifest(checkpoint)["config"]
    except _Damaged as err:
        raise ResumeError(f"{err}. {last_good_hint(checkpoint)}") from err


# ---------------------------------------------------------------------------------- without Accelerate
def save_single(directory: Path, parts: Resumable, config: dict[str, Any]) -> None:
    """The checkpoint of a single-process run trained without Accelerate and without an EMA (the
    register study): the files and manifest of :meth:`CheckpointManager.save` except the random
    states (such a run draws its batches from its step count), built in a staging folder and
    swapped into place in one step."""
    if parts.ema is not None:
        raise ValueError("save_single writes no EMA weights: use CheckpointManager")
    state = parts.state
    buffer = io.BytesIO()
    torch.save(parts.optimizer.state_dict(), buffer)
    files = {
        MODEL_FILE: safetensors_bytes(parts.model.state_dict()),
        OPTIMIZER_FILE: buffer.getvalue(),
        STATE_FILE: _json_bytes(
            {"train_state": state.state_dict(), "accelerator_step": 0, "grad_scaler": None}
        ),
    }
    staged = staging_dir(directory)
    for name, data in files.items():
        atomic_write_bytes(staged / name, data)
    manifest = {
        "format": FORMAT,
        "num_updates": state.num_updates,
        "epoch": state.epoch,
        "batch": state.batch,
        "num_processes": 1,
        "ema": False,
        "config": config,
        "files": {name: _digest(data) for name, data in files.items()},
    }
    atomic_write_json(staged / MANIFEST, manifest)
    replace_dir(staged, directory)


def load_single(directory: Path, parts: Resumable) -> None:
    """Verify every file of a :func:`save_single` checkpoint, then restore weights, optimizer and
    progress; nothing is unpickled.

    Raises:
        ResumeError: a file is missing, damaged or refused (a pickle with code in ``optimizer.pt``),
            or it does not fit the model and optimizer of ``parts``.
    """
    manifest = read_manifest(directory)
    _check_compatible(directory, manifest, ema=False)
    data = {name: _verified(directory, name, manifest) for name in _shared_files(manifest)}
    _load_weights(directory, MODEL_FILE, data[MODEL_FILE], parts.model)
    _load_optimizer(directory, data[OPTIMIZER_FILE], parts.optimizer)
    try:
        parts.state.load_state_dict(json.loads(data[STATE_FILE])["train_state"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise _Damaged(f"{directory / STATE_FILE} is damaged ({err})") from err


# ---------------------------------------------------------------------------------- model directories
def save_model_dir(
    accelerator: Accelerator,
    model: nn.Module,
    ema: ModelEmaV3 | None,
    directory: Path,
    extra: dict[str, Any],
) -> None:
    """Export raw (and EMA) weights as our safetensors directory, swapped into place in one step;
    collective, the main process writes."""
    state = accelerator.get_state_dict(model)  # gathers sharded (FSDP / ZeRO-3) weights on the main process
    error = None
    if accelerator.is_main_process:
        unwrapped: ViT5 = accelerator.unwrap_model(model, keep_torch_compile=False)
        if accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
            unwrapped = ViT5(unwrapped.cfg)
            unwrapped.load_state_dict({k: v.float().cpu() for k, v in state.items()})
        ema_state = ema.module.state_dict() if ema is not None else None

        def write() -> None:
            staged = staging_dir(directory)
            try:
                vit5.save_pretrained(unwrapped, staged, ema_state_dict=ema_state, extra=extra)
                replace_dir(staged, directory)
            finally:  # a failed write leaves no staging folder (replace_dir consumed it on success)
                shutil.rmtree(staged, ignore_errors=True)

        error = _attempt(write)
    _raise_agreed(accelerator, error)


@dataclass
class TrainState:
    """Where the run is: ``epoch`` (0-based, in progress), ``batch`` (micro-batches of it already
    trained by each process, always a multiple of the accumulation steps), ``epoch_samples`` (samples
    of the epoch's global order already trained by all processes together: the position a data
    source resumes from, :func:`vit5.train.data.start_epoch`), ``num_updates`` (optimizer steps so
    far), the best raw val top-1 and its epoch, time and images spent, and the per-epoch metric rows."""

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

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: Any) -> None:
        """Restore from :meth:`state_dict` output (e.g. read back from JSON).

        Raises:
            ValueError: not a mapping of exactly these fields with values of their types.
        """
        fields = {f.name: f for f in dataclasses.fields(self)}
        optional = {"epoch_samples"}  # absent from checkpoints written before it existed
        if not isinstance(state, dict) or not set(fields) - optional <= set(state) <= set(fields):
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"expected the fields {sorted(fields)}, got {got}")
        for name, value in state.items():
            kind = {"int": int, "float": (int, float), "list[dict[str, Any]]": list}[str(fields[name].type)]
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"{name}={value!r} is not of type {fields[name].type}")
            if name == "history" and not all(isinstance(row, dict) for row in value):
                raise ValueError("history must be a list of metric rows")
        for name, value in state.items():
            setattr(self, name, value)


RNG_FORMAT = "vit5-rng/1"


def capture_rng() -> dict[str, Any]:
    """The current state of every generator, JSON-serialisable."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "format": RNG_FORMAT,
        "python": {"version": version, "state": list(internal), "gauss_next": gauss},
        "numpy": {
            "kind": kind,
            "keys": keys.tolist(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": _encode(torch.get_rng_state()),
        "cuda": [_encode(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }
    return state


def restore_rng(state: Any) -> None:
    """Set every generator from :func:`capture_rng`'s output.

    Raises:
        ValueError: a field is missing, of the wrong type or size (nothing is half-restored: every
            field is checked before any generator is set).
    """
    _require(isinstance(state, dict) and state.get("format") == RNG_FORMAT, f"not a {RNG_FORMAT} record")
    py, npy = state.get("python"), state.get("numpy")
    _require(isinstance(py, dict) and isinstance(npy, dict), "the python or numpy generator state is missing")
    internal, keys = py.get("state"), npy.get("keys")
    _require(
        isinstance(internal, list) and len(internal) == 625 and all(map(_is_uint32, internal)),
        "the python generator state is not 625 32-bit integers",
    )
    _require(
        isinstance(py.get("version"), int) and isinstance(py.get("gauss_next"), (float, type(None))),
        "the python generator version or gauss_next has the wrong type",
    )
    _require(
        isinstance(keys, list) and len(keys) == 624 and all(map(_is_uint32, keys)),
        "the numpy generator keys are not 624 32-bit integers",
    )
    _require(
        npy.get("kind") == "MT19937" and isinstance(npy.get("pos"), int) and 0 <= npy["pos"] <= 624,
        "the numpy generator kind or position is invalid",
    )
    _require(
        isinstance(npy.get("has_gauss"), int) and isinstance(npy.get("cached_gaussian"), (int, float)),
        "the numpy generator gaussian cache has the wrong type",
    )
    cpu = _decode(state.get("torch"), torch.get_rng_state().numel(), "torch")
    cuda_states = state.get("cuda")
    _require(isinstance(cuda_states, list), "the CUDA generator states are missing")
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    _require(
        not cuda_states or len(cuda_states) == devices,
        f"{len(cuda_states)} CUDA generator states for {devices} visible CUDA devices",
    )
    cuda = [_decode(s, None, "cuda") for s in cuda_states]

    random.setstate((py["version"], tuple(internal), py["gauss_next"]))
    np.random.set_state(
        (
            npy["kind"],
            np.asarray(keys, dtype=np.uint32),
            npy["pos"],
            npy["has_gauss"],
            float(npy["cached_gaussian"]),
        )
    )
    torch.set_rng_state(cpu)
    if cuda:
        torch.cuda.set_rng_state_all(cuda)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _is_uint32(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32


def _encode(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode("ascii")


def _decode(text: Any, size: int | None, what: str) -> torch.Tensor:
    _require(isinstance(text, str), f"the {what} generator state is missing")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ValueError(f"the {what} generator state is not base64") from None
    if size is not None and len(raw) != size:
        raise ValueError(f"the {what} generator state has {len(raw)} bytes, not {size}")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()
