"""Errors a training run reports to the user; each message names the problem and the fix."""

from __future__ import annotations


class TrainConfigError(ValueError):
    """A training setting is unknown, mistyped, out of range or points at a missing path."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the run stopped without saving the bad weights."""


class ResumeError(RuntimeError):
    """``--resume`` cannot find a complete checkpoint to continue from."""
