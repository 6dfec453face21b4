"""The run directory ``run.output_dir/run.name``: config.yaml, checkpoints/, best/, final/,
metrics.csv, curves.png, summary.{txt,json}, logs/. A new run never writes into a non-empty one (it
takes ``NAME-2``); the main process holds ``RUN/.lock``; resuming an older checkpoint forks a new
directory. See docs/training.md."""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from vit5 import plotstyle as S
from vit5.errors import storage_error
from vit5.files import (
    FolderLock,
    FolderLocked,
    atomic_write_text,
    recover_dir,
    replace_dir,
    staging_dir,
)
from vit5.outputs import write_csv, write_json
from vit5.runtime import from_main, on_main
from vit5.train.checkpointing import HISTORY_FIELDS, STATE_FILE
from vit5.train.config import TrainConfig, config_to_yaml

CONFIG_FILE = "config.yaml"
CHECKPOINTS = "checkpoints"
BEST = "best"
FINAL = "final"
METRICS_CSV = "metrics.csv"
CURVES_PNG = "curves.png"
SUMMARY_TXT = "summary.txt"
SUMMARY_JSON = "summary.json"


def create_run_dir(accelerator: Accelerator, cfg: TrainConfig) -> tuple[Path, FolderLock | None]:
    """Choose, create and lock a fresh run directory on the main process; every process gets its
    path (``StorageError`` on every process when ``run.output_dir`` cannot be written)."""
    output_dir = Path(cfg.run.output_dir).expanduser()
    lock = on_main(accelerator, lambda: _new_locked_dir(output_dir, cfg.run.name))
    return (_locked_folder(accelerator, lock), lock)


def lock_run_dir(accelerator: Accelerator, run_dir: Path) -> FolderLock | None:
    """Take the run's lock (main process) to continue it in place (``FolderLocked`` on every
    process when another live process writes it); complete or remove what a killed run left."""

    def take() -> FolderLock:
        lock = FolderLock(run_dir, "training").acquire()
        for name in (BEST, FINAL):  # a checkpoint's staging folder goes at the next save
            recover_dir(run_dir / name)
        return lock

    return on_main(accelerator, take)


def fork_run_dir(
    accelerator: Accelerator, run_dir: Path, checkpoint: Path
) -> tuple[Path, Path, FolderLock | None]:
    """``(new_run_dir, its copy of checkpoint, lock)`` to continue from an older ``checkpoint``;
    ``best/`` is copied when it is the best model as of the checkpoint."""

    def fork() -> FolderLock:
        lock = _new_locked_dir(run_dir.parent, run_dir.name)
        target = lock.folder / CHECKPOINTS / checkpoint.name
        _link_tree(checkpoint, target)
        if _best_matches(run_dir / BEST, target):
            _link_tree(run_dir / BEST, lock.folder / BEST)
        return lock

    lock = on_main(accelerator, fork)
    new_dir = _locked_folder(accelerator, lock)
    return (new_dir, new_dir / CHECKPOINTS / checkpoint.name, lock)


def write_config(run_dir: Path, cfg: TrainConfig, note: str = "") -> Path:
    """``config.yaml``: the full config as run (atomically), ``note`` as a leading YAML comment."""
    header = "".join(f"# {line}\n" for line in note.splitlines())
    return atomic_write_text(run_dir / CONFIG_FILE, header + config_to_yaml(cfg))


# ------------------------------------------------------------------------------------------ helpers
def _new_locked_dir(output_dir: Path, name: str) -> FolderLock:
    """Lock ``output_dir/name``, or the first ``name-K`` (K = 2, 3, ...) that is absent or empty."""
    while True:
        names = itertools.chain([name], (f"{name}-{k}" for k in itertools.count(2)))
        folders = (output_dir / n for n in names)
        path = next(p for p in folders if not (p.exists() and any(p.iterdir())))
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise storage_error(err, path, "create the run directory") from err
        try:
            return FolderLock(path, "training").acquire()
        except FolderLocked:  # another run took this name a moment ago: take the next one
            continue


def _locked_folder(accelerator: Accelerator, lock: FolderLock | None) -> Path:
    """The folder the main process locked, on every process."""
    folder = str(lock.folder) if lock is not None else ""
    return Path(from_main(accelerator, folder))


def _link_tree(source: Path, target: Path) -> None:
    """Copy folder ``source`` to ``target`` via a staging folder, hard-linking where possible."""
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
    """Whether ``best/`` holds the best model as of ``checkpoint`` (its epoch is the best one)."""
    try:
        exported = json.loads((best / "config.json").read_text())
        state = json.loads((checkpoint / STATE_FILE).read_text())["train_state"]
        return bool(exported.get("epoch") == state["best_epoch"] and state["best_epoch"] > 0)
    except (OSError, ValueError, KeyError, TypeError):
        return False


_MAX_LISTED_BAD_FILES = 20


