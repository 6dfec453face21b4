"""``python -m eval``: a shim for ``vit5 eval`` (see ``vit5 eval --help``)."""
