"""``python -m eval COMMAND ...``: the same as ``vit5 eval`` (:mod:`vit5.cli.eval`)."""

import sys

from vit5.cli import main

if __name__ == "__main__":
    sys.exit(main(["eval", *sys.argv[1:]]))
