"""Errors a training run reports to the user; each message names the problem and the fix."""

from __future__ import annotations

from vit5.errors import Vit5Error


class TrainConfigError(Vit5Error, ValueError):
    """A training setting is unknown, mistyped, out of range or points at a missing path."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the run stopped without saving the bad weights."""


class ResumeError(Vit5Error, RuntimeError):
    """``--resume`` cannot find a complete checkpoint to continue from."""
