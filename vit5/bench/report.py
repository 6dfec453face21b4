"""The benchmark report: ``report.md`` (numbers, plots, every target met or missed) and ``report.json``.

The report knows nothing about what a section measured; it renders any list of
:class:`~vit5.bench.results.Section`, so a later section (the ablation runner's table) is one
more list entry.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vit5.bench.results import Section, Table, Target, format_value
from vit5.files import atomic_write_text

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
