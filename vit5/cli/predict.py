"""``vit5 predict --model M --images DIR [--topk 5] [--csv OUT]``: the top-k class names of each image
(:mod:`vit5.eval.classify`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from vit5.cli import SIZE_HELP, Parser, add_model_options, load_models, parse_size, run_command
from vit5.errors import InputError, one_line_warnings, safe_console
from vit5.runtime import resolve_device


def build_parser(prog: str = "vit5 predict") -> argparse.ArgumentParser:
    p = Parser(
        prog=prog,
        description="The top-k classes of every image of a folder, with class names: the model's own "
        "(label_names of its config.json), ImageNet's for ImageNet-1k heads (the released weights), "
        "else the output index.",
        epilog="example: vit5 predict --model vit5_small --images photos/ --topk 5 --csv predictions.csv",
    )
    add_model_options(p)
    p.add_argument("--images", required=True, help="image folder (searched recursively) or one image")
    p.add_argument("--topk", type=int, default=5, help="classes per image (default 5)")
    p.add_argument(
        "--csv", type=Path, metavar="OUT", help="also write image, top1_class, top1_index, ... here"
    )
    p.add_argument(
        "--size", type=parse_size, metavar="N|HxW", help=f"input size, {SIZE_HELP} (default: the model's own)"
    )
    p.add_argument("--batch-size", type=int, default=32, help="default 32")
    p.add_argument("--workers", type=int, default=0, help="data loader processes (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "vit5 predict") -> int:
    """Entry point of ``vit5 predict``: 0, or 2 after one ``error:`` line on bad input."""
    safe_console()
    one_line_warnings()
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.topk < 1:
        parser.error(f"--topk must be at least 1, got {args.topk}")
    return run_command(lambda: _predict(args))


def _predict(args: argparse.Namespace) -> None:
    from vit5.eval.classify import predict, predictions_table, write_csv

    device = resolve_device(args.device)  # a bad --device fails before any work
    if args.csv is not None and args.csv.is_dir():
        raise InputError(
            f"--csv {args.csv} is a folder: give a file path such as {args.csv / 'predictions.csv'}"
        )
    (loaded,) = load_models(args)
    print(f"model: {loaded.description}")
    predictions, names = predict(
        loaded, args.images, args.topk, args.size, args.batch_size, args.workers, device, not args.quiet
    )
    print(f"classes: {names.source}")
    print(predictions_table(predictions, args.images))
    if args.csv is not None:
        print(f"wrote {write_csv(predictions, args.csv, args.images)}")
