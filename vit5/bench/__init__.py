"""Benchmarks, every contender measured side by side in one process: ``vit5 bench`` (the sections of
:data:`SECTIONS`, run by :func:`run_bench`), ``vit5 ablate`` (:mod:`vit5.bench.ablate`) and
``vit5 bench data-pipeline`` (:mod:`vit5.bench.data_pipeline`)."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm import tqdm

from vit5.bench import depth, recording
from vit5.bench.data_pipeline import run_data_index
from vit5.bench.measure import BenchConfig, BenchContext, num_threads
from vit5.bench.report import (
    Section,
    Table,
    Target,
    choose,
    environment,
    load_average,
    write_report,
)
from vit5.bench.speed import run_compile, run_export, run_memory, run_speed

__all__ = ["SECTIONS", "BenchConfig", "BenchContext", "Section", "Table", "Target", "run_bench"]
__all__ += ["select_sections"]

# name -> section (a function of a BenchContext returning a Section), in report order
SECTIONS: dict[str, Callable[[BenchContext], Section]] = {
    "speed": run_speed,
    "memory": run_memory,
    "compile": run_compile,
    "export": run_export,
    "depth": depth.run,
    "data_index": run_data_index,
    "recording": recording.run,
}


def select_sections(only: Sequence[str] | None) -> list[str]:
    """The section names to run, in report order; unknown names raise InputError with the valid list."""
    return choose("benchmark section", only, SECTIONS)


def run_bench(
    cfg: BenchConfig, out_dir: Path, only: Sequence[str] | None = None, show_progress: bool = True
) -> tuple[list[Section], Path]:
    """Run the sections (all, or ``only``), write ``report.md`` / ``report.json``; return them and the
    Markdown path. A section that fails is reported as failed and the others still run."""
    out_dir = Path(out_dir)
    bar = tqdm(select_sections(only), desc="benchmark", unit="section", disable=not show_progress)

    def log(message: str) -> None:
        if show_progress:
            bar.write(f"  {message}")

    ctx = BenchContext(cfg, out_dir, log=log)
    sections: list[Section] = []
    with num_threads(cfg.threads):
        env = environment(cfg.device, cfg.dtype)
        for key in bar:
            bar.set_postfix_str(key)
            start = time.perf_counter()
            try:
                section = SECTIONS[key](ctx)
            # one broken section must not lose the others
            except Exception as error:  # noqa: BLE001
                detail = "".join(traceback.format_exception_only(type(error), error)).strip()
                section = Section(
                    key=key,
                    title=f"{key} (FAILED)",
                    what="This section raised an error.",
                    notes=[detail],
                )
                bar.write(f"  {key} failed: {error}")
            section.seconds = time.perf_counter() - start
            sections.append(section)
            # a partial report survives an interrupted run
            write_report(sections, out_dir, env)
        env["load_average_after"] = load_average()
    return sections, write_report(sections, out_dir, env)
