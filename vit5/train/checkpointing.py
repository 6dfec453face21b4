"""Resumable training checkpoints (``RUN/checkpoints/ckpt-<updates>``) and the model folders
``best/`` and ``final/``, nothing unpickled (Accelerate's ``save_state`` pickles): safetensors
weights, the optimizer state read with ``torch.load(weights_only=True)``, the position and each
process's random generators as JSON, and the manifest ``checkpoint.json`` (written last: the config
as run, every file's size and SHA-256). A load starts at the manifest and reads only files it
vouches for; each JSON file is one typed schema (:class:`Manifest`, :class:`StateFile`,
:class:`RandomStates`) checked at construction by :func:`vit5.errors.rule_problems`. Format
``vit5-train-checkpoint/1``, as written since 7f2503b; docs/training.md, "The checkpoint format"."""

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

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
    Rule,
    StorageError,
    Vit5Error,
    os_error_reason,
    rule_problems,
    storage_error,
    user_message,
)
from vit5.files import atomic_write_bytes, fsync_file, replace_dir, staging_dir
from vit5.outputs import write_json
from vit5.runtime import attempt, on_main, raise_agreed
from vit5.train.errors import ResumeError
from vit5.weights.checkpoint import safe_torch_load, safetensors_bytes

FORMAT = "vit5-train-checkpoint/1"
RNG_FORMAT = "vit5-rng/1"
MANIFEST = "checkpoint.json"
MODEL_FILE = "model.safetensors"
EMA_FILE = "model_ema.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "train_state.json"
VERIFIED_FILE = "verified.json"
_NAME = re.compile(r"^ckpt-(\d+)$")
# the columns of a metrics row (metrics.csv); the first six and bad_files are always set
HISTORY_FIELDS = tuple(
    "epoch updates lr train_loss train_images_per_s epoch_seconds val_loss val_top1 val_top5"
    " val_images ema_val_loss ema_top1 ema_top5 bad_files".split()
)
_REQUIRED_ROW_FIELDS = (*HISTORY_FIELDS[:6], "bad_files")
_POSITION = ("epoch", "batch", "epoch_samples", "num_updates")


def checkpoint_number(path: Path) -> int:
    """The update count in a ``ckpt-<updates>`` name (-1 for any other name)."""
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else -1


def rng_file(rank: int) -> str:
    return f"rng_state_{rank}.json"


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
def _is_count(value: Any, least: int = 0) -> bool:
    """An integer (not a bool) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_duration(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value) and value >= 0


def _equals(expected: Any) -> Callable[[Any], bool]:
    return lambda value: value == expected


def _is_listing(files: Any) -> bool:
    """File names of the folder itself (no path, not hidden), each with its bytes and SHA-256."""

    def entry(name: str, digest: Any) -> bool:
        plain = bool(name) and Path(name).name == name and not name.startswith(".")
        sized = isinstance(digest, dict) and _is_count(digest.get("bytes"))
        return plain and sized and isinstance(digest.get("sha256"), str)

    return isinstance(files, dict) and all(entry(k, v) for k, v in files.items())


def _refuse(values: Mapping[str, Any], rules: Iterable[Rule], where: str = "") -> None:
    """``ValueError`` with the first problem of ``values`` under ``rules``, after ``where``."""
    problems = rule_problems(values, rules)
    if problems:
        raise ValueError(where + problems[0])


_FORMAT_RULE = Rule(
    "format",
    _equals(FORMAT),
    f"{FORMAT!r}, the format this vit5 reads: resume the run with the vit5 that wrote it, "
    "or fine-tune from its weights (model.pretrained=RUN/final)",
)
_MANIFEST_RULES = (
    _FORMAT_RULE,
    Rule(" ".join(_POSITION), _is_count, "an integer >= 0"),
    Rule("num_processes", lambda v: _is_count(v, 1), "an integer >= 1"),
    Rule("ema", lambda v: isinstance(v, bool), "true or false"),
    Rule("config", lambda v: isinstance(v, dict), "the config as run (a JSON object)"),
    Rule("files", _is_listing, "file names of the folder, each with its bytes and sha256"),
)


@dataclass(frozen=True)
class Manifest:
    """``checkpoint.json``, where every load starts: the position, the processes that wrote the
    checkpoint, whether it holds EMA weights, the config as run, every file's size and SHA-256."""

    format: str
    num_updates: int
    epoch: int
    batch: int
    epoch_samples: int
    num_processes: int
    ema: bool
    config: dict[str, Any]
    files: dict[str, Any]

    def __post_init__(self) -> None:
        _refuse(vars(self), _MANIFEST_RULES)

    @classmethod
    def from_json(cls, record: Any) -> Manifest:
        # the format first: another format may differ in every other field
        _refuse({"format": record["format"]}, [_FORMAT_RULE])
        return cls(
            format=record["format"],
            num_updates=record["num_updates"],
            epoch=record["epoch"],
            batch=record["batch"],
            epoch_samples=record["epoch_samples"],
            num_processes=record["num_processes"],
            ema=record["ema"],
            config=record["config"],
            files=record["files"],
        )


