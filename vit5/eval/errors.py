"""The one exception type of :mod:`vit5.eval`: bad input whose message names the problem and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vit5.errors import Vit5Error


class EvalError(Vit5Error, ValueError):
    """Evaluation input that cannot work (wrong layout, mismatched mask, unknown model, ...).

    The command line prints the message as one ``error:`` line instead of a traceback.
    """


def read_json(path: Path) -> Any:
    """A JSON file this package wrote or reads (manifest, dataset.json); a broken one is an EvalError."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise EvalError(f"{path} is not readable JSON ({err}): fix or delete it") from err
