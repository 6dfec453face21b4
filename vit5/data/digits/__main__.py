"""Command line: ``python -m vit5.data.digits export ROOT [--size N] [--val-fraction F] [--seed S]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from vit5.data.digits.export import export_digits_imagefolder


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vit5.data.digits", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="write ROOT/{train,val}/<digit>/*.png (idempotent)")
    export.add_argument("root", help="output folder")
    export.add_argument("--size", type=int, default=32, help="image side in pixels (default 32)")
    export.add_argument("--val-fraction", type=float, default=0.2, help="val share (default 0.2)")
    export.add_argument("--seed", type=int, default=0, help="split seed (default 0)")
    args = parser.parse_args(argv)
    try:
        report = export_digits_imagefolder(
            args.root, size=args.size, val_fraction=args.val_fraction, seed=args.seed
        )
    except (ValueError, FileExistsError) as e:
        parser.exit(2, f"error: {e}\n")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
