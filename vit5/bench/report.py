"""The benchmark report: ``report.md`` (numbers, plots, every target met or missed) and ``report.json``.

The report knows nothing about what a section measured; it renders any list of
:class:`~vit5.bench.report.Section`, so a later section (the ablation runner's table) is one
more list entry.

Also here:

* what a benchmark section hands to the report: tables, targets checked, figures, raw data.
* the report's figures: grouped bars and lines, written as PNG with matplotlib (no display).
* where and how a benchmark ran: versions, hardware, threads and the machine's load.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import timm
import torch
from matplotlib.figure import Figure  # not pyplot: importing vit5.bench leaves the user's backend alone

from vit5.bench.config import BenchConfig
from vit5.files import atomic_write_text
from vit5.runtime import format_bytes


# ----------------------------------------------------------------------------------------- results
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


# ------------------------------------------------------------------------------------------ report
NOISE_NOTE = (
    "Times are wall-clock on the machine described above. On a shared or busy machine absolute "
    "numbers move by tens of percent from run to run; contenders are therefore timed side by side "
    "(interleaved rounds) and compared by paired ratios, which are much steadier, but still only "
    "as good as the rounds they come from: read a ratio within a few percent of a threshold as a tie."
)


def busy_warning(env: dict[str, Any]) -> str | None:
    """A warning when other work competed for the CPUs (load average above the core count)."""
    loads = [env.get("load_average"), env.get("load_average_after")]
    peak = max((load[0] for load in loads if load), default=0.0)
    cores = env.get("cpu_count") or 0
    if cores and peak > cores:
        return (
            f"The machine was busy (load average up to {peak:.1f} on {cores} cores): other processes "
            "took CPU time, and multi-threaded ops stall whenever one of their threads is descheduled, "
            "which penalises models with many small ops. Rerun on an idle machine, or with --threads 1."
        )
    return None


def markdown_table(table: Table) -> str:
    def line(cells: Sequence[Any]) -> str:
        return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"

    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    lines = [f"**{table.title}**", "", line(table.columns), rule]
    return "\n".join(lines + [line(row) for row in table.rows])


def target_rows(sections: Sequence[Section]) -> list[tuple[str, Target]]:
    return [(s.key, t) for s in sections for t in s.targets]


def targets_table(sections: Sequence[Section]) -> Table:
    rows = tuple(
        (key, t.name, format_value(t.measured, t.unit), t.rule, "met" if t.met else "**MISSED**")
        for key, t in target_rows(sections)
    )
    return Table("Targets", ("section", "target", "measured", "needed", "result"), rows)


def render_markdown(
    sections: Sequence[Section], env: dict[str, Any], title: str = "vit5 benchmark report"
) -> str:
    parts = [f"# {title}", ""]
    parts += [f"- {key}: {value}" for key, value in env.items()]
    parts += ["", NOISE_NOTE, ""]
    busy = busy_warning(env)
    if busy:
        parts += [f"**{busy}**", ""]
    checked = target_rows(sections)
    met = sum(t.met for _, t in checked)
    parts += [f"## Targets: {met} of {len(checked)} met", "", markdown_table(targets_table(sections)), ""]
    for section in sections:
        parts += [f"## {section.title}", "", f"*{section.what}* ({section.seconds:.0f} s)", ""]
        for table in section.tables:
            parts += [markdown_table(table), ""]
        parts += [f"- {note}" for note in section.notes]
        if section.notes:
            parts.append("")
        parts += [f"![{Path(fig).stem}]({fig})" for fig in section.figures]
        if section.figures:
            parts.append("")
    return "\n".join(parts)


def write_report(sections: Sequence[Section], out_dir: Path, env: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``report.md`` and ``report.json`` under ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, json_path = out_dir / "report.md", out_dir / "report.json"
    atomic_write_text(md_path, render_markdown(sections, env))
    checked = target_rows(sections)
    payload = {
        "environment": env,
        "targets_met": sum(t.met for _, t in checked),
        "targets_total": len(checked),
        "sections": [s.to_dict() for s in sections],
    }
    atomic_write_text(json_path, json.dumps(payload, indent=1, default=_jsonable))
    return md_path, json_path


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, tuple)):
        return list(value)
    if hasattr(value, "item"):
        return value.item()
    return str(value)


# ------------------------------------------------------------------------------------------- plots
def bar_chart(
    path: Path,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    errors: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    title: str = "",
    ylabel: str = "",
    reference_line: float | None = None,
) -> Path:
    """Bars for each group (x) and series (colour); ``errors`` are (low, high) per bar (e.g. IQR)."""
    fig = Figure(figsize=(max(5.0, 1.3 * len(groups) * max(1, len(series)) / 2), 3.6))
    ax = fig.subplots()
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        yerr = None
        if errors and name in errors:
            pairs = list(zip(values, errors[name]))
            yerr = [[max(0.0, v - lo) for v, (lo, _) in pairs], [max(0.0, hi - v) for v, (_, hi) in pairs]]
        ax.bar(xs, values, width, label=name, yerr=yerr, capsize=3)
    if reference_line is not None:
        ax.axhline(reference_line, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) > 1:
        ax.legend(fontsize=8)
    return _save(fig, path)


def line_chart(
    path: Path,
    x: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    logx: bool = False,
    logy: bool = False,
) -> Path:
    """One line per series over ``x``; ``None`` values (not measured) are left out."""
    fig = Figure(figsize=(5.5, 3.6))
    ax = fig.subplots()
    for name, ys in series.items():
        points = [(a, b) for a, b in zip(x, ys) if b is not None]
        if points:
            ax.plot(*zip(*points), marker="o", markersize=3, label=name)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


# ------------------------------------------------------------------------------------- environment
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (a busy machine makes absolute times unreliable)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def environment(cfg: BenchConfig) -> dict[str, object]:
    env: dict[str, object] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "timm": timm.__version__,
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": cfg.device,
        "dtype": cfg.dtype,
        "load_average": load_average(),
    }
    if torch.device(cfg.device).type == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(torch.device(cfg.device))
    return env
