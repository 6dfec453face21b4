"""The run directory: where it goes, who may write it, and the files every run leaves.

``RUN = run.output_dir / run.name`` holds ``config.yaml`` (the full config as run),
``checkpoints/`` (resumable state), ``best/`` and ``final/`` (model directories), ``metrics.csv``,
``curves.png`` and ``summary.{txt,json}``. A new run never writes into an existing, non-empty
directory: it takes the next free ``NAME-2``, ``NAME-3``, ...

**One writer**: the main process holds ``RUN/.lock`` (:class:`vit5.files.FolderLock`) from the
start of the run to its end, so a second ``train.py`` (a second ``--resume`` of the same run)
stops with an error naming the holder instead of interleaving checkpoints.

**Resume never rewrites history**: resuming from the run's latest checkpoint continues in the
same directory; resuming from an older one (newer checkpoints exist) *forks*: a new run directory
``NAME-K`` gets a copy of that checkpoint (hard links where possible) and, when it is the best
model of that point, of ``best/``. The original run is only read, never changed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from vit5.errors import Vit5Error, storage_error, user_message
from vit5.files import FolderLock, FolderLocked, atomic_write_text, recover_dir, replace_dir, staging_dir
from vit5.train.checkpointing import STATE_FILE, checkpoint_number, list_checkpoints
from vit5.train.config import TrainConfig
from vit5.train.config_load import config_to_yaml

CONFIG_FILE = "config.yaml"
CHECKPOINTS = "checkpoints"
BEST = "best"
FINAL = "final"
METRICS_CSV = "metrics.csv"
CURVES_PNG = "curves.png"
SUMMARY_TXT = "summary.txt"
SUMMARY_JSON = "summary.json"


def free_run_dir(output_dir: Path, name: str) -> Path:
    """``output_dir/name``, or the first ``name-K`` (K = 2, 3, ...) that is absent or empty."""
    candidate, k = output_dir / name, 2
    while candidate.exists() and any(candidate.iterdir()):
        candidate, k = output_dir / f"{name}-{k}", k + 1
    return candidate


def create_run_dir(accelerator: Accelerator, cfg: TrainConfig) -> tuple[Path, FolderLock | None]:
    """Choose, create and lock a fresh run directory on the main process; every process gets its path.

    Raises:
        StorageError: ``run.output_dir`` cannot be created or written (on every process).
    """
    return _on_main(accelerator, lambda: _new_locked_dir(Path(cfg.run.output_dir).expanduser(), cfg.run.name))


def lock_run_dir(accelerator: Accelerator, run_dir: Path) -> FolderLock | None:
    """Take the run's lock (main process) to continue it in place; finish what a crash left half-done.

    Raises:
        FolderLocked: another live process is writing the run (on every process).
    """

    def take() -> tuple[Path, FolderLock]:
        lock = FolderLock(run_dir, "training").acquire()
        recover_leftovers(run_dir)
        return run_dir, lock

    return _on_main(accelerator, take)[1]


def fork_run_dir(
    accelerator: Accelerator, run_dir: Path, checkpoint: Path
) -> tuple[Path, Path, FolderLock | None]:
    """Continue from ``checkpoint`` (not the latest of ``run_dir``) in a new run directory.

    Returns ``(new_run_dir, its copy of the checkpoint, lock)``. ``best/`` is copied when it is the
    best model as of the checkpoint (its epoch is the checkpoint's best epoch).
    """
    copied: list[Path] = []

    def fork() -> tuple[Path, FolderLock]:
        new_dir, lock = _new_locked_dir(run_dir.parent, run_dir.name)
        target = new_dir / CHECKPOINTS / checkpoint.name
        _link_tree(checkpoint, target)
        copied.append(target)
        if _best_matches(run_dir / BEST, target):
            _link_tree(run_dir / BEST, new_dir / BEST)
        return new_dir, lock

    new_dir, lock = _on_main(accelerator, fork)
    target = [str(copied[0]) if copied else ""]
    if accelerator.num_processes > 1:
        broadcast_object_list(target, from_process=0)
    return new_dir, Path(target[0]), lock


def newer_checkpoints(checkpoint: Path) -> list[Path]:
    """The checkpoints of ``checkpoint``'s run written after it (a later timeline)."""
    return [
        c for c in list_checkpoints(checkpoint.parent) if checkpoint_number(c) > checkpoint_number(checkpoint)
    ]


def recover_leftovers(run_dir: Path) -> None:
    """Complete or remove what a killed run left: a ``best/`` / ``final/`` swap cut short, staging folders."""
    for name in (BEST, FINAL):
        recover_dir(run_dir / name)
    for stale in (run_dir / CHECKPOINTS).glob(".tmp-*") if (run_dir / CHECKPOINTS).is_dir() else ():
        shutil.rmtree(stale, ignore_errors=True)


def write_config(run_dir: Path, cfg: TrainConfig, note: str = "") -> Path:
    """``config.yaml``: the full config as run (atomically), with ``note`` as a leading YAML comment."""
    header = "".join(f"# {line}\n" for line in note.splitlines())
    return atomic_write_text(run_dir / CONFIG_FILE, header + config_to_yaml(cfg))


# ------------------------------------------------------------------------------------------ helpers
def _new_locked_dir(output_dir: Path, name: str) -> tuple[Path, FolderLock]:
    while True:
        path = free_run_dir(output_dir, name)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise storage_error(err, path, "create the run directory") from err
        try:
            return path, FolderLock(path, "training").acquire()
        except FolderLocked:  # another run took this name a moment ago: take the next one
            continue


def _on_main(accelerator: Accelerator, action: Any) -> tuple[Path, FolderLock | None]:
    """Run ``action`` (returning a path and a lock) on the main process; share the path or its error."""
    shared: list[Any] = [None, None]
    lock = None
    if accelerator.is_main_process:
        try:
            path, lock = action()
            shared = [str(path), None]
        except (Vit5Error, OSError) as err:
            shared = [None, (type(err).__name__, user_message(err))]
    if accelerator.num_processes > 1:
        broadcast_object_list(shared, from_process=0)
    if shared[1] is not None:
        kind, message = shared[1]
        raise (FolderLocked if kind == "FolderLocked" else Vit5Error)(message)
    return Path(shared[0]), lock


def _link_tree(source: Path, target: Path) -> None:
    """Copy the folder ``source`` to ``target`` (hard links where the file system allows: files are
    never modified in place, only replaced), through a staging folder."""
    staged = staging_dir(target)
    try:
        for item in source.iterdir():
            if item.is_file():
                try:
                    os.link(item, staged / item.name)
                except OSError:
                    shutil.copy2(item, staged / item.name)
    except OSError as err:
        raise storage_error(err, target, "copy into") from err
    replace_dir(staged, target)


def _best_matches(best: Path, checkpoint: Path) -> bool:
    """Whether ``best/`` holds the best model as of ``checkpoint`` (same epoch as its best epoch)."""
    try:
        exported = json.loads((best / "config.json").read_text())
        state = json.loads((checkpoint / STATE_FILE).read_text())["train_state"]
        return bool(exported.get("epoch") == state["best_epoch"] and state["best_epoch"] > 0)
    except (OSError, ValueError, KeyError, TypeError):
        return False
