"""Resumable training checkpoints (``RUN/checkpoints/ckpt-<updates>``) and the model folders
``best/`` and ``final/``, nothing unpickled (Accelerate's ``save_state`` pickles): safetensors
weights; the optimizer state and each process's random generators (``rng_state_<rank>.pt``) read
with ``torch.load(weights_only=True)``; the position as JSON; and the manifest ``checkpoint.json``
(written last: the config as run, every file's size and SHA-256). A load starts at the manifest and
reads only files it vouches for. Each file is one typed schema (:class:`Manifest`,
:class:`StateFile`, :class:`RandomStates`): its field annotations are what
:func:`vit5.schema.parse` checks, so a crafted file is one error naming the file and the field.
Format ``vit5-train-checkpoint/2``; format 1 (random states as JSON, written from 7f2503b on) is
still read. docs/training.md, "The checkpoint format"."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Required, TypedDict

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from timm.utils import ModelEmaV3
from torch import nn

import vit5
from vit5.errors import (
    StorageError,
    Vit5Error,
    os_error_reason,
    storage_error,
    user_message,
)
from vit5.files import atomic_write_bytes, fsync_file, replace_dir, staging_dir
from vit5.outputs import write_json
from vit5.runtime import attempt, on_main, raise_agreed
from vit5.schema import check, parse
from vit5.train.errors import ResumeError
from vit5.weights.checkpoint import (
    TRAINING_MANIFEST,
    WEIGHTS_NAME,
    safe_torch_load,
    safetensors_bytes,
)

FORMAT = "vit5-train-checkpoint/2"
FORMAT_1 = "vit5-train-checkpoint/1"  # random states as JSON (rng_state_<rank>.json), still read
MANIFEST = TRAINING_MANIFEST
MODEL_FILE = "model.safetensors"
EMA_FILE = "model_ema.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "train_state.json"
VERIFIED_FILE = "verified.json"
_NAME = re.compile(r"^ckpt-(\d+)$")
_POSITION = ("epoch", "batch", "epoch_samples", "num_updates")
_FORMAT_FIX = (
    "the formats this vit5 reads: resume the run with the vit5 that wrote it, or start from its "
    "weights (vit5 train ... model.pretrained=RUN/final)"
)


def checkpoint_number(path: Path) -> int:
    """The update count in a ``ckpt-<updates>`` name (-1 for any other name)."""
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else -1


def rng_file(rank: int, fmt: str = FORMAT) -> str:
    """The random states of process ``rank`` in a checkpoint of format ``fmt``."""
    return f"rng_state_{rank}.json" if fmt == FORMAT_1 else f"rng_state_{rank}.pt"


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoint folders under ``directory``, oldest first (``StorageError`` when unlistable)."""
    if not directory.is_dir():
        return []
    try:
        found = [p for p in directory.iterdir() if p.is_dir() and _NAME.match(p.name)]
    except OSError as err:
        raise storage_error(err, directory, "list") from err
    return sorted(found, key=checkpoint_number)


# ------------------------------------------------------------------------------- the schemas
@dataclass(frozen=True)
class FileDigest:
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """``checkpoint.json``, where every load starts: the format, the position, the processes that
    wrote the checkpoint, whether it holds EMA weights, the config as run, every file's size and
    SHA-256."""

    format: Annotated[Literal[FORMAT, FORMAT_1], _FORMAT_FIX]  # first: a refused format stops here
    num_updates: int
    epoch: int
    batch: int
    epoch_samples: int
    num_processes: Annotated[int, 1]
    ema: bool
    config: dict[str, Any]
    files: dict[str, FileDigest]

    def __post_init__(self) -> None:
        # names of the folder's own files: a load never reads outside it
        plain = all(Path(name).name == name and name[:1] not in ("", ".") for name in self.files)
        check(plain, "files", list(self.files), "file names of the folder itself")


class MetricsRow(TypedDict, total=False):
    """One finished epoch of ``metrics.csv`` (the ``Required`` columns are always set)."""

    epoch: Required[int]
    updates: Required[int]
    lr: Required[float]
    train_loss: Required[float]
    train_images_per_s: Required[float]
    epoch_seconds: Required[float]
    val_loss: float | None
    val_top1: float | None
    val_top5: float | None
    val_images: float | None
    ema_val_loss: float | None
    ema_top1: float | None
    ema_top5: float | None
    bad_files: Required[int]


