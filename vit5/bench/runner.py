"""Run the chosen benchmark sections in one process and write the report."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm import tqdm

from vit5.bench.components import run_attention_memory, run_kv_cache, run_mlp, run_norms
from vit5.bench.config import BenchConfig, BenchContext
from vit5.bench.depth import run as run_depth
from vit5.bench.measure import num_threads
from vit5.bench.report import Section, environment, load_average, write_report
from vit5.bench.speed import run_compile, run_export, run_mfu, run_modern_cost, run_speed
from vit5.errors import InputError

# name -> section, in report order
SECTIONS: dict[str, Callable[[BenchContext], Section]] = {
    "speed": run_speed,
    "modern_cost": run_modern_cost,
    "mfu": run_mfu,
    "attention_memory": run_attention_memory,
    "compile": run_compile,
    "kv_cache": run_kv_cache,
    "norms": run_norms,
    "mlp": run_mlp,
    "depth": run_depth,
    "export": run_export,
}


def select_sections(only: Sequence[str] | None) -> list[str]:
    """The section names to run, in report order; unknown names raise with the valid list."""
    if not only:
        return list(SECTIONS)
    unknown = [name for name in only if name not in SECTIONS]
    if unknown:
        raise InputError(
            f"unknown benchmark section(s) {', '.join(unknown)}: choose from {', '.join(SECTIONS)}"
        )
    return [name for name in SECTIONS if name in only]


def _failed(key: str, error: BaseException) -> Section:
    detail = "".join(traceback.format_exception_only(type(error), error)).strip()
    what = "This section raised an error; nothing was measured."
    return Section(key, f"{key} (FAILED)", what, notes=[detail])


def run_bench(
    cfg: BenchConfig, out_dir: Path, only: Sequence[str] | None = None, show_progress: bool = True
) -> tuple[list[Section], Path]:
    """Run the sections (all, or ``only``), write ``report.md``/``report.json``; return them and the
    Markdown path. A section that fails is reported as failed and the others still run."""
    keys = select_sections(only)
    out_dir = Path(out_dir)
    bar = tqdm(keys, desc="benchmark", unit="section", disable=not show_progress)
    ctx = BenchContext(cfg, out_dir, log=lambda msg: bar.write(f"  {msg}") if show_progress else None)
    sections = []
    with num_threads(cfg.threads):
        env = environment(cfg)
        for key in bar:
            bar.set_postfix_str(key)
            start = time.perf_counter()
            try:
                section = SECTIONS[key](ctx)
            except Exception as error:  # noqa: BLE001 - one broken section must not lose the others
                section = _failed(key, error)
                bar.write(f"  {key} failed: {error}")
            section.seconds = time.perf_counter() - start
            sections.append(section)
            md_path, _ = write_report(sections, out_dir, env)  # a partial report survives an interrupted run
        env["load_average_after"] = load_average()
    md_path, _ = write_report(sections, out_dir, env)
    return sections, md_path