_STATE_TYPES = (
    Rule("epoch batch epoch_samples num_updates images_seen", _is_count, "an integer >= 0"),
    Rule("train_seconds wall_seconds", _is_duration, "a finite number >= 0"),
    Rule("best_top1", _is_number, "a number"),
    Rule("best_epoch", lambda v: _is_count(v, -1), "an integer >= -1"),
    Rule("history", lambda v: isinstance(v, list), "a list of metrics rows"),
)
_ROW_RULES = (
    Rule(" ".join(_REQUIRED_ROW_FIELDS), _is_number, "a number"),
    Rule(
        " ".join(k for k in HISTORY_FIELDS if k not in _REQUIRED_ROW_FIELDS),
        _is_number,
        "a number or null",
    ),
    Rule("updates", _is_count, "an integer >= 0"),
)


@dataclass
class TrainState:
    """Where the run is: ``epoch`` (0-based, in progress), ``batch`` (micro-batches of it trained
    by each process), ``epoch_samples`` (samples of the epoch's global order trained by all
    processes: where the data resumes), ``num_updates``, the best raw val top-1 and its epoch,
    time, images, and one metrics row per finished epoch. Construction checks types, ranges and
    agreement (:meth:`_agreement`), so a loaded state is refused naming the field."""

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

    def __post_init__(self) -> None:
        _refuse(vars(self), _STATE_TYPES, "train_state.")
        for index, row in enumerate(self.history):
            _check_row(index, row)
        _refuse(vars(self), self._agreement(), "train_state.")

    def _agreement(self) -> list[Rule]:
        """One history row per finished epoch; the best epoch among them, with its val top-1."""
        rows = len(self.history)
        best = self.best_epoch
        top1 = self.history[best - 1].get("val_top1") if 1 <= best <= rows else -1.0
        return [
            Rule("epoch", _equals(rows), f"the number of history rows ({rows})"),
            Rule("num_updates", lambda v: v >= self.epoch, f"at least the epochs ({self.epoch})"),
            Rule("best_epoch", lambda v: v == -1 or 1 <= v <= rows, f"-1 or in [1, {rows}]"),
            Rule("best_top1", _equals(top1), f"{top1!r}, val_top1 of history row {best}"),
        ]

    @classmethod
    def from_json(cls, record: Any) -> TrainState:
        return cls(
            epoch=record["epoch"],
            batch=record["batch"],
            epoch_samples=record["epoch_samples"],
            num_updates=record["num_updates"],
            best_top1=record["best_top1"],
            best_epoch=record["best_epoch"],
            train_seconds=record["train_seconds"],
            wall_seconds=record["wall_seconds"],
            images_seen=record["images_seen"],
            history=record["history"],
        )


