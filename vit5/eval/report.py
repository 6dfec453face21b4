"""Plain-text tables and JSON files for evaluation results (atomic writes, NaN written as null)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vit5.files import atomic_write_json


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> str:
    """A fixed-width table; floats with 4 significant decimals, None/NaN as '-'."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]

    def line(values: Sequence[Any]) -> str:
        return "  ".join(
            str(v).rjust(w) if i else str(v).ljust(w) for i, (v, w) in enumerate(zip(values, widths))
        )

    out = [title] if title else []
    out += [line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in cells)]
    return "\n".join(out)


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, (float, np.floating)):
        return f"{value:.4f}"
    return str(value)


def to_jsonable(obj: Any) -> Any:
    """Numpy arrays/scalars, tuples and paths to JSON types; NaN/inf to None."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return obj


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented JSON, atomically (a crash never leaves half a file)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_json(path, to_jsonable(obj))
