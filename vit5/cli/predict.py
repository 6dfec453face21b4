"""``vit5 predict --model M --images DIR [--topk 5] [--csv OUT]``: the top-k class names of each image
(:mod:`vit5.eval.predict`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from vit5.cli import SIZE_HELP, Parser, add_weights_option, parse_size, run_command
from vit5.cli.eval import DEFAULT_MAX_PARAMS, MODEL_HELP
from vit5.errors import InputError, one_line_warnings, safe_console
from vit5.runtime import DEVICE_HELP, resolve_device


def build_parser(prog: str = "vit5 predict") -> argparse.ArgumentParser:
    p = Parser(
        prog=prog,
        description="The top-k classes of every image of a folder, with class names: the model's own "
        "(label_names of its config.json), ImageNet's for ImageNet-1k heads (the released weights), "
        "else the output index.",
        epilog="example: vit5 predict --model vit5_small --images photos/ --topk 5 --csv predictions.csv",
    )
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument(
        "--model-args",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="overrides: vit5 config fields or timm.create_model kwargs (e.g. img_size=64)",
    )
    add_weights_option(p)
    p.add_argument(
        "--random-init",
        action="store_true",
        help="build a bare architecture name untrained (a pipeline check: its predictions mean nothing)",
    )
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
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument(
        "--max-params",
        type=float,
        metavar="N",
        help="refuse vit5 models larger than N parameters before building them "
        f"(default {DEFAULT_MAX_PARAMS:.0e})",
    )
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
    from vit5.eval.load import load_models, parse_overrides
    from vit5.eval.predict import predict, predictions_table, write_csv
    from vit5.introspect.spec import random_init_flags

    device = resolve_device(args.device)  # a bad --device fails before any work
    if args.csv is not None and args.csv.is_dir():
        raise InputError(
            f"--csv {args.csv} is a folder: give a file path such as {args.csv / 'predictions.csv'}"
        )
    (untrained,) = random_init_flags([args.model], args.random_init)
    limit = {"max_params": args.max_params} if args.max_params is not None else {}
    (loaded,) = load_models(args.model, args.weights, untrained, **parse_overrides(args.model_args), **limit)
    print(f"model: {loaded.description}")
    predictions, names = predict(
        loaded, args.images, args.topk, args.size, args.batch_size, args.workers, device, not args.quiet
    )
    print(f"classes: {names.source}")
    print(predictions_table(predictions, args.images))
    if args.csv is not None:
        print(f"wrote {write_csv(predictions, args.csv, args.images)}")