def _check_row(index: int, row: Any) -> None:
    """A metrics row: the known columns, numbers, its own epoch (``ValueError`` naming it)."""
    where = f"train_state.history[{index}]"
    fields = row if isinstance(row, dict) else {}
    missing = [f"no {k!r}" for k in _REQUIRED_ROW_FIELDS if k not in fields]
    unknown = [f"an unknown field {k!r}" for k in fields if k not in HISTORY_FIELDS]
    if missing or unknown:
        raise ValueError(f"{where} has {(missing + unknown)[0]}")
    values = {k: row.get(k) for k in HISTORY_FIELDS}
    rules = [*_ROW_RULES, Rule("epoch", _equals(index + 1), str(index + 1))]
    _refuse(values, rules, where + ".")


@dataclass(frozen=True)
class StateFile:
    """``train_state.json``: the :class:`TrainState`, Accelerate's step counter and the fp16
    gradient scaler's state (null without fp16)."""

    train_state: TrainState
    accelerator_step: int
    grad_scaler: dict[str, Any] | None

    def __post_init__(self) -> None:
        rules = [
            Rule("accelerator_step", _is_count, "an integer >= 0"),
            Rule("grad_scaler", lambda v: isinstance(v, dict), "a scaler state or null"),
        ]
        _refuse(vars(self), rules)

    @classmethod
    def from_json(cls, record: Any) -> StateFile:
        return cls(
            train_state=TrainState.from_json(record["train_state"]),
            accelerator_step=record["accelerator_step"],
            grad_scaler=record["grad_scaler"],
        )


def _takes(setter: Callable[[Any], Any], state: Any) -> bool:
    """Whether ``setter``, a fresh generator's, takes ``state``."""
    try:
        setter(state)
    except (TypeError, ValueError, IndexError, OverflowError, RuntimeError):
        return False
    return True


def _python_fits(state: tuple[Any, ...]) -> bool:
    """``random.setstate`` takes any object as ``gauss_next``: it must be a float or None."""
    gauss = state[2]
    number = gauss is None or isinstance(gauss, float)
    return number and _takes(random.Random().setstate, state)


def _cuda_fits(states: list[torch.Tensor]) -> bool:
    """None (written without CUDA) or one state per visible CUDA device, of its size."""
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    sizes = [torch.cuda.get_rng_state(i).numel() for i in range(devices)]
    return not states or [state.numel() for state in states] == sizes


_RNG_RULES = (
    Rule("python", _python_fits, "Python's random state (version, 625 integers, gauss_next)"),
    Rule("numpy", partial(_takes, np.random.RandomState().set_state), "NumPy's legacy state"),
    Rule("torch", partial(_takes, torch.Generator().set_state), "torch's CPU generator state"),
    Rule("cuda", _cuda_fits, "none or one state per visible CUDA device"),
)


