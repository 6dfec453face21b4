"""``python -m viz``: a shim for ``vit5 viz`` (see ``vit5 viz --help``)."""
