"""Command line for :mod:`vit5.eval`: ``vit5 eval COMMAND ...`` (``vit5 eval COMMAND --help``;
``python -m eval`` is the same).

Thin: parses options, calls the library, prints tables and writes JSON (and figures) under
``--out``. Bad input ends with one ``error: ...`` line and exit code 2. ``classify`` and
``sweep`` run multi-process too and give the numbers of one process: on GPUs
``accelerate launch --multi_gpu --num_processes N -m vit5 eval classify ...``; on CPUs
``torchrun --nproc_per_node N -m vit5 eval classify ...``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from vit5.cli import SIZE_HELP, Parser, add_weights_option, parse_size, run_command
from vit5.errors import InputError, one_line_warnings, safe_console
from vit5.files import check_output_dir
from vit5.runtime import DEVICE_HELP, resolve_device

if TYPE_CHECKING:
    import torch

# the library's defaults (vit5.eval.sweep.DEFAULT_SCALES, vit5.model.footprint.DEFAULT_MAX_PARAMS),
# named here so that --help loads no torch; tests/test_cli.py holds them equal
DEFAULT_SCALES = ("0.5", "0.75", "1", "1.25", "1.5", "2", "1x2", "2x1")
DEFAULT_MAX_PARAMS = 2_000_000_000

DESCRIPTION = """\
Evaluate models: classification metrics, resolution sweeps, dense features and probes.

Each command prints its tables and writes JSON (and figures) under --out. classify and sweep also
run on several processes, reporting the numbers once:
  GPUs: accelerate launch --multi_gpu --num_processes N -m vit5 eval classify ...
  CPUs: torchrun --nproc_per_node N -m vit5 eval classify ...
