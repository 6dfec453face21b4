"""The run directory: where it goes, and the files every run leaves.

``RUN = run.output_dir / run.name`` holds ``config.yaml`` (the full config as run),
``checkpoints/`` (resumable state), ``best/`` and ``final/`` (model directories), ``metrics.csv``,
``curves.png`` and ``summary.{txt,json}``. A new run never writes into an existing, non-empty
directory: it takes the next free ``NAME-2``, ``NAME-3``, ...
"""

from __future__ import annotations

from pathlib import Path

from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from vit5.train.config import TrainConfig
from vit5.train.config_load import config_to_yaml

CONFIG_FILE = "config.yaml"
CHECKPOINTS = "checkpoints"
BEST = "best"
FINAL = "final"
METRICS_CSV = "metrics.csv"
CURVES_PNG = "curves.png"
SUMMARY_TXT = "summary.txt"
SUMMARY_JSON = "summary.json"


def free_run_dir(output_dir: Path, name: str) -> Path:
    """``output_dir/name``, or the first ``name-K`` (K = 2, 3, ...) that is absent or empty."""
    candidate, k = output_dir / name, 2
    while candidate.exists() and any(candidate.iterdir()):
        candidate, k = output_dir / f"{name}-{k}", k + 1
    return candidate


def create_run_dir(accelerator: Accelerator, cfg: TrainConfig) -> Path:
    """Choose and create a fresh run directory on the main process; every process gets its path."""
    chosen: list[str | None] = [None]
    if accelerator.is_main_process:
        path = free_run_dir(Path(cfg.run.output_dir).expanduser(), cfg.run.name)
        path.mkdir(parents=True, exist_ok=True)
        chosen = [str(path)]
    if accelerator.num_processes > 1:
        broadcast_object_list(chosen, from_process=0)
    return Path(str(chosen[0]))


def write_config(run_dir: Path, cfg: TrainConfig) -> Path:
    path = run_dir / CONFIG_FILE
    path.write_text(config_to_yaml(cfg))
    return path