HISTORY_FIELDS = tuple(MetricsRow.__annotations__)  # the columns of a metrics row, in order


@dataclass
class TrainState:
    """Where the run is: ``epoch`` (0-based, in progress), ``batch`` (micro-batches of it trained
    by each process), ``epoch_samples`` (samples of the epoch's global order trained by all
    processes: where the data resumes), ``num_updates``, the best raw val top-1 and its epoch,
    time, images, and one metrics row per finished epoch."""

    epoch: int = 0
    batch: int = 0
    epoch_samples: int = 0
    num_updates: int = 0
    best_top1: float = -1.0
    best_epoch: Annotated[int, -1] = -1
    train_seconds: Annotated[float, 0] = 0.0
    wall_seconds: Annotated[float, 0] = 0.0
    images_seen: int = 0
    history: list[MetricsRow] = field(default_factory=list)

    def __post_init__(self) -> None:
        """One row per finished epoch, in order; the best epoch among them, with its val top-1."""
        rows = len(self.history)
        for index, row in enumerate(self.history):
            where = f"train_state.history[{index}].epoch"
            check(row["epoch"] == index + 1, where, row["epoch"], str(index + 1))
        said = f"the number of history rows ({rows})"
        check(self.epoch == rows, "train_state.epoch", self.epoch, said)
        least = f"at least the epochs ({self.epoch})"
        check(self.num_updates >= self.epoch, "train_state.num_updates", self.num_updates, least)
        best = self.best_epoch
        within = best == -1 or 1 <= best <= rows
        check(within, "train_state.best_epoch", best, f"-1 or in [1, {rows}]")
        top1 = self.history[best - 1].get("val_top1") if best >= 1 else -1.0
        said = f"{top1!r}, val_top1 of history row {best}"
        check(self.best_top1 == top1, "train_state.best_top1", self.best_top1, said)


@dataclass(frozen=True)
class StateFile:
    """``train_state.json``: the :class:`TrainState`, Accelerate's step counter and the fp16
    gradient scaler's state (null without fp16)."""

    train_state: TrainState
    accelerator_step: int
    grad_scaler: dict[str, Any] | None


@dataclass(frozen=True)
class RandomStates:
    """One process's generators (``rng_state_<rank>.pt``, a flat dict of these fields): Python's
    and NumPy's legacy global Mersenne Twisters (``mt19937`` rows 0 and 1: 624 words and the
    position, as ``random.getstate`` and ``np.random.get_state`` give them), torch's CPU generator
    and every CUDA device's. Construction checks every state the generators would refuse (torch's
    on a fresh generator), so a crafted state is refused before a global generator changes."""

    mt19937: Annotated[torch.Tensor, torch.int64, (2, 625)]
    python_version: Literal[3]  # random.getstate's VERSION since Python 3.2
    python_gauss: float | None
    numpy_has_gauss: int
    numpy_gauss: float
    torch: Annotated[torch.Tensor, torch.uint8, (-1,)]
    cuda: list[Annotated[torch.Tensor, torch.uint8, (-1,)]]

    def __post_init__(self) -> None:
        words = self.mt19937
        in_range = bool(words.ge(0).all() and words.lt(2**32).all())
        check(in_range, "mt19937", words, "32-bit words (row 0: Python's, row 1: NumPy's)")
        position = words[:, 624]
        check(
            bool(position.le(624).all()), "mt19937[:, 624]", position.tolist(), "positions <= 624"
        )
        cpu = _takes(torch.Generator().set_state, self.torch)
        check(cpu, "torch", self.torch, "torch's CPU generator state")
        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        sizes = [torch.cuda.get_rng_state(i).numel() for i in range(devices)]
        found = [state.numel() for state in self.cuda]
        check(found in ([], sizes), "cuda", found, f"no sizes, or those of this machine's {sizes}")

    @classmethod
    def capture(cls) -> RandomStates:
        version, words, gauss = random.getstate()
        _, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
        numpy = np.append(keys, position).astype(np.int64)
        mt19937 = np.stack([np.array(words, dtype=np.int64), numpy])  # 6x faster than torch.tensor
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
        return cls(
            mt19937=torch.from_numpy(mt19937),
            python_version=version,
            python_gauss=gauss,
            numpy_has_gauss=int(has_gauss),
            numpy_gauss=float(cached),
            torch=torch.get_rng_state(),
            cuda=list(cuda),
        )

    def restore(self) -> None:
        random.setstate(self._python())
        numpy = self.mt19937[1].tolist()
        np.random.set_state(
            ("MT19937", numpy[:624], numpy[624], self.numpy_has_gauss, float(self.numpy_gauss))
        )
        torch.set_rng_state(self.torch)
        if self.cuda:
            torch.cuda.set_rng_state_all(self.cuda)

    def _python(self) -> tuple[Any, ...]:
        gauss = self.python_gauss
        words = tuple(self.mt19937[0].tolist())
        return (self.python_version, words, None if gauss is None else float(gauss))