"""
MODEL_HELP = (
    "model spec: a vit5 checkpoint directory (raw and EMA weights are both evaluated when present), an "
    "official ViT-5 .pth, a vit5 preset with its released weights (vit5_small) or a released name "
    "(vit5_base_patch16_384.in1k), PRESET@CHECKPOINT, hf-hub:USER/REPO, or timm:NAME[.TAG][@CHECKPOINT]"
)


def _accelerator(args: argparse.Namespace):
    from accelerate import Accelerator

    # Without cpu=True, Accelerate on a machine with no GPU ignores torchrun's process group and
    # every process would evaluate everything.
    return Accelerator(cpu=resolve_device(args.device).type == "cpu")


def _models(args: argparse.Namespace, device: torch.device | None = None) -> list:
    from vit5.eval import load_models
    from vit5.eval.load import distinct_labels, parse_overrides
    from vit5.introspect.spec import random_init_flags

    specs = args.model if isinstance(args.model, list) else [args.model]
    per_model = args.model_args or [[]]
    if len(per_model) == 1:
        per_model = per_model * len(specs)
    if len(per_model) != len(specs):
        raise InputError(
            f"{len(per_model)} --model-args for {len(specs)} --model: give one --model-args for all models, "
            "or one per --model in the same order (an empty --model-args for a model without overrides)"
        )
    try:
        random = random_init_flags(specs, args.random_init)
    except InputError as err:
        raise InputError(str(err)) from err
    limit = {"max_params": args.max_params} if args.max_params is not None else {}
    loaded = [
        m
        for spec, items, untrained in zip(specs, per_model, random)
        for m in load_models(spec, args.weights, untrained, **parse_overrides(items), **limit)
    ]
    for m in loaded:
        m.model.to(device or resolve_device(getattr(args, "device", "auto")))
    return distinct_labels(loaded)


# ------------------------------------------------------------------------------------------ commands
def cmd_classify(args: argparse.Namespace) -> None:
    from vit5.eval import ClassifySettings, evaluate, open_split, per_class_table, summary_table
    from vit5.eval.figures import plot_confusion
    from vit5.eval.report import write_json

    accelerator = _accelerator(args)
    dataset = open_split(args.data, args.split or None)
    settings = ClassifySettings(args.size, args.crop_ratio, args.batch_size, args.workers)
    results = [evaluate(m, dataset, settings, accelerator) for m in _models(args, accelerator.device)]
    if not accelerator.is_main_process:
        return
    for r in results:
        if r.note:
            print(f"note: {r.note}")
    print(summary_table(results))
    for r in results:
        print("\n" + per_class_table(r))
        plot_confusion(
            r.scores.confusion,
            r.class_names,
            args.out / f"confusion_{r.model}.png",
            title=f"{r.model}: confusion matrix",
        )
        for s in r.skipped:
            print(f"skipped {s['path']}: {s['reason']}")
    print(
        f"\nwrote {write_json(args.out / 'classify.json', [r.to_dict() for r in results])} and "
        "confusion_*.png"
    )


def cmd_sweep(args: argparse.Namespace) -> None:
    from vit5.eval import (
        ClassifySettings,
        open_split,
        run_sweep,
        sizes_from_scales,
        sweep_plot,
        sweep_records,
        sweep_table,
    )
    from vit5.eval.report import write_json
    from vit5.introspect import patch_size_of

    accelerator = _accelerator(args)
    dataset = open_split(args.data, args.split or None)
    models = _models(args, accelerator.device)
    sizes = args.sizes or sizes_from_scales(
        args.scales, models[0].input_size, patch_size_of(models[0].model) or 1
    )
    settings = ClassifySettings(None, args.crop_ratio, args.batch_size, args.workers)
    results = run_sweep(models, dataset, sizes, settings, accelerator)
    if accelerator.is_main_process:
        print(sweep_table(results))
        plot = sweep_plot(results, args.out / "sweep.png", train_size=models[0].input_size)
        print(f"\nwrote {write_json(args.out / 'sweep.json', sweep_records(results))} and {plot}")


def cmd_features(args: argparse.Namespace) -> None:
    from vit5.eval import FeatureSettings, export_features

    (model,) = _models(args)
    settings = FeatureSettings(
        tuple(args.layers), args.size, args.max_side, args.norm, args.dtype, args.batch_size, args.workers
    )
    print(export_features(model, args.images, args.out, settings, overwrite=args.overwrite))


def cmd_probe(args: argparse.Namespace) -> None:
    from vit5.eval import ProbeSettings, open_split, probe_table, run_probes
    from vit5.eval.report import write_json

    train, val = open_split(args.data, args.train_split), open_split(args.data, args.val_split)
    settings = ProbeSettings(
        tuple(args.pool),
        tuple(args.k),
        args.temperature,
        args.C,
        layer=args.layer,
        norm=not args.no_norm,
        size=args.size,
        batch_size=args.batch_size,
        num_workers=args.workers,
        seed=args.seed,
    )
    rows = [row for m in _models(args) for row in run_probes(m, train, val, settings)]
    print(probe_table(rows, chance=1.0 / len(train.class_names)))
    print(f"\nwrote {write_json(args.out / 'probe.json', [vars(r) for r in rows])}")


def cmd_segprobe(args: argparse.Namespace) -> None:
    from vit5.eval import SegProbeSettings, dataset_info, default_splits, run_segmentation_probe, seg_tables
    from vit5.eval.report import write_json

    info = dataset_info(args.data, args.num_classes, args.ignore_index, args.reduce_zero_label)
    splits = tuple(args.splits) if args.splits else default_splits(args.data)
    settings = SegProbeSettings(
        args.size,
        tuple(args.layers),
        not args.no_norm,
        args.epochs,
        args.batch_size,
        args.lr,
        args.weight_decay,
        args.seed,
    )
    results = [run_segmentation_probe(m, args.data, info, splits, settings) for m in _models(args)]
    print(seg_tables(results))
    print(f"\nwrote {write_json(args.out / 'segprobe.json', [r.to_dict() for r in results])}")


def cmd_make_seg(args: argparse.Namespace) -> None:
    from vit5.data.digits.segmentation import SegSetConfig, make_digit_segmentation

    try:
        cfg = SegSetConfig(args.train, args.val, args.size, tuple(args.digits), tuple(args.scale), args.seed)
        info = make_digit_segmentation(args.root, cfg)
    except (ValueError, FileExistsError) as err:
        raise InputError(str(err)) from err
    print(
        f"digits-seg -> {args.root}: {info['splits']['train']} train / {info['splits']['val']} val canvases "
        "of "
        f"{args.size}x{args.size}, {info['num_classes']} classes (0 = background, d + 1 = digit d)"
    )


# ------------------------------------------------------------------------------------------ parser
def _model_options(p: argparse.ArgumentParser, several: bool) -> None:
    p.add_argument(
        "--model",
        required=True,
        action="append" if several else None,
        help=MODEL_HELP + (" (repeat for several models)" if several else ""),
    )
    p.add_argument(
        "--model-args",
        nargs="*",
        action="append",
        metavar="KEY=VALUE",
        help="overrides: vit5 config fields or timm.create_model kwargs (e.g. depth=2 num_classes=10)"
        + ("; once for all models, or once per --model in order" if several else ""),
    )
    add_weights_option(p, auto=several)
    p.add_argument(
        "--random-init",
        action="store_true",
        help="build bare architecture names (vit5_tiny, timm:NAME) untrained instead of with their "
        "pretrained weights; checkpoints load as usual; every table says random-init",
    )
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument(
        "--max-params",
        type=float,
        metavar="N",
        help="refuse vit5 models larger than N parameters before building them (default "
        f"{DEFAULT_MAX_PARAMS:.0e})",
    )
    p.add_argument("--seed", type=int, default=0, help="seeds --random-init models and the probes")


def _loader_options(p: argparse.ArgumentParser, batch_size: int, workers: int | None) -> None:
    p.add_argument("--batch-size", type=int, default=batch_size, help=f"default {batch_size}")
    default = "min(4, CPUs - 1), and torch threads on the CPUs they leave" if workers is None else workers
    p.add_argument("--workers", type=int, default=workers, help=f"data loader processes (default {default})")


def _classify_options(p: argparse.ArgumentParser) -> None:
    """Data, crop and loader options shared by classify and sweep."""
    _model_options(p, several=True)
    p.add_argument("--data", required=True, help="ImageFolder root holding SPLIT/<class>/<image>")
    p.add_argument(
        "--split", default="val", help="split folder (default val; '' when --data is the split itself)"
    )
    p.add_argument(
        "--crop-ratio",
        type=float,
        help="resize to size/ratio, centre crop (default: the model's, 1.0 for ViT-5)",
    )
    _loader_options(p, 64, None)


def build_parser(prog: str = "vit5 eval") -> argparse.ArgumentParser:
    parser = Parser(prog=prog, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser(
        "classify",
        help="top-1/top-5/loss/per-class accuracy, confusion matrix and img/s on an ImageFolder split",
    )
    _classify_options(p)
    p.add_argument(
        "--size", type=parse_size, metavar="N|HxW", help=f"eval size, {SIZE_HELP} (default: the model's own)"
    )
    p.add_argument(
        "--out", type=Path, required=True, help="writes classify.json and confusion_<model>.png here"
    )
    p.set_defaults(run=cmd_classify)

    p = commands.add_parser(
        "sweep", help="accuracy against input resolution (table + plot) for one or more models"
    )
    _classify_options(p)
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--scales",
        nargs="+",
        default=list(DEFAULT_SCALES),
        metavar="S|SHxSW",
        help=f"sizes as multiples of the first model's input size (default {' '.join(DEFAULT_SCALES)})",
    )
    group.add_argument(
        "--sizes", nargs="+", type=parse_size, metavar="N|HxW", help="absolute sizes instead of --scales"
    )
    p.add_argument("--out", type=Path, required=True, help="writes sweep.json and sweep.png here")
    p.set_defaults(run=cmd_sweep)

    p = commands.add_parser(
        "features", help="dense features of every image in a folder to safetensors + manifest (resumable)"
    )
    _model_options(p, several=False)
    p.add_argument("--images", required=True, help="image folder (searched recursively) or one image")
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="output folder: <image path>.safetensors files + manifest.json",
    )
    p.add_argument(
        "--layers",
        nargs="+",
        type=int,
        default=[-1],
        help="blocks to save (negative from the end; default -1)",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--size",
        type=parse_size,
        metavar="N|HxW",
        help=f"resize every image to {SIZE_HELP}; default: own size",
    )
    size.add_argument("--max-side", type=int, help="own size, shrunk so the longer side is at most this")
    p.add_argument("--norm", action="store_true", help="apply the final norm to each block's output")
    p.add_argument(
        "--dtype", choices=("float32", "float16", "bfloat16"), default="float32", help="storage dtype"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="recompute everything, replacing features from other settings",
    )
    _loader_options(p, 8, 2)
    p.set_defaults(run=cmd_features)

    p = commands.add_parser(
        "probe", help="kNN and logistic-regression probes on CLS / average-pooled features"
    )
    _model_options(p, several=True)
    p.add_argument("--data", required=True, help="ImageFolder root with train and val splits")
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default="val")
    p.add_argument(
        "--pool", nargs="+", choices=("cls", "avg"), default=["cls", "avg"], help="global features to probe"
    )
    p.add_argument("--k", nargs="+", type=int, default=[10, 20], help="kNN neighbour counts (default 10 20)")
    p.add_argument(
        "--temperature", type=float, default=0.07, help="kNN vote weight exp(cos/T) (default 0.07)"
    )
    p.add_argument(
        "--C", type=float, default=1.0, help="inverse L2 strength of the logistic regression (default 1)"
    )
    p.add_argument("--layer", type=int, default=-1, help="block to probe (default -1)")
    p.add_argument(
        "--no-norm", action="store_true", help="probe raw block outputs instead of final-normed ones"
    )
    p.add_argument(
        "--size", type=parse_size, metavar="N|HxW", help=f"input size, {SIZE_HELP} (default: the model's)"
    )
    _loader_options(p, 64, 2)
    p.add_argument("--out", type=Path, required=True, help="writes probe.json here")
    p.set_defaults(run=cmd_probe)

    p = commands.add_parser(
        "segprobe", help="dense linear segmentation probe on patch features: mIoU, pixel accuracy"
    )
    _model_options(p, several=True)
    p.add_argument(
        "--data", required=True, help="root with images/SPLIT/... and annotations/SPLIT/... (PNG class ids)"
    )
    p.add_argument(
        "--splits", nargs=2, metavar=("TRAIN", "VAL"), help="default: train val, or training validation"
    )
    p.add_argument("--num-classes", type=int, help="default: from DATA/dataset.json")
    p.add_argument("--ignore-index", type=int, help="label value to ignore (default 255 or dataset.json's)")
    p.add_argument(
        "--reduce-zero-label", action="store_true", help="ADE20K: id 0 is ignored, ids shift down by one"
    )
    p.add_argument(
        "--size", type=parse_size, metavar="N|HxW", help=f"input size, {SIZE_HELP} (default: the model's)"
    )
    p.add_argument(
        "--layers", nargs="+", type=int, default=[-1], help="blocks whose patch features are concatenated"
    )
    p.add_argument(
        "--no-norm", action="store_true", help="use raw block outputs instead of final-normed ones"
    )
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--out", type=Path, required=True, help="writes segprobe.json here")
    p.set_defaults(run=cmd_segprobe)

    p = commands.add_parser(
        "make-seg", help="build the digits segmentation set (images + PNG masks) for segprobe"
    )
    p.add_argument("root", type=Path, help="output folder")
    p.add_argument("--train", type=int, default=400, help="train canvases (default 400)")
    p.add_argument("--val", type=int, default=100, help="val canvases (default 100)")
    p.add_argument("--size", type=int, default=64, help="canvas side in pixels (default 64)")
    p.add_argument(
        "--digits", nargs=2, type=int, default=[2, 4], metavar=("MIN", "MAX"), help="digits per canvas"
    )
    p.add_argument(
        "--scale",
        nargs=2,
        type=float,
        default=[0.3, 0.55],
        metavar=("MIN", "MAX"),
        help="digit side as a fraction of the canvas side",
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=cmd_make_seg)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "vit5 eval") -> int:
    """Entry point of ``vit5 eval``; returns the exit status (2 after one ``error:`` line on bad input)."""
    safe_console()
    one_line_warnings()
    args = build_parser(prog).parse_args(argv)

    def work() -> None:
        import torch

        torch.manual_seed(getattr(args, "seed", 0))
        if getattr(args, "device", None) is not None:
            resolve_device(args.device)  # a bad --device fails before any work
        if getattr(args, "out", None) is not None:
            check_output_dir(args.out, "--out")  # so does an --out that is a file or cannot be written
        args.run(args)

    return run_command(work, getattr(args, "out", None))
