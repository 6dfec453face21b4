"""``vit5 data``: data sets written as ImageFolder trees (``vit5 data digits ROOT``,
``vit5 data fashion-mnist OUT [--source DIR]``) or as WebDataset shards (``vit5 data shards SRC OUT
--shard-size N``)."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from pathlib import Path

from vit5.cli import Parser, from_options, opt, run_main

FASHION_VAL_SIZE = (
    5000  # vit5.data.fashion_mnist.DEFAULT_VAL_SIZE, stated here so --help stays light
)
FASHION_INSTALL = "apt-get install dataset-fashion-mnist"


def main(argv: Sequence[str] | None = None, prog: str = "vit5 data") -> int:
    parser = Parser(prog=prog, description=__doc__.split("\n")[0].strip("`"))
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    digits = commands.add_parser(
        "digits",
        help="scikit-learn's digits as ROOT/{train,val}/<digit>/*.png (idempotent)",
    )
    digits.set_defaults(run="vit5.data.digits:export_digits_imagefolder")
    opt(digits, "root", None, "output folder")
    opt(digits, "--size", 32, "image side in pixels")
    opt(digits, "--val-fraction", 0.2, "val share")
    fashion = commands.add_parser(
        "fashion-mnist",
        help="Fashion-MNIST as OUT/{train,val,test}/<class>/<index>.png (idempotent, resumable)",
        description="Fashion-MNIST (arXiv 1708.07747) as OUT/{train,val,test}/<class>/<index>.png: val a "
        "seeded, class-stratified hold-out of the 60,000 training images, test the 10,000 test images. "
        f"Source: --source, else the Debian package (`{FASHION_INSTALL}`), else torchvision's download.",
    )
    fashion.set_defaults(run="vit5.data.fashion_mnist:export_fashion_mnist")
    opt(fashion, "root", Path, "output folder", metavar="OUT")
    opt(fashion, "--source", Path, "folder holding the four IDX files")
    opt(fashion, "--val-size", FASHION_VAL_SIZE, "val images")
    shards = commands.add_parser(
        "shards",
        help="an ImageFolder split (SRC/<class>/<image>) as WebDataset shards OUT/<split>-NNNNNN.tar with "
        "classes.txt and _info.json (resumable: rerun after a kill)",
    )
    shards.set_defaults(run="vit5.data.shards:write_shards")
    opt(shards, "src", None, "the split folder holding one folder per class")
    opt(shards, "out", None, "output folder (shards of several splits may share it)")
    opt(shards, "--shard-size", 1000, "samples per shard")
    opt(shards, "--split", None, "split name and shard prefix (default: SRC's name)")
    for p, seed in (
        (digits, "split seed"),
        (fashion, "split seed"),
        (shards, "seed of the sample order"),
    ):
        opt(p, "--seed", 0, seed)
    return run_main(parser.parse_args, argv, _write)


def _write(args: argparse.Namespace) -> None:
    # the writer, called with the options named like its parameters
    module, name = args.run.split(":")
    print(from_options(getattr(importlib.import_module(module), name), args))