def _takes(setter: Callable[[Any], Any], state: Any) -> bool:
    """Whether ``setter``, a fresh generator's, takes ``state``."""
    try:
        setter(state)
    except (TypeError, ValueError, IndexError, OverflowError, RuntimeError):
        return False
    return True


def _rng_from_json(record: Any) -> dict[str, Any]:
    """A format-1 ``rng_state_<rank>.json`` (``vit5-rng/1``: lists and base64) as the fields of
    :class:`RandomStates` (a missing field: ``KeyError``; a misplaced one: ``TypeError``)."""
    check(record["format"] == "vit5-rng/1", "format", record["format"], "'vit5-rng/1'")
    python = record["python"]
    numpy = record["numpy"]
    words = [python["state"], [*numpy["keys"], numpy["pos"]]]
    return {
        "mt19937": torch.tensor(words, dtype=torch.int64),
        "python_version": python["version"],
        "python_gauss": python["gauss_next"],
        "numpy_has_gauss": numpy["has_gauss"],
        "numpy_gauss": numpy["cached_gaussian"],
        "torch": _decode(record["torch"]),
        "cuda": [_decode(text) for text in record["cuda"]],
    }


def _decode(text: str) -> torch.Tensor:
    raw = base64.b64decode(text, validate=True)  # binascii.Error (a ValueError): not base64
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()


@dataclass(frozen=True)
class EpochLayout:
    """What an epoch position is checked against: the per-process micro-batch, micro-batches per
    step, this run's micro-batches per epoch and process, an epoch's samples (x repeated aug)."""

    batch_size: int
    accum_steps: int
    batches_per_epoch: int
    epoch_samples: int

    def check(self, state: TrainState, manifest: Manifest, folder: Path, elastic: bool) -> None:
        """``ValueError`` unless the loaded position is the manifest's and the folder name's, on an
        optimizer step within an epoch of this run (``elastic``: written by another number of
        processes)."""
        for name in _POSITION:
            recorded = getattr(manifest, name)
            value = getattr(state, name)
            check(value == recorded, f"train_state.{name}", value, f"{recorded}, as in {MANIFEST}")
        number = checkpoint_number(folder)
        updates = state.num_updates
        said = f"{number}, as in {folder.name}"
        check(number in (-1, updates), "train_state.num_updates", updates, said)
        accum = self.accum_steps
        most = self.batches_per_epoch
        fits = state.batch % accum == 0 and (elastic or state.batch <= most)
        said = (
            f"a multiple of optim.accum_steps={accum} (checkpoints fall on optimizer steps), at "
            f"most the {most} micro-batches of an epoch of this run"
        )
        check(fits, "train_state.batch", state.batch, said)
        samples = state.epoch_samples
        step = self.batch_size * accum
        processes = manifest.num_processes
        trained = manifest.batch * self.batch_size * processes
        within = samples <= self.epoch_samples + processes
        fits = samples % step == 0 and within and (elastic or samples == trained)
        said = (
            f"a multiple of data.batch_size x optim.accum_steps = {step}, at most the "
            f"{self.epoch_samples} samples of an epoch and, on the processes that wrote it, "
            f"batch x data.batch_size x {processes} process(es) = {trained}"
        )
        check(fits, "train_state.epoch_samples", samples, said)


