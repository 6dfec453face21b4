"""Per-epoch metrics: reduction across processes and the metrics CSV.

Every number in the CSV covers the whole data set and all processes: sums (loss x count, correct
predictions, counts, images) are reduced with ``accelerator.reduce(..., "sum")`` before any
division, so shards of unequal size are weighted correctly.
"""

from __future__ import annotations

import csv
import io
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

CSV_COLUMNS = (
    "epoch",
    "updates",
    "lr",
    "train_loss",
    "train_images_per_s",
    "epoch_seconds",
    "val_loss",
    "val_top1",
    "val_top5",
    "ema_val_loss",
    "ema_top1",
    "ema_top5",
    "bad_files",
)


def reduce_sums(accelerator: Accelerator, values: Sequence[float]) -> list[float]:
    """Sum ``values`` over all processes (collective: every rank must call it)."""
    tensor = torch.tensor(list(values), dtype=torch.float64, device=accelerator.device)
    return accelerator.reduce(tensor, "sum").tolist()


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Write ``rows`` (one per epoch; missing values empty) atomically, floats to 6 significant digits."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _fmt(row.get(k)) for k in CSV_COLUMNS})
    _atomic_write(path, buffer.getvalue())


def read_csv(path: Path) -> list[dict[str, float | None]]:
    """Rows of a metrics CSV with numbers parsed (empty cells -> None)."""
    with open(path, newline="") as f:
        return [{k: (float(v) if v != "" else None) for k, v in row.items()} for row in csv.DictReader(f)]


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        f.write(text)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(f.name, 0o666 & ~umask)  # NamedTemporaryFile creates 0600; give the file normal permissions
    os.replace(f.name, path)
