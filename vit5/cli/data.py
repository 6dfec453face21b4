"""``vit5 data``: data sets written as ImageFolder trees (``vit5 data digits ROOT``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from vit5.cli import Parser, run_command


def build_parser(prog: str = "vit5 data") -> argparse.ArgumentParser:
    parser = Parser(prog=prog, description=__doc__.split("\n")[0].strip("`"))
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    digits = commands.add_parser(
        "digits", help="scikit-learn's digits as ROOT/{train,val}/<digit>/*.png (idempotent)"
    )
    digits.add_argument("root", help="output folder")
    digits.add_argument("--size", type=int, default=32, help="image side in pixels (default 32)")
    digits.add_argument("--val-fraction", type=float, default=0.2, help="val share (default 0.2)")
    digits.add_argument("--seed", type=int, default=0, help="split seed (default 0)")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "vit5 data") -> int:
    args = build_parser(prog).parse_args(argv)

    def work() -> None:
        if args.command == "digits":
            from vit5.data.digits.export import export_digits_imagefolder

            print(
                export_digits_imagefolder(
                    args.root, size=args.size, val_fraction=args.val_fraction, seed=args.seed
                )
            )

    return run_command(work)