# ------------------------------------------------------------------------------- saving, loading
@dataclass
class Resumable:
    """What a checkpoint saves and restores (``model``: the unwrapped module being trained)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    ema: ModelEmaV3 | None
    state: TrainState


class _Damaged(ResumeError):
    """A checkpoint file is missing, damaged or refused; its message gains the last good one."""


@dataclass(frozen=True)
class Restored:
    """How a load went: not ``exact`` when random states were missing and allowed to be, or
    re-derived for another number of processes (``elastic_from``: the processes that wrote it);
    ``warning`` says how."""

    exact: bool
    warning: str = ""
    elastic_from: int | None = None


@dataclass
class CheckpointManager:
    """Saves, prunes, verifies and loads the training checkpoints of one run; every method is
    collective. ``config`` (the config as run) is recorded in every checkpoint for ``--resume``."""

    accelerator: Accelerator
    directory: Path
    keep_last: int
    parts: Resumable
    config: dict[str, Any]
    layout: EpochLayout
    newest_saved: int = -1  # the update count of the newest checkpoint this session wrote

    def save(self, num_updates: int) -> Path:
        """Write the full training state atomically and prune old ones; ``StorageError`` on every
        process when any cannot write (earlier checkpoints intact, the partial folder removed)."""
        acc = self.accelerator
        final = self.directory / f"ckpt-{num_updates:09d}"
        tmp = final.with_name(f".tmp-{final.name}")  # what staging_dir makes
        on_main(acc, lambda: staging_dir(final))
        files = {}
        if acc.is_main_process:
            scaler = getattr(acc, "scaler", None)
            scaler_state = scaler.state_dict() if scaler is not None else None
            files = _state_files(self.parts, acc.step, scaler_state)
        files[rng_file(acc.process_index)] = _torch_bytes(vars(RandomStates.capture()))

        def write() -> None:
            for name, data in files.items():
                atomic_write_bytes(tmp / name, data, durable=False)

        try:
            # every process's files are written before the manifest that vouches for them
            raise_agreed(acc, attempt(write))
            on_main(acc, lambda: self._publish(tmp, final, files))
        except Vit5Error as err:
            if acc.is_main_process:
                shutil.rmtree(tmp, ignore_errors=True)
            note = f"checkpoint {final.name} was not saved; the ones saved before are intact"
            raise StorageError(f"{err} ({note})") from err
        self.newest_saved = num_updates
        return final

    def _publish(self, tmp: Path, final: Path, files: dict[str, bytes]) -> None:
        listed = {name: _digest(data) for name, data in files.items()}
        for rank in range(1, self.accelerator.num_processes):  # written by the other processes
            listed[rng_file(rank)] = _digest((tmp / rng_file(rank)).read_bytes())
        for name in listed:  # flushed to disk before the manifest that vouches for them
            fsync_file(tmp / name)
        state = self.parts.state
        manifest = Manifest(
            format=FORMAT,
            num_updates=state.num_updates,
            epoch=state.epoch,
            batch=state.batch,
            epoch_samples=state.epoch_samples,
            num_processes=self.accelerator.num_processes,
            ema=EMA_FILE in listed,
            config=self.config,
            files=listed,
        )
        write_json(tmp / MANIFEST, dataclasses.asdict(manifest))
        replace_dir(tmp, final)  # the same update count saved again: swapped, never none
        self._prune(state.num_updates)

    def _prune(self, newest: int) -> None:
        """Keep ``keep_last`` checkpoints up to ``newest`` (this session's), and the newest good
        one."""
        for stale in self.directory.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        checkpoints = list_checkpoints(self.directory)
        mine_or_older = [c for c in checkpoints if checkpoint_number(c) <= newest]
        good = next((c for c in reversed(mine_or_older) if is_verified(c)), None)
        for old in mine_or_older[: -self.keep_last]:
            if old != good:
                shutil.rmtree(old, ignore_errors=True)

    def confirm(self, path: Path, how: str) -> None:
        """Record that ``path``'s weights gave a finite loss (``how``); prune what that makes
        redundant."""

        def mark() -> None:
            write_json(path / VERIFIED_FILE, {"verified_by": how}, durable=False)
            if self.newest_saved >= 0:
                self._prune(self.newest_saved)

        on_main(self.accelerator, mark)

    def set_aside(self, path: Path) -> Path:
        """Move a checkpoint whose weights diverged out of ``--resume``'s way (to
        ``ckpt-N.diverged``)."""
        target = path.with_name(path.name + ".diverged")

        def move() -> None:
            shutil.rmtree(target, ignore_errors=True)
            path.rename(target)

        on_main(self.accelerator, move)
        return target

    def load(self, path: Path, allow_inexact: bool = False) -> Restored:
        """Verify every file of ``path``, then restore weights, EMA, optimizer, progress and random
        states. ``ResumeError`` names a missing, damaged or refused file and the last good
        checkpoint, or says the checkpoint was written for another model, optimizer or EMA."""
        restored = Restored(exact=False)
        error = None
        try:
            restored = self._restore(path, allow_inexact)
        except (Vit5Error, OSError) as err:
            error = _with_last_good(err, path)
        raise_agreed(self.accelerator, error, ResumeError)
        return restored

    def _restore(self, path: Path, allow_inexact: bool) -> Restored:
        acc = self.accelerator
        parts = self.parts
        manifest = read_manifest(path)
        data = _verified_files(path, manifest, parts.ema is not None)
        # the position first: a crafted one is refused before anything is loaded
        record = _read(path, STATE_FILE, data[STATE_FILE], StateFile)
        elastic = manifest.num_processes != acc.num_processes
        try:
            self.layout.check(record.train_state, manifest, path, elastic)
            _restore_scaler(getattr(acc, "scaler", None), record.grad_scaler)
        except (ValueError, KeyError, TypeError, RuntimeError) as err:
            raise _damaged(path / STATE_FILE, err) from err
        _load_weights(path, MODEL_FILE, data[MODEL_FILE], parts.model)
        if parts.ema is not None:
            _load_weights(path, EMA_FILE, data[EMA_FILE], parts.ema.module)
        _load_optimizer(path, data[OPTIMIZER_FILE], parts.optimizer)
        vars(parts.state).update(vars(record.train_state))
        acc.step = record.accelerator_step
        if elastic:
            return self._elastic(path, manifest.num_processes)
        name = rng_file(acc.process_index, manifest.format)
        try:
            _read(path, name, _verified(path, name, manifest), RandomStates).restore()
        except _Damaged as err:
            if not allow_inexact:
                raise _Damaged(
                    f"{err}: without this process's random state the resumed run would not "
                    "continue exactly (other augmentations, drop-path masks and Mixup pairs); to "
                    "accept an inexact resume, set checkpoint.allow_inexact_resume=true"
                ) from err
            return Restored(
                exact=False,
                warning=f"WARNING: {err}; continuing WITHOUT restoring the random generators "
                "(checkpoint.allow_inexact_resume=true): this is not an exact continuation, and "
                "the summary records resume_exact=false",
            )
        return Restored(exact=True)

    def _elastic(self, path: Path, written_by: int) -> Restored:
        """A checkpoint of ``written_by`` processes on this run's number: the position in samples
        carries over, each process's generators are re-derived from (seed, epoch, update, rank)."""
        acc = self.accelerator
        state = self.parts.state
        layout = self.layout
        world = acc.num_processes
        state.batch = state.epoch_samples // (layout.batch_size * world)
        seed = [int(self.config["run"]["seed"]), state.epoch, state.num_updates, acc.process_index]
        set_seed(int(np.random.SeedSequence(seed).generate_state(1)[0]))
        per_step = layout.batch_size * layout.accum_steps
        steps = layout.batches_per_epoch // layout.accum_steps
        warning = (
            f"elastic resume: {path.name} was written by {written_by} process(es), this run has "
            f"{world}. Exact: weights, optimizer, EMA, update count, lr-schedule position and, "
            f"from sample {state.epoch_samples} of epoch {state.epoch + 1} on, the remaining "
            "samples of the epoch and their augmentations. Not exact: drop-path masks and "
            "Mixup/CutMix pairs (each process's random generators re-derived from seed, epoch, "
            f"update and rank), and the global batch ({per_step * written_by} -> "
            f"{per_step * world}; {steps} optimizer steps per epoch from now on, the lr schedule "
            "continues from the same fraction of the run)"
        )
        return Restored(exact=False, warning=warning, elastic_from=written_by)


