"""Benchmarks: speed against timm and the official code, attention memory, compilation, export
(``vit5 bench``), the component ablations (``vit5 ablate``) and the data pipeline, every contender
measured side by side in one process.

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
    "paired_ratio",
    "run_bench",
    "speedup",
]
