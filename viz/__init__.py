"""``python -m viz``: attention maps, token norms and register metrics (see ``python -m viz --help``)."""
