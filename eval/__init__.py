"""``python -m eval``: classification metrics, resolution sweeps, dense features and probes (see
``--help``)."""
