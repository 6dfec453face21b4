"""Human-readable lines for a run: one per epoch, and the final summary (text and JSON)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vit5.files import atomic_write_json, atomic_write_text
from vit5.train.rundir import SUMMARY_JSON, SUMMARY_TXT

_MAX_LISTED_BAD_FILES = 20


def epoch_line(row: Mapping[str, Any], num_epochs: int) -> str:
    """``epoch 3/30 | loss 0.4120 | val top-1 95.32% (EMA 94.10%) | lr 1.20e-03 | 1234 img/s | 12.3 s``."""
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

    lines = [
        f"run {summary['run_dir']} {summary['status']}: "
        f"{summary['epochs']} epochs, {summary['updates']} optimizer steps",
        f"  model            {summary['model']}",
        f"  best top-1       {pct('best_top1')} (epoch {summary['best_epoch']}, raw weights; saved in best/)",
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
        lines.append(
            f"  forked from      {summary['forked_from']} (that run's newer checkpoints are untouched)"
        )
    if summary.get("resume_exact") is False:
        lines.append(
            "  resume_exact     false: random states were not restored (checkpoint.allow_inexact_resume)"
        )
    return "\n".join(lines)


def write_summary(run_dir: Path, summary: Mapping[str, Any]) -> None:
    """``summary.json`` and ``summary.txt``, each written atomically; file names of any encoding
    survive (escaped in JSON, backslash-escaped in the text)."""
    atomic_write_json(run_dir / SUMMARY_JSON, summary)
    atomic_write_text(run_dir / SUMMARY_TXT, format_summary(summary) + "\n")
