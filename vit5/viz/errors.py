"""The one exception type the visualisation module raises for bad input.

Every message names the problem and the fix; the ``viz`` command prints it without a traceback.
"""

from vit5.errors import Vit5Error


class VizError(Vit5Error, ValueError):
    """Bad input to the visualisation tools (model spec, images, layers, options)."""
