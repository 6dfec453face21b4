"""Errors a training run reports to the user; each message names the problem and the fix."""

from __future__ import annotations

from vit5.errors import Vit5Error


class TrainConfigError(Vit5Error, ValueError):
    """A training setting is unknown, mistyped, out of range or points at a missing path."""


class TrainingDiverged(RuntimeError):
    """A loss or a weight became NaN or infinite; nothing was saved from it (exit :data:`EXIT_DIVERGED`)."""


class TrainingInterrupted(Exception):
    """A stop signal ended the run after a checkpoint; ``vit5 train`` exits with 128 + the signal number."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


# bad input, a damaged checkpoint, a full or read-only disk (one ``error:`` line)
EXIT_USER_ERROR = 2
EXIT_DIVERGED = 3  # TrainingDiverged


class ResumeError(Vit5Error, RuntimeError):
    """``--resume`` cannot find a complete checkpoint to continue from."""