def _with_last_good(err: BaseException, damaged: Path) -> str | None:
    """The message of ``err``; a damaged file's names the run's last good checkpoint, or the
    fix."""
    if not isinstance(err, _Damaged):
        return user_message(err)
    checkpoints = list_checkpoints(damaged.parent)
    good = next((c for c in reversed(checkpoints) if c != damaged and _intact(c)), None)
    if good is None:
        run_dir = damaged.parent.parent
        return (
            f"{err}. This run has no other intact checkpoint: start it again, or fine-tune from "
            f"its weights (model.pretrained={run_dir / 'final'} or {run_dir / 'best'}, if present)"
        )
    newer = (
        " (it continues in a new run directory since newer checkpoints exist; delete "
        f"{damaged} first to continue in place)"
    )
    return (
        f"{err}. The last good checkpoint of this run is {good}: resume with "
        f"`vit5 train --resume {good}`" + (newer if good != checkpoints[-1] else "")
    )


def _intact(path: Path) -> bool:
    """Whether every file of checkpoint ``path`` matches its recorded size and SHA-256."""
    try:
        manifest = read_manifest(path)
        for name in manifest.files:
            _verified(path, name, manifest)
    except ResumeError:
        return False
    return True


def is_verified(path: Path) -> bool:
    """Whether ``path``'s weights are known to give a finite loss (``verified.json``)."""
    return (path / VERIFIED_FILE).is_file()


