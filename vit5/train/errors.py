"""Errors a training run reports to the user; each message names the problem and the fix."""

from __future__ import annotations

from vit5.errors import Vit5Error


class TrainConfigError(Vit5Error, ValueError):
    """A training setting is unknown, mistyped, out of range or points at a missing path."""


class TrainingDiverged(RuntimeError):
    """A training loss, a validation loss or a weight became NaN or infinite; the run stopped without
    saving the bad weights (``vit5 train`` exits with :data:`EXIT_DIVERGED`)."""


class TrainingInterrupted(Exception):
    """SIGTERM, SIGINT or SIGUSR1 stopped the run after a checkpoint at the exact position reached;
    ``vit5 train`` exits with ``exit_code`` = 128 + the signal number (143, 130, 138)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


EXIT_USER_ERROR = 2  # bad input, a damaged checkpoint, a full or read-only disk (one ``error:`` line)
EXIT_DIVERGED = 3  # TrainingDiverged


class ResumeError(Vit5Error, RuntimeError):
    """``--resume`` cannot find a complete checkpoint to continue from."""
