"""Benchmarks, every contender measured side by side in one process: ``vit5 bench`` (speed against timm
and the official code, attention memory, compilation, export, depth; sections in :data:`SECTIONS`),
``vit5 ablate`` (:mod:`vit5.bench.ablate`) and ``vit5 bench data-pipeline`` (:mod:`vit5.bench.data_pipeline`).

    from vit5.bench import BenchConfig, run_bench
    sections, report = run_bench(BenchConfig.profile("quick"), Path("runs/bench_quick"))
"""

from vit5.bench.config import BenchConfig
from vit5.bench.measure import TimingConfig, measure, measure_memory, paired_ratio, speedup
from vit5.bench.report import Section, Table, Target
from vit5.bench.runner import SECTIONS, run_bench

__all__ = [
    "SECTIONS",
    "BenchConfig",
    "Section",
    "Table",
    "Target",
    "TimingConfig",
    "measure",
    "measure_memory",
]
__all__ += ["paired_ratio", "run_bench", "speedup"]
