"""``vit5 data``: data sets written as ImageFolder trees (``vit5 data digits ROOT``,
``vit5 data fashion-mnist OUT [--source DIR]``) or as WebDataset shards (``vit5 data shards SRC OUT
--shard-size N``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from vit5.cli import Parser, run_command

FASHION_VAL_SIZE = 5000  # vit5.data.fashion_mnist.DEFAULT_VAL_SIZE, stated here so --help stays light
FASHION_INSTALL = "apt-get install dataset-fashion-mnist"


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
    fashion = commands.add_parser(
        "fashion-mnist",
        help="Fashion-MNIST as OUT/{train,val,test}/<class>/<index>.png (idempotent, resumable)",
        description="Fashion-MNIST (arXiv 1708.07747) as OUT/{train,val,test}/<class>/<index>.png: val a "
        "seeded, class-stratified hold-out of the 60,000 training images, test the 10,000 test images. "
        f"Source: --source, else the Debian package (`{FASHION_INSTALL}`), else torchvision's download.",
    )
    fashion.add_argument("out", type=Path, help="output folder")
    fashion.add_argument("--source", type=Path, default=None, help="folder holding the four IDX files")
    fashion.add_argument(
        "--val-size", type=int, default=FASHION_VAL_SIZE, help=f"val images (default {FASHION_VAL_SIZE})"
    )
    fashion.add_argument("--seed", type=int, default=0, help="split seed (default 0)")
    shards = commands.add_parser(
        "shards",
        help="an ImageFolder split (SRC/<class>/<image>) as WebDataset shards OUT/<split>-NNNNNN.tar with "
        "classes.txt and _info.json (resumable: rerun after a kill)",
    )
    shards.add_argument("src", help="the split folder holding one folder per class")
    shards.add_argument("out", help="output folder (shards of several splits may share it)")
    shards.add_argument("--shard-size", type=int, default=1000, help="samples per shard (default 1000)")
    shards.add_argument("--split", default=None, help="split name and shard prefix (default: SRC's name)")
    shards.add_argument("--seed", type=int, default=0, help="seed of the sample order (default 0)")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "vit5 data") -> int:
    args = build_parser(prog).parse_args(argv)

    def work() -> None:
        if args.command == "shards":
            from vit5.data.shards import write_shards

            print(write_shards(args.src, args.out, args.shard_size, split=args.split, seed=args.seed))
        elif args.command == "digits":
            from vit5.data.digits import export_digits_imagefolder

            print(export_digits_imagefolder(args.root, args.size, args.val_fraction, args.seed))
        else:
            from vit5.data.fashion_mnist import export_fashion_mnist

            print(export_fashion_mnist(args.out, args.source, val_size=args.val_size, seed=args.seed))

    return run_command(work)
