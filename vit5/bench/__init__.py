"""Benchmarks: speed and memory against timm and the official code, and each modern component
measured, side by side in one process. Run ``vit5 bench --help``.

    from vit5.bench import BenchConfig, run_bench
    sections, report = run_bench(BenchConfig.profile("quick"), Path("runs/bench_quick"))
"""

from vit5.bench.config import BenchConfig, DepthAblationConfig
from vit5.bench.measure import (
    MemoryReading,
    Samples,
    TimingConfig,
    measure,
    measure_memory,
    paired_ratio,
    speedup,
)
from vit5.bench.report import Section, Table, Target
from vit5.bench.runner import SECTIONS, run_bench

__all__ = [
    "SECTIONS",
    "BenchConfig",
    "DepthAblationConfig",
    "MemoryReading",
    "Samples",
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
