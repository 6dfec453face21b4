"""``vit5 predict --model M --images DIR [--topk 5] [--csv OUT]``: the top-k class names of each image
(:mod:`vit5.eval.classify`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from vit5.cli import (
    Parser,
    add_model_options,
    from_options,
    model_request,
    opt,
    run_main,
    size_option,
)
from vit5.errors import InputError
from vit5.runtime import resolve_device


def build_parser(prog: str = "vit5 predict") -> argparse.ArgumentParser:
    p = Parser(
        prog=prog,
        description="The top-k classes of every image of a folder, with class names: the model's own "
        "(label_names of its config.json), ImageNet's for ImageNet-1k heads (the released weights), "
        "else the output index.",
        epilog="example: vit5 predict --model vit5_small --images photos/ --topk 5 --csv predictions.csv",
        check=lambda a: a.topk < 1 and f"--topk must be at least 1, got {a.topk}",
    )
    add_model_options(p)
    opt(p, "--images", None, "image folder (searched recursively) or one image", required=True)
    opt(p, "--topk", 5, "classes per image")
    opt(p, "--csv", Path, "also write image, top1_class, top1_index, ... here", metavar="OUT")
    size_option(p)
    opt(p, "--batch-size", 32, "images per batch")
    opt(p, "--workers", 0, "data loader processes", dest="num_workers", metavar="N")
    opt(p, "--quiet", False, "no progress bar")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "vit5 predict") -> int:
    return run_main(build_parser(prog).parse_args, argv, _predict)


def _predict(args: argparse.Namespace) -> None:
    from vit5.eval.classify import predict, predictions_table, write_predictions
    from vit5.introspect.load import load_models

    device = resolve_device(args.device)  # a bad --device fails before any work
    if args.csv is not None and args.csv.is_dir():
        raise InputError(
            f"--csv {args.csv} is a folder: give a file path such as {args.csv / 'predictions.csv'}",
        )
    (loaded,) = load_models(model_request(args))
    print(f"model: {loaded.description}")
    predictions, names = from_options(
        predict,
        args,
        loaded=loaded,
        device=device,
        progress=not args.quiet,
    )
    print(f"classes: {names.source}")
    print(predictions_table(predictions, args.images))
    if args.csv is not None:
        print(f"wrote {write_predictions(predictions, args.csv, args.images)}")