def count(n: int, noun: str) -> str:
    """``count(1, "epoch")`` -> ``"1 epoch"``, ``count(3, "epoch")`` -> ``"3 epochs"``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def epoch_line(row: Mapping[str, Any], num_epochs: int) -> str:
    """One line per epoch, e.g. ``epoch 3/30 | loss 0.4120 | val top-1 95.32% (EMA 94.10%) |
    lr 1.20e-03 | 1234 img/s | 12.3 s``."""
    parts = [f"epoch {row['epoch']}/{num_epochs}", f"loss {row['train_loss']:.4f}"]
    if row.get("val_top1") is not None:
        val = f"val top-1 {row['val_top1']:.2f}%"
        if row.get("ema_top1") is not None:
            val += f" (EMA {row['ema_top1']:.2f}%)"
        parts.append(val)
    parts += [
        f"lr {row['lr']:.2e}",
        f"{row['train_images_per_s']:.0f} img/s",
        f"{row['epoch_seconds']:.1f} s",
    ]
    if row.get("bad_files"):
        parts.append(f"{row['bad_files']} bad files skipped")
    return " | ".join(parts)


def format_summary(summary: Mapping[str, Any]) -> str:
    """The final summary block printed at the end and written to ``summary.txt``."""

    def pct(key: str) -> str:
        value = summary.get(key)
        return "n/a" if value is None else f"{value:.2f}%"

    best = f"(epoch {summary['best_epoch']}, raw weights; saved in best/)"
    lines = [
        f"run {summary['run_dir']} {summary['status']}: "
        f"{count(summary['epochs'], 'epoch')}, {count(summary['updates'], 'optimizer step')}",
        f"  model            {summary['model']}",
        f"  best top-1       {pct('best_top1')} {best}",
        f"  final top-1      {pct('final_top1')} (top-5 {pct('final_top5')})",
        f"  EMA top-1        {pct('ema_top1')} at the end, best {pct('best_ema_top1')}",
        f"  wall time        {summary['wall_seconds'] / 60:.1f} min "
        f"({summary['train_seconds'] / 60:.1f} min training)",
        f"  throughput       {summary['train_images_per_s']:.0f} images/s "
        f"over {summary['num_processes']} process(es)",
        f"  skipped files    {summary['bad_files']}",
    ]
    lines += [f"    {path}" for path in summary["bad_file_paths"][:_MAX_LISTED_BAD_FILES]]
    if summary.get("forked_from"):
        untouched = "(that run's newer checkpoints are untouched)"
        lines.append(f"  forked from      {summary['forked_from']} {untouched}")
    written_by = summary.get("resumed_from_processes")
    if summary.get("resume_exact") is False and written_by:
        lines.append(
            f"  resume_exact     false: elastic resume of a checkpoint of {written_by} process(es) "
            "(random generators re-derived; see resume_note in summary.json)"
        )
    elif summary.get("resume_exact") is False:
        why = "random states were not restored (checkpoint.allow_inexact_resume)"
        lines.append(f"  resume_exact     false: {why}")
    return "\n".join(lines)


def write_summary(run_dir: Path, summary: Mapping[str, Any]) -> None:
    """``summary.json`` and ``summary.txt``, each written atomically."""
    write_json(run_dir / SUMMARY_JSON, summary)
    atomic_write_text(run_dir / SUMMARY_TXT, format_summary(summary) + "\n")


_PANELS = (
    (
        "loss",
        (("train_loss", "train (soft targets)"), ("val_loss", "val"), ("ema_val_loss", "val, EMA")),
    ),
    ("top-1 accuracy (%)", (("val_top1", "val"), ("ema_top1", "val, EMA"))),
    ("learning rate (end of epoch)", (("lr", "peak group"),)),
)


def plot_curves(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> Path:
    """Loss, top-1 and lr against epochs (a missing value leaves a gap), in the role colours."""
    fig = S.figure(S.TEXT_WIDTH, 2.6)
    axes = fig.subplots(1, 3)
    epochs = [int(r["epoch"]) for r in rows]
    for ax, (ylabel, series) in zip(axes, _PANELS, strict=True):
        for key, label in series:
            points = [
                (e, r[key]) for e, r in zip(epochs, rows, strict=True) if r.get(key) is not None
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                role = label.split(" (")[0] if key != "lr" else "train"
                ax.plot(xs, ys, marker="o", markersize=3, label=label, color=S.ROLE_COLOURS[role])
        S.style_axes(ax, xlabel="epoch", ylabel=ylabel)
        ax.xaxis.get_major_locator().set_params(integer=True)
        S.legend(ax)
    axes[2].set_yscale("log")
    best = [r["val_top1"] for r in rows if r.get("val_top1") is not None]
    if best:
        axes[1].set_title(f"best val top-1 {max(best):.2f}%", fontsize=S.FONT)
    if title:
        fig.suptitle(title, fontsize=S.FONT_TITLE)
    return S.save_figure(fig, path)[0]


CSV_COLUMNS = tuple(k for k in HISTORY_FIELDS if k != "val_images")  # val_images: in summary.json


def write_metrics(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """``metrics.csv``: one row per epoch in :data:`CSV_COLUMNS` (rewritten every epoch, so not fsynced)."""
    return write_csv(path, rows, CSV_COLUMNS, durable=False)
