"""The one exception type of :mod:`vit5.eval`: bad input whose message names the problem and the fix."""

from __future__ import annotations


class EvalError(ValueError):
    """Evaluation input that cannot work (wrong layout, mismatched mask, unknown model, ...).

    The command line prints the message as one ``error:`` line instead of a traceback.
    """
