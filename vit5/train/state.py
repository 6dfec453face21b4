"""The progress of a run, checkpointed with the Accelerate state so ``--resume`` continues exactly."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainState:
    """Where the run is: ``epoch`` (0-based, in progress), ``batch`` (micro-batches of it already
    trained, always a multiple of the accumulation steps), ``num_updates`` (optimizer steps so far),
    the best raw val top-1 and its epoch, time and images spent, and the per-epoch metric rows."""

    epoch: int = 0
    batch: int = 0
    num_updates: int = 0
    best_top1: float = -1.0
    best_epoch: int = -1
    train_seconds: float = 0.0
    wall_seconds: float = 0.0
    images_seen: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)
