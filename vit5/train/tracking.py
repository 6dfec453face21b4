"""Experiment trackers through Accelerate (``run.log_with``): TensorBoard, Weights & Biases, MLflow and
the others Accelerate integrates (huggingface.co/docs/accelerate/usage_guides/tracking).

``run.log_with=tensorboard`` (several: ``tensorboard,wandb``) is checked when the config is read: a
name Accelerate does not know is an error listing the names, and a tracker whose package is missing
is an error naming the ``pip install`` (Accelerate itself would drop it silently). The run then
logs, through ``accelerator.init_trackers`` / ``accelerator.log``:

* at the start, the full config as hyperparameters (``section.key``; lists and dicts as text);
* every ``run.log_every_steps`` optimizer steps, ``train/loss`` (the mean loss of those steps on the
  main process: per-step values are not reduced over processes, to add no collective to a step) and
  ``train/lr`` (the lr the last of them ran at; the largest of the groups'), at step = optimizer
  steps done;
* after every epoch, its row of ``metrics.csv`` as ``epoch/<column>`` (losses and accuracies over
  all processes, epoch, images per second ...), at the same step axis.

Local logs go under the run directory: ``RUN/logs/<run.tracker_project>/`` for TensorBoard
(``tensorboard --logdir runs`` shows every run), ``RUN/logs/`` as the W&B ``dir``. Where the
others store runs is their own setting (``MLFLOW_TRACKING_URI``, ``WANDB_MODE=offline``, ...). The
project is ``run.tracker_project`` and the run's name is the run directory's. A resumed run logs
into the same place from its step on; a forked run into its new directory.

At the end the trackers are finished (``tracker.finish()``); ``accelerator.end_training`` is not
called because it also destroys the process group, which the caller of a :class:`Trainer` owns.
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
# Accelerate's tracker name -> the package to install
PACKAGES = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "comet_ml": "comet-ml",
    "aim": "aim",
    "clearml": "clearml",
    "dvclive": "dvclive",
    "swanlab": "swanlab",
    "trackio": "trackio",
}


def tracker_names(log_with: str | None) -> list[str]:
    """``"tensorboard, wandb"`` -> ``["tensorboard", "wandb"]`` (None or empty: no trackers)."""
    return [name.strip() for name in (log_with or "").split(",") if name.strip()]


def check_trackers(log_with: str | None) -> list[str]:
    """The problems of ``run.log_with``: unknown names, trackers whose package is not installed."""
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
    """The trackers of one run (all no-ops without ``run.log_with``). Every method is called on every
    process; Accelerate writes on the main process only."""

    def __init__(self, accelerator: Accelerator, cfg: RunSection) -> None:
        self.accelerator = accelerator
        self.names = tracker_names(cfg.log_with)
        self.project = cfg.tracker_project
        self.every = cfg.log_every_steps
        self.started = False
        self._losses: list[float] = []

    @staticmethod
    def accelerator_kwargs(cfg: RunSection) -> dict[str, Any]:
        """``Accelerator(...)`` arguments: the trackers, and a logging directory that Accelerate requires
        up front for TensorBoard (the run directory is chosen later; :meth:`start` points it there)."""
        names = tracker_names(cfg.log_with)
        return dict(log_with=names, project_dir=cfg.output_dir) if names else {}

    def start(self, run_dir: Path, config: TrainConfig) -> None:
        """Start the trackers, logging into ``run_dir``, with ``config`` as the run's hyperparameters."""
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
        hparams = {k: _scalar(v) for k, v in flatten_config(config).items()}
        self.accelerator.init_trackers(self.project, config=hparams, init_kwargs=init_kwargs)
        self.started = True

    def step(self, num_updates: int, loss: float, lr: float) -> None:
        """After optimizer step ``num_updates`` (1-based): its mean micro-batch ``loss`` and its ``lr``."""
        if not self.started:
            return
        self._losses.append(loss)
        if num_updates % self.every == 0:
            mean = math.fsum(self._losses) / len(self._losses)
            self.accelerator.log({"train/loss": mean, "train/lr": lr}, step=num_updates)
            self._losses.clear()

    def epoch(self, row: dict[str, Any], num_updates: int) -> None:
        """The metrics row of an epoch (as in ``metrics.csv``), numbers only."""
        if not self.started:
            return
        values = {
            f"epoch/{k}": v
            for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None
        }
        self.accelerator.log(values, step=num_updates)

    def finish(self) -> None:
        """Close every tracker (flushes TensorBoard, ends the W&B / MLflow run)."""
        if not self.started:
            return
        for tracker in self.accelerator.trackers:
            tracker.finish()
        self.accelerator.trackers.clear()
        self.started = False


def _scalar(value: Any) -> bool | int | float | str:
    """A hyperparameter value trackers accept: scalars as they are, anything else as text."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
