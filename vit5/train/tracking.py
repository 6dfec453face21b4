"""Experiment trackers through Accelerate (``run.log_with``; huggingface.co/docs/accelerate/usage_guides/
tracking): the config as hyperparameters, ``train/loss`` and ``train/lr`` every ``run.log_every_steps``
optimizer steps, each epoch's metrics row as ``epoch/<column>``; logs under ``RUN/logs/``. Not
``accelerator.end_training``: it destroys the process group, which the Trainer's caller owns.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accelerate import Accelerator

    from vit5.train.config import RunSection, TrainConfig

LOGS = "logs"
PACKAGES = {"comet_ml": "comet-ml"}  # a tracker whose package is not named like it


def tracker_names(log_with: str | None) -> list[str]:
    return [name.strip() for name in (log_with or "").split(",") if name.strip()]


def check_trackers(log_with: str | None) -> list[str]:
    """The problems of ``run.log_with``: unknown names, trackers whose package is not installed (which
    Accelerate would drop silently)."""
    names = tracker_names(log_with)
    if not names:
        return []
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS, get_available_trackers

    known = sorted(LOGGER_TYPE_TO_CLASS)
    available = {str(t) for t in get_available_trackers()}
    problems = []
    for name in names:
        if name not in LOGGER_TYPE_TO_CLASS:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            problems.append(
                f"run.log_with: {name!r} is not an Accelerate tracker; {hint}trackers: {', '.join(known)}"
            )
        elif name not in available:
            package = PACKAGES.get(name, name)
            problems.append(
                f"run.log_with: the {name} tracker needs the {package} package, which is not installed: "
                f"pip install {package}"
            )
    return problems


class Tracking:
    """The trackers of one run (no-ops without ``run.log_with``); called on every process."""

    def __init__(self, accelerator: Accelerator, cfg: RunSection) -> None:
        self.accelerator = accelerator
        self.names = tracker_names(cfg.log_with)
        self.project = cfg.tracker_project
        self.every = cfg.log_every_steps
        self.started = False
        self._losses: list[float] = []

    @staticmethod
    def accelerator_kwargs(cfg: RunSection) -> dict[str, Any]:
        """``Accelerator(...)`` arguments: the trackers and the logging directory TensorBoard needs up front
        (:meth:`start` points it at the run directory)."""
        names = tracker_names(cfg.log_with)
        return dict(log_with=names, project_dir=cfg.output_dir) if names else {}

    def start(self, run_dir: Path, config: TrainConfig) -> None:
        if not self.names or self.started:
            return
        from vit5.train.config import flatten_config

        logs = run_dir / LOGS
        self.accelerator.project_configuration.logging_dir = str(logs)
        init_kwargs = {
            "wandb": {"name": run_dir.name, "dir": str(logs)},
            "mlflow": {"run_name": run_dir.name},
        }
        if self.accelerator.is_main_process:
            logs.mkdir(parents=True, exist_ok=True)
        hparams = {
            k: v if isinstance(v, (bool, int, float, str)) else str(v)
            for k, v in flatten_config(config).items()
        }
        self.accelerator.init_trackers(self.project, config=hparams, init_kwargs=init_kwargs)
        self.started = True

    def step(self, num_updates: int, loss: float, lr: float) -> None:
        if not self.started:
            return
        self._losses.append(loss)
        if num_updates % self.every == 0:
            mean = math.fsum(self._losses) / len(self._losses)
            self.accelerator.log({"train/loss": mean, "train/lr": lr}, step=num_updates)
            self._losses.clear()

    def epoch(self, row: dict[str, Any], num_updates: int) -> None:
        if not self.started:
            return
        values = {
            f"epoch/{k}": v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        self.accelerator.log(values, step=num_updates)

    def finish(self) -> None:
        if not self.started:
            return
        for tracker in self.accelerator.trackers:
            tracker.finish()
        self.accelerator.trackers.clear()
        self.started = False
