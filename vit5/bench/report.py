"""The report of any list of :class:`Section` (tables, targets met or missed, notes, figures, raw data):
``report.md`` and ``report.json``, under where and how the run happened."""

from __future__ import annotations

import difflib
import os
import platform
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import timm
import torch

from vit5.errors import InputError
from vit5.files import atomic_write_text
from vit5.outputs import write_json


def choose(kind: str, names: Iterable[str] | None, valid: Iterable[str]) -> list[str]:
    """``names`` (all when none) in ``valid``'s order; unknown names raise InputError with the closest."""
    valid = list(valid)
    unknown = [name for name in names or () if name not in valid]
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, valid, n=1)
            hints.append(f"{name!r}" + "".join(f" (did you mean {c!r}?)" for c in close))
        listed = ", ".join(hints)
        raise InputError(f"unknown {kind} {listed}: choose from {', '.join(valid)}")
    return [name for name in valid if not names or name in names]


@dataclass(frozen=True)
class Target:
    """A claim (a speed, memory or parity target), checked against a measured value."""

    name: str
    measured: float
    threshold: float
    higher_is_better: bool = True
    unit: str = "x"

    @property
    def met(self) -> bool:
        if self.higher_is_better:
            return self.measured >= self.threshold
        return self.measured <= self.threshold

    @property
    def rule(self) -> str:
        sign = ">=" if self.higher_is_better else "<="
        return f"{sign} {format_value(self.threshold, self.unit)}"


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    def __post_init__(self) -> None:
        if bad := [row for row in self.rows if len(row) != len(self.columns)]:
            raise ValueError(
                f"table {self.title!r}: row {bad[0]} does not match columns {self.columns}",
            )


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


def format_value(value: float, unit: str = "") -> str:
    """``x`` ratios with 2 decimals, ``%`` with 1, others 3 digits and the unit."""
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{value:.1f}%"
    return f"{value:.3g}{unit and ' ' + unit}"


NOISE_NOTE = (
    "Times are wall-clock on the machine above. On a shared machine absolute numbers move "
    "by tens of percent from run to run; contenders are timed side by side (interleaved rounds) "
    "and compared by paired ratios: read a ratio within a few percent of a threshold as a tie."
)


def markdown_table(table: Table) -> str:
    def line(cells: Sequence[Any]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    return "\n".join([f"**{table.title}**", "", line(table.columns), rule, *map(line, table.rows)])


def render_markdown(
    sections: Sequence[Section], env: Mapping[str, Any], title: str = "vit5 benchmark"
) -> str:
    targets = [(s.key, t) for s in sections for t in s.targets]
    parts = [f"# {title}", "", *(f"- {k}: {v}" for k, v in env.items()), "", NOISE_NOTE]
    if targets:
        rows = tuple(
            (
                key,
                t.name,
                format_value(t.measured, t.unit),
                t.rule,
                "met" if t.met else "**MISSED**",
            )
            for key, t in targets
        )
        table = Table("Targets", ("section", "target", "measured", "needed", "result"), rows)
        parts += ["", f"## Targets: {sum(t.met for _, t in targets)} of {len(targets)} met", ""]
        parts.append(markdown_table(table))
    for s in sections:
        parts += ["", f"## {s.title}", "", f"*{s.what}* ({s.seconds:.0f} s)"]
        parts += [part for table in s.tables for part in ("", markdown_table(table))]
        parts += ([""] if s.notes else []) + [f"- {note}" for note in s.notes]
        parts += ([""] if s.figures else []) + [f"![{Path(fig).stem}]({fig})" for fig in s.figures]
    return "\n".join(parts) + "\n"


def write_report(
    sections: Sequence[Section],
    out_dir: Path,
    env: Mapping[str, Any],
    title: str = "vit5 benchmark",
) -> Path:
    """Write ``report.md`` and ``report.json`` under ``out_dir``; returns the Markdown path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "report.md", render_markdown(sections, env, title))
    targets = [t for s in sections for t in s.targets]
    payload = dict(
        environment=dict(env),
        targets_met=sum(t.met for t in targets),
        targets_total=len(targets),
    )
    payload["sections"] = [
        {**asdict(s), "targets": [{**asdict(t), "met": t.met, "rule": t.rule} for t in s.targets]}
        for s in sections
    ]
    write_json(out_dir / "report.json", payload)
    return out_dir / "report.md"


def environment(device: str = "cpu", dtype: str = "fp32") -> dict[str, Any]:
    """Versions, hardware, threads and the machine's load (a busy machine makes absolute times unreliable)."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    names = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    cpu = names[0] if names else platform.processor() or "unknown"
    env: dict[str, Any] = dict(
        python=sys.version.split()[0],
        torch=torch.__version__,
        timm=timm.__version__,
        platform=platform.platform(),
        cpu=cpu,
        cpu_count=os.cpu_count(),
        torch_threads=torch.get_num_threads(),
        device=device,
        dtype=dtype,
    )
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return {**env, "load_average": load_average()}


def load_average() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