@dataclass(frozen=True)
class RandomStates:
    """One process's generators: Python's, NumPy's legacy global one, torch's CPU one, every CUDA
    device's. Stored as plain JSON (``rng_state_<rank>.json``, ``vit5-rng/1``); construction sets
    each on a fresh generator, so a crafted state is refused before a global generator changes."""

    python: tuple[Any, ...]
    numpy: tuple[Any, ...]
    torch: torch.Tensor
    cuda: list[torch.Tensor]

    def __post_init__(self) -> None:
        _refuse(vars(self), _RNG_RULES)

    @classmethod
    def capture(cls) -> RandomStates:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
        return cls(
            python=random.getstate(),
            numpy=np.random.get_state(legacy=True),
            torch=torch.get_rng_state(),
            cuda=list(cuda),
        )

    def restore(self) -> None:
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch)
        if self.cuda:
            torch.cuda.set_rng_state_all(self.cuda)

    @classmethod
    def from_json(cls, record: Any) -> RandomStates:
        _refuse({"format": record["format"]}, [Rule("format", _equals(RNG_FORMAT), RNG_FORMAT)])
        python = record["python"]
        numpy = record["numpy"]
        keys = np.asarray(numpy["keys"], dtype=np.int64)
        if keys.shape != (624,) or keys.min() < 0 or keys.max() >= 2**32:
            raise ValueError("numpy.keys must be 624 32-bit integers")
        if not 0 <= numpy["pos"] <= 624:  # set_state takes any position, and reads out of bounds
            raise ValueError(f"numpy.pos={numpy['pos']!r} must be in [0, 624]")
        return cls(
            python=(python["version"], tuple(python["state"]), python["gauss_next"]),
            numpy=(
                numpy["kind"],
                tuple(keys.tolist()),  # a tuple: its repr in a message is one line
                numpy["pos"],
                numpy["has_gauss"],
                numpy["cached_gaussian"],
            ),
            torch=_decode(record["torch"]),
            cuda=[_decode(text) for text in record["cuda"]],
        )

    def to_json(self) -> dict[str, Any]:
        version, internal, gauss = self.python
        kind, keys, pos, has_gauss, cached = self.numpy
        numpy = {
            "kind": kind,
            "keys": [int(key) for key in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
        return {
            "format": RNG_FORMAT,
            "python": {"version": version, "state": list(internal), "gauss_next": gauss},
            "numpy": numpy,
            "torch": _encode(self.torch),
            "cuda": [_encode(state) for state in self.cuda],
        }


def capture_rng() -> dict[str, Any]:
    """This process's generators as :class:`RandomStates`' JSON (no pickle)."""
    return RandomStates.capture().to_json()


def restore_rng(record: Any) -> None:
    """Set every generator from :func:`capture_rng`'s JSON; ``ValueError`` (nothing changed) for
    a record that breaks :class:`RandomStates`' schema."""
    _parse(RandomStates, record).restore()


def _encode(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode("ascii")


def _decode(text: str) -> torch.Tensor:
    raw = base64.b64decode(text, validate=True)  # binascii.Error (a ValueError): not base64
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()


def _parse(schema: Any, record: Any) -> Any:
    """``schema.from_json(record)``; ``ValueError`` for a missing field or a misplaced type."""
    try:
        return schema.from_json(record)
    except KeyError as err:
        raise ValueError(f"no field {err}") from None
    except (TypeError, OverflowError) as err:
        raise ValueError(f"a field of the wrong type or size ({err})") from None


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


@dataclass(frozen=True)
class EpochLayout:
    """What an epoch position is checked against: the per-process micro-batch, micro-batches per
    step, this run's micro-batches per epoch and process, an epoch's samples (x repeated aug)."""

    batch_size: int
    accum_steps: int
    batches_per_epoch: int
    epoch_samples: int

    def rules(self, manifest: Manifest, folder: Path, elastic: bool) -> list[Rule]:
        """Where a loaded position may be: the manifest's and the folder name's, on an optimizer
        step within an epoch of this run (``elastic``: written by another number of processes)."""
        recorded = {name: getattr(manifest, name) for name in _POSITION}
        said = [Rule(k, _equals(v), f"{v}, as in {MANIFEST}") for k, v in recorded.items()]
        number = checkpoint_number(folder)
        accum = self.accum_steps
        most = self.batches_per_epoch
        step = self.batch_size * accum
        samples = self.epoch_samples + manifest.num_processes
        trained = manifest.batch * self.batch_size * manifest.num_processes
        per_batch = f"batch x data.batch_size x {manifest.num_processes} process(es)"
        return said + [
            Rule("num_updates", lambda v: number in (-1, v), f"{number}, as in {folder.name}"),
            Rule(
                "batch",
                lambda v: v % accum == 0 and (elastic or v <= most),
                f"a multiple of optim.accum_steps={accum} (checkpoints fall on optimizer "
                f"steps), at most the {most} micro-batches of an epoch of this run",
            ),
            Rule(
                "epoch_samples",
                lambda v: v % step == 0 and v <= samples and (elastic or v == trained),
                f"a multiple of data.batch_size x optim.accum_steps = {step}, at most the "
                f"{self.epoch_samples} samples of an epoch and, on the processes that wrote it, "
                f"{per_batch} = {trained}",
            ),
        ]


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
            files = _state_files(self.parts, acc.step, _scaler_state(acc))
        files[rng_file(acc.process_index)] = _json_bytes(capture_rng())

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
        processes = self.accelerator.num_processes
        manifest = _manifest(self.parts.state, processes, self.config, listed)
        write_json(tmp / MANIFEST, dataclasses.asdict(manifest))
        replace_dir(tmp, final)  # the same update count saved again: swapped, never none
        self._prune(self.parts.state.num_updates)

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
        record = _read_json(path, STATE_FILE, data[STATE_FILE], StateFile)
        elastic = manifest.num_processes != acc.num_processes
        try:
            rules = self.layout.rules(manifest, path, elastic)
            _refuse(vars(record.train_state), rules, "train_state.")
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
        name = rng_file(acc.process_index)
        try:
            _read_json(path, name, _verified(path, name, manifest), RandomStates).restore()
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
    return _read_json(path, MANIFEST, data, Manifest)


def resolve_resume(path: Path) -> tuple[Path, Path]:
    """``(run_dir, checkpoint)`` from a run directory (latest checkpoint) or a checkpoint folder."""
    if _NAME.match(path.name) and path.is_dir():
        return (path.parent.parent, path)
    if not path.is_dir():
        raise ResumeError(f"--resume {path}: no such run directory")
    latest = list_checkpoints(path / "checkpoints")
    if not latest:
        raise ResumeError(
            f"--resume {path}: the run has no complete checkpoint yet "
            f"(nothing under {path / 'checkpoints'}); start it again without --resume"
        )
    return (path, latest[-1])


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


def _digest(data: bytes) -> dict[str, Any]:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _damaged(file: Path, err: BaseException) -> _Damaged:
    return _Damaged(f"{file} is damaged or from another vit5 ({err})")


def _read_json(path: Path, name: str, data: bytes, schema: Any) -> Any:
    """File ``name`` of checkpoint ``path`` as its ``schema``; ``_Damaged`` naming the problem."""
    try:
        return _parse(schema, json.loads(data))
    except ValueError as err:  # JSON and UTF-8 errors are ValueErrors too
        raise _damaged(path / name, err) from err


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
    if _digest(data) != {"bytes": expected["bytes"], "sha256": expected["sha256"]}:
        raise _Damaged(
            f"{path / name} is damaged: {len(data)} bytes that do not match the "
            f"{expected['bytes']} bytes and SHA-256 recorded when it was written (truncated, "
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


def _scaler_state(acc: Accelerator) -> dict[str, Any] | None:
    scaler = getattr(acc, "scaler", None)
    return scaler.state_dict() if scaler is not None else None


def _restore_scaler(scaler: Any, state: dict[str, Any] | None) -> None:
    """The fp16 gradient scaler's state, present exactly when this run scales (fp16)."""
    if (state is None) != (scaler is None):
        raise ValueError("grad_scaler: the fp16 scaler state does not match run.mixed_precision")
    if scaler is not None:
        scaler.load_state_dict(state)


def _state_files(parts: Resumable, step: int, scaler: dict[str, Any] | None) -> dict[str, bytes]:
    """The files every process but the main one leaves out: weights, optimizer, the position."""
    optimizer = io.BytesIO()
    torch.save(parts.optimizer.state_dict(), optimizer)
    files = {MODEL_FILE: safetensors_bytes(parts.model.state_dict())}
    if parts.ema is not None:
        files[EMA_FILE] = safetensors_bytes(parts.ema.module.state_dict())
    files[OPTIMIZER_FILE] = optimizer.getvalue()
    record = StateFile(train_state=parts.state, accelerator_step=step, grad_scaler=scaler)
    files[STATE_FILE] = _json_bytes(dataclasses.asdict(record))
    return files


def _manifest(
    state: TrainState,
    processes: int,
    config: dict[str, Any],
    files: dict[str, Any],
) -> Manifest:
    return Manifest(
        format=FORMAT,
        num_updates=state.num_updates,
        epoch=state.epoch,
        batch=state.batch,
        epoch_samples=state.epoch_samples,
        num_processes=processes,
        ema=EMA_FILE in files,
        config=config,
        files=files,
    )