def read_manifest(path: Path) -> Manifest:
    """The :class:`Manifest` of checkpoint ``path`` (not yet the files it lists); ``ResumeError``
    when there is none or it breaks the schema."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise ResumeError(f"{path} is not a complete training checkpoint: it has no {MANIFEST}")
    try:
        data = manifest_path.read_bytes()
    except OSError as err:
        raise _Damaged(f"{manifest_path} cannot be read ({os_error_reason(err)})") from err
    return _read(path, MANIFEST, data, Manifest)


def resolve_resume(path: Path) -> tuple[Path, Path]:
    """``(run_dir, checkpoint)`` from a run directory (latest checkpoint) or a checkpoint folder;
    a run's ``checkpoints/`` or a model folder (``best/``, ``final/``) is refused with the option
    that takes it."""
    if _NAME.match(path.name) and path.is_dir():
        return (path.parent.parent, path)
    if not path.is_dir():
        raise ResumeError(f"--resume {path}: no such run directory")
    latest = list_checkpoints(path / "checkpoints")
    if latest:
        return (path, latest[-1])
    inside = list_checkpoints(path)
    if inside:
        raise ResumeError(
            f"--resume {path}: this is a run's folder of checkpoints; give the run directory "
            f"(--resume {path.parent}, its newest checkpoint) or one checkpoint (--resume {inside[-1]})"
        )
    if (path / WEIGHTS_NAME).is_file():  # what save_model_dir writes
        run = path.parent
        resume = (
            f"to continue its run, --resume {run}; "
            if list_checkpoints(run / "checkpoints")
            else ""
        )
        raise ResumeError(
            f"--resume {path}: this is a model folder (weights and config.json, as a run's best/ and "
            f"final/), which holds no optimizer state or position; {resume}to train from its "
            f"weights, model.pretrained={path} without --resume"
        )
    raise ResumeError(
        f"--resume {path}: the run has no complete checkpoint yet "
        f"(nothing under {path / 'checkpoints'}); start it again without --resume"
    )


def checkpoint_config(checkpoint: Path) -> dict[str, Any]:
    """The config a checkpoint was written with; ResumeError (naming the last good one) else."""
    try:
        return read_manifest(checkpoint).config
    except _Damaged as err:
        raise ResumeError(_with_last_good(err, checkpoint)) from err


def save_model_dir(
    accelerator: Accelerator,
    model: nn.Module,
    ema: ModelEmaV3 | None,
    directory: Path,
    extra: dict[str, Any],
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


# ------------------------------------------------------------------------------- helpers
def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, allow_nan=True) + "\n").encode("ascii")


def _digest(data: bytes) -> FileDigest:
    return FileDigest(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def _damaged(file: Path, err: BaseException | str) -> _Damaged:
    return _Damaged(f"{file} is damaged or from another vit5 ({err})")


def _torch_bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _read(path: Path, name: str, data: bytes, schema: Any) -> Any:
    """File ``name`` of checkpoint ``path`` (JSON, or a ``.pt`` read ``weights_only``) as its
    ``schema``; ``_Damaged`` naming the file and the problem."""
    try:
        if name.endswith(".pt"):
            return parse(schema, safe_torch_load(data, name=str(path / name)))
        record = json.loads(data)
        if schema is RandomStates:  # format 1: rng_state_<rank>.json
            record = _rng_from_json(record)
        return parse(schema, record)
    except vit5.CheckpointError as err:  # a refused pickle or an unreadable file, named
        raise _Damaged(str(err)) from err
    except KeyError as err:  # format 1's random states
        raise _damaged(path / name, f"no field {err}") from err
    except (ValueError, TypeError, RuntimeError, OverflowError, RecursionError) as err:
        raise _damaged(path / name, err) from err  # JSON and UTF-8 errors are ValueErrors too


def _verified(path: Path, name: str, manifest: Manifest) -> bytes:
    """The bytes of ``path/name`` after checking them against the manifest."""
    expected = manifest.files.get(name)
    if expected is None:
        listing = path / MANIFEST
        raise _Damaged(f"{path / name} is not listed in {listing}: the checkpoint is incomplete")
    try:
        data = (path / name).read_bytes()
    except OSError as err:
        raise _Damaged(f"{path / name} is missing or unreadable ({os_error_reason(err)})") from err
    if _digest(data) != expected:
        raise _Damaged(
            f"{path / name} is damaged: {len(data)} bytes that do not match the "
            f"{expected.bytes} bytes and SHA-256 recorded when it was written (truncated, "
            "emptied or modified)"
        )
    return data


def _verified_files(path: Path, manifest: Manifest, ema: bool) -> dict[str, bytes]:
    """The verified bytes of the files every process reads, for a run with or without EMA."""
    if manifest.ema != ema:
        said = f"{path} was written with ema.enabled={manifest.ema}"
        raise ResumeError(f"{said}; resume with the same setting")
    names = [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE] + ([EMA_FILE] if ema else [])
    return {name: _verified(path, name, manifest) for name in names}


def _load_weights(path: Path, name: str, data: bytes, module: nn.Module) -> None:
    try:
        module.load_state_dict(load_safetensors(data), strict=True)
    except (SafetensorError, RuntimeError, ValueError) as err:
        raise ResumeError(
            f"{path / name} does not fit this run's model ({str(err).splitlines()[0]}): a "
            "checkpoint resumes only with the model it was written with"
        ) from err


def _load_optimizer(path: Path, data: bytes, optimizer: torch.optim.Optimizer) -> None:
    try:
        optimizer.load_state_dict(safe_torch_load(data, name=str(path / OPTIMIZER_FILE)))
    except vit5.CheckpointError as err:  # a refused pickle or an unreadable file
        raise _Damaged(str(err)) from err
    except (RuntimeError, ValueError, KeyError, TypeError) as err:
        raise ResumeError(
            f"{path / OPTIMIZER_FILE} does not fit this run's optimizer ({err}): a checkpoint "
            "resumes only with the optimizer and model it was written with"
        ) from err


def _restore_scaler(scaler: Any, state: dict[str, Any] | None) -> None:
    """The fp16 gradient scaler's state, present exactly when this run scales (fp16)."""
    if (state is None) != (scaler is None):
        raise ValueError("grad_scaler: the fp16 scaler state does not match run.mixed_precision")
    if scaler is not None:
        scaler.load_state_dict(state)


def _state_files(parts: Resumable, step: int, scaler: dict[str, Any] | None) -> dict[str, bytes]:
    """The files every process but the main one leaves out: weights, optimizer, the position."""
    files = {MODEL_FILE: safetensors_bytes(parts.model.state_dict())}
    if parts.ema is not None:
        files[EMA_FILE] = safetensors_bytes(parts.ema.module.state_dict())
    files[OPTIMIZER_FILE] = _torch_bytes(parts.optimizer.state_dict())
    record = StateFile(train_state=parts.state, accelerator_step=step, grad_scaler=scaler)
    files[STATE_FILE] = _json_bytes(dataclasses.asdict(record))
    return files
