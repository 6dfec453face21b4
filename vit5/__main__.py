"""``python -m vit5 ...``: the same as the installed ``vit5`` command (see :mod:`vit5.cli`)."""

from vit5.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
