"""The one way a tool writes its results: JSON, CSV and text tables, each written whole or not at all
(atomically, through :mod:`vit5.files`). One float format per kind of file: JSON keeps every digit
(NaN and infinities become ``null``, which every JSON reader accepts), CSV cells carry 6 significant
digits, text tables 4 decimals. Imports only the standard library and :mod:`vit5.files`."""

from __future__ import annotations

import csv
import io
import json
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vit5.files import atomic_write_text

CSV_FLOAT = "{:.6g}"  # a CSV cell: 6 significant digits (the JSON beside it keeps every digit)
TABLE_FLOAT = "{:.4f}"  # a text-table cell: 4 decimals
MISSING = "-"  # a text-table cell without a value (None or NaN)


def to_jsonable(obj: Any) -> Any:
    """Arrays and their scalars (numpy, torch: anything with ``tolist``), tuples and paths to JSON
    types; NaN and infinities to None; dictionary keys to strings."""
    if hasattr(obj, "tolist"):
        obj = obj.tolist()  # nested lists of Python scalars, or one scalar
    if isinstance(obj, Mapping):
        return {str(key): to_jsonable(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(value) for value in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return obj


def write_json(path: str | os.PathLike[str], obj: Any, durable: bool = True) -> Path:
    """``obj`` (through :func:`to_jsonable`) as JSON indented by 2, written atomically; the folder is
    created. ``durable=False`` skips the fsync (a file rewritten often, such as a marker)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(to_jsonable(obj), indent=2) + "\n"
    return atomic_write_text(path, text, durable)


def csv_cell(value: Any) -> str:
    """A CSV cell: empty for None, :data:`CSV_FLOAT` for floats, ``str`` for the rest."""
    if value is None:
        return ""
    if _is_float(value):
        return CSV_FLOAT.format(value)
    return str(value)


def write_csv(
    path: str | os.PathLike[str],
    rows: Iterable[Mapping[str, Any]],
    columns: Sequence[str] | None = None,
    durable: bool = True,
) -> Path:
    """One row per mapping, written atomically (the folder is created). ``columns``: the header and
    its order; keys outside it are left out. Without it, every key in order of first appearance. A
    missing value is an empty cell; floats as :func:`csv_cell`."""
    rows = list(rows)
    if columns is None:
        columns = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([csv_cell(row.get(key)) for key in columns])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, buffer.getvalue(), durable)


def read_csv(path: str | os.PathLike[str]) -> list[dict[str, float | str | None]]:
    """The rows of a CSV file as :func:`write_csv` writes them: an empty cell is None, a number a
    float, any other cell its text."""
    with open(path, newline="") as f:
        return [{key: _parsed(text) for key, text in row.items()} for row in csv.DictReader(f)]


def _parsed(text: str) -> float | str | None:
    if text == "":
        return None
    try:
        return float(text)
    except ValueError:
        return text


def format_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    title: str | None = None,
    header_rule: bool = True,
    label_column: bool = True,
) -> str:
    """A fixed-width text table, columns right-aligned; floats with 4 decimals, None and NaN as ``-``.
    ``header_rule``: a line of dashes under the headers; ``label_column``: the first column (row
    labels) left-aligned. The metric tables of ``vit5 viz`` turn both off."""
    cells = [[str(h) for h in headers]]
    cells += [[table_cell(value) for value in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    if header_rule:
        cells.insert(1, ["-" * width for width in widths])
    lines = [_table_line(row, widths, label_column) for row in cells]
    if title:
        lines.insert(0, title)
    return "\n".join(lines)


def _table_line(row: Sequence[str], widths: Sequence[int], label_column: bool) -> str:
    aligned = [text.rjust(width) for text, width in zip(row, widths)]
    if label_column:
        aligned[0] = row[0].ljust(widths[0])
    return "  ".join(aligned)


def table_cell(value: Any) -> str:
    """A text-table cell: ``-`` for None and NaN, :data:`TABLE_FLOAT` for floats, ``str`` otherwise."""
    if value is None or (_is_float(value) and math.isnan(value)):
        return MISSING
    return TABLE_FLOAT.format(value) if _is_float(value) else str(value)


def _is_float(value: Any) -> bool:
    """Python and numpy floats (numbers.Real registers both), not integers or booleans."""
    return isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)
