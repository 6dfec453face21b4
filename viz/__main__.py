"""``python -m viz COMMAND ...``: the same as ``vit5 viz`` (:mod:`vit5.cli.viz`)."""

import sys

from vit5.cli import main

if __name__ == "__main__":
    sys.exit(main(["viz", *sys.argv[1:]]))
