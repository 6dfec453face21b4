"""What a benchmark section hands to the report: tables, targets checked, figures, raw data.

Every section (and later the ablation runner) returns a :class:`Section`; the report renders
any number of them to Markdown and JSON without knowing what they measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from vit5.runtime import format_bytes


@dataclass(frozen=True)
class Target:
    """A claim from the issue, checked against a measured value."""

    name: str
    measured: float
    threshold: float
    higher_is_better: bool = True
    unit: str = "x"

    @property
    def met(self) -> bool:
        return self.measured >= self.threshold if self.higher_is_better else self.measured <= self.threshold

    @property
    def rule(self) -> str:
        return f"{'>=' if self.higher_is_better else '<='} {format_value(self.threshold, self.unit)}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "met": self.met, "rule": self.rule}


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"table {self.title!r}: row {row} does not match columns {self.columns}")

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "columns": list(self.columns), "rows": [list(r) for r in self.rows]}


@dataclass
class Section:
    """One benchmark's results: ``key`` is its ``--only`` name, ``what`` says what it measures."""

    key: str
    title: str
    what: str
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)  # paths relative to the output directory
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "what": self.what,
            "tables": [t.to_dict() for t in self.tables],
            "targets": [t.to_dict() for t in self.targets],
            "figures": self.figures,
            "notes": self.notes,
            "data": self.data,
            "seconds": self.seconds,
        }


def format_value(value: float, unit: str = "") -> str:
    """Human-readable number with its unit (``x`` ratios with 2 decimals, ``%`` with 1, bytes in MiB)."""
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{value:.1f}%"
    if unit == "B":
        return format_bytes(value)
    if abs(value) >= 100:
        return f"{value:,.0f}{unit and ' ' + unit}"
    return f"{value:.3g}{unit and ' ' + unit}"
