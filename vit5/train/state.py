"""The progress of a run, saved in every training checkpoint (as JSON) so ``--resume`` continues exactly."""

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

    def load_state_dict(self, state: Any) -> None:
        """Restore from :meth:`state_dict` output (e.g. read back from JSON).

        Raises:
            ValueError: not a mapping of exactly these fields with values of their types.
        """
        fields = {f.name: f for f in dataclasses.fields(self)}
        if not isinstance(state, dict) or set(state) != set(fields):
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"expected the fields {sorted(fields)}, got {got}")
        for name, value in state.items():
            kind = {"int": int, "float": (int, float), "list[dict[str, Any]]": list}[str(fields[name].type)]
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"{name}={value!r} is not of type {fields[name].type}")
            if name == "history" and not all(isinstance(row, dict) for row in value):
                raise ValueError("history must be a list of metric rows")
        for name, value in state.items():
            setattr(self, name, value)
