"""Evaluate models: classification metrics, resolution sweeps, dense features and probes.

Each command prints its tables and writes JSON (and figures) under --out. classify and sweep also
run on several processes, reporting the numbers once:
  GPUs: accelerate launch --multi_gpu --num_processes N -m vit5 eval classify ...
  CPUs: torchrun --nproc_per_node N -m vit5 eval classify ...
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from vit5.cli import SIZE_HELP, Parser, add_model_options, from_options, load_models, parse_size, run_command
from vit5.errors import InputError, one_line_warnings, safe_console
from vit5.files import check_output_dir
from vit5.runtime import resolve_device

# vit5.eval.classify.DEFAULT_SCALES, named here so that --help loads no torch (tests hold them equal)
DEFAULT_SCALES = ("0.5", "0.75", "1", "1.25", "1.5", "2", "1x2", "2x1")


def _models(args: argparse.Namespace, device=None) -> list:
    from vit5.introspect.spec import distinct_labels

    models = load_models(args)
    for m in models:
        m.model.to(device or resolve_device(args.device))
    return distinct_labels(models)


def _classify_data(args: argparse.Namespace):
    """The accelerator (one process of several, or the only one), the split and the models."""
    from accelerate import Accelerator

    from vit5.eval import open_split

    # without cpu=True, Accelerate on a machine with no GPU ignores torchrun's process group
    accelerator = Accelerator(cpu=resolve_device(args.device).type == "cpu")
    return accelerator, open_split(args.data, args.split or None), _models(args, accelerator.device)


def cmd_classify(args: argparse.Namespace) -> None:
    from vit5.eval import ClassifySettings, evaluate, per_class_table, summary_table
    from vit5.eval.classify import plot_confusion
    from vit5.eval.common import write_json

    settings = from_options(ClassifySettings, args)
    accelerator, dataset, models = _classify_data(args)
    results = [evaluate(m, dataset, settings, accelerator) for m in models]
    if not accelerator.is_main_process:
        return
    for r in results:
        if r.note:
            print(f"note: {r.note}")
    print(summary_table(results))
    for r in results:
        print("\n" + per_class_table(r))
        confusion = args.out / f"confusion_{r.model}.png"
        plot_confusion(r.scores.confusion, r.class_names, confusion, title=f"{r.model}: confusion matrix")
        for s in r.skipped:
            print(f"skipped {s['path']}: {s['reason']}")
    path = write_json(args.out / "classify.json", [r.to_dict() for r in results])
    print(f"\nwrote {path} and confusion_*.png")


def cmd_sweep(args: argparse.Namespace) -> None:
    from vit5.eval import (
        ClassifySettings,
        run_sweep,
        sizes_from_scales,
        sweep_plot,
        sweep_records,
        sweep_table,
    )
    from vit5.eval.common import write_json
    from vit5.introspect import patch_size_of

    settings = from_options(ClassifySettings, args)
    accelerator, dataset, models = _classify_data(args)
    first = models[0]
    sizes = args.sizes or sizes_from_scales(args.scales, first.input_size, patch_size_of(first.model) or 1)
    results = run_sweep(models, dataset, sizes, settings, accelerator)
    if accelerator.is_main_process:
        print(sweep_table(results))
        plot = sweep_plot(results, args.out / "sweep.png", train_size=first.input_size)
        print(f"\nwrote {write_json(args.out / 'sweep.json', sweep_records(results))} and {plot}")


def cmd_features(args: argparse.Namespace) -> None:
    from vit5.eval import FeatureSettings, export_features

    settings = from_options(FeatureSettings, args)
    (model,) = _models(args)
    print(export_features(model, args.images, args.out, settings, overwrite=args.overwrite))


def cmd_probe(args: argparse.Namespace) -> None:
    from vit5.eval import ProbeSettings, open_split, probe_table, run_probes
    from vit5.eval.common import write_json

    train, val = open_split(args.data, args.train_split), open_split(args.data, args.val_split)
    settings = from_options(
        ProbeSettings, args, pools=args.pool, knn_k=args.k, knn_temperature=args.temperature, logreg_c=args.C
    )
    rows = [row for m in _models(args) for row in run_probes(m, train, val, settings)]
    print(probe_table(rows, chance=1.0 / len(train.class_names)))
    print(f"\nwrote {write_json(args.out / 'probe.json', [vars(r) for r in rows])}")


def cmd_segprobe(args: argparse.Namespace) -> None:
    from vit5.eval import SegProbeSettings, dataset_info, default_splits, run_segmentation_probe, seg_tables
    from vit5.eval.common import write_json

    info = dataset_info(args.data, args.num_classes, args.ignore_index, args.reduce_zero_label)
    splits = tuple(args.splits) if args.splits else default_splits(args.data)
    settings = from_options(SegProbeSettings, args)
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
    splits = info["splits"]
    print(
        f"digits-seg -> {args.root}: {splits['train']} train / {splits['val']} val canvases of "
        f"{args.size}x{args.size}, {info['num_classes']} classes (0 = background, d + 1 = digit d)"
    )


def _size(p: argparse.ArgumentParser, default: str = "the model's own") -> None:
    p.add_argument(
        "--size", type=parse_size, metavar="N|HxW", help=f"input size, {SIZE_HELP} (default: {default})"
    )


def _loader(p: argparse.ArgumentParser, batch_size: int, workers: int | None) -> None:
    p.add_argument("--batch-size", type=int, default=batch_size, help=f"default {batch_size}")
    default = "min(4, CPUs - 1), and torch threads on the CPUs they leave" if workers is None else workers
    text = f"data loader processes (default {default})"
    p.add_argument("--workers", dest="num_workers", type=int, default=workers, metavar="N", help=text)


def build_parser(prog: str = "vit5 eval") -> argparse.ArgumentParser:
    parser = Parser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run, summary: str, out: str | None, several: bool | None = True):
        p = commands.add_parser(name, help=summary)
        p.set_defaults(run=run)
        if out:
            p.add_argument("--out", type=Path, required=True, help=out)
        if several is not None:
            add_model_options(p, several, auto=several)
        p.add_argument("--seed", type=int, default=0, help="seeds --random-init models, probes and canvases")
        return p

    for name, run, summary, out in (
        (
            "classify",
            cmd_classify,
            "top-1/top-5/loss/per-class accuracy, confusion matrix and img/s on an ImageFolder split",
            "writes classify.json and confusion_<model>.png here",
        ),
        (
            "sweep",
            cmd_sweep,
            "accuracy against input resolution (table + plot) for one or more models",
            "writes sweep.json and sweep.png here",
        ),
    ):
        p = command(name, run, summary, out)
        p.add_argument("--data", required=True, help="ImageFolder root holding SPLIT/<class>/<image>")
        p.add_argument(
            "--split", default="val", help="split folder (default val; '' when --data is the split itself)"
        )
        p.add_argument(
            "--crop-ratio",
            type=float,
            help="resize to size/ratio, centre crop (default: the model's, 1.0 for ViT-5)",
        )
        _loader(p, 64, None)
        if name == "classify":
            _size(p)
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

    p = command(
        "features",
        cmd_features,
        "dense features of every image in a folder to safetensors + manifest (resumable)",
        "output folder: <image path>.safetensors files + manifest.json",
        several=False,
    )
    p.add_argument("--images", required=True, help="image folder (searched recursively) or one image")
    p.add_argument(
        "--layers", nargs="+", type=int, default=[-1], help="blocks to save (default -1, the last)"
    )
    size = p.add_mutually_exclusive_group()
    _size(size, "each image's own size")
    size.add_argument("--max-side", type=int, help="own size, shrunk so the longer side is at most this")
    p.add_argument("--norm", action="store_true", help="apply the final norm to each block's output")
    p.add_argument(
        "--dtype", choices=("float32", "float16", "bfloat16"), default="float32", help="storage dtype"
    )
    p.add_argument(
        "--overwrite", action="store_true", help="recompute all, replacing features from other settings"
    )
    _loader(p, 8, 2)

    summary = "kNN and logistic-regression probes on CLS / average-pooled features"
    p = command("probe", cmd_probe, summary, "writes probe.json here")
    p.add_argument("--data", required=True, help="ImageFolder root with train and val splits")
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default="val")
    p.add_argument(
        "--pool", nargs="+", choices=("cls", "avg"), default=["cls", "avg"], help="global features to probe"
    )
    p.add_argument("--k", nargs="+", type=int, default=[10, 20], help="kNN neighbour counts (default 10 20)")
    p.add_argument("--temperature", type=float, default=0.07, help="kNN weight exp(cos/T) (default 0.07)")
    p.add_argument(
        "--C", type=float, default=1.0, help="inverse L2 strength of the logistic regression (default 1)"
    )
    p.add_argument("--layer", type=int, default=-1, help="block to probe (default -1)")
    p.add_argument(
        "--no-norm", dest="norm", action="store_false", help="raw block outputs instead of final-normed ones"
    )
    _size(p)
    _loader(p, 64, 2)

    p = command(
        "segprobe",
        cmd_segprobe,
        "dense linear segmentation probe on patch features: mIoU, pixel accuracy",
        "writes segprobe.json here",
    )
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
    _size(p)
    p.add_argument(
        "--layers", nargs="+", type=int, default=[-1], help="blocks whose patch features are concatenated"
    )
    p.add_argument(
        "--no-norm", dest="norm", action="store_false", help="raw block outputs instead of final-normed ones"
    )
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=16)

    p = command(
        "make-seg",
        cmd_make_seg,
        "build the digits segmentation set (images + PNG masks) for segprobe",
        None,
        None,
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
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "vit5 eval") -> int:
    """Entry point of ``vit5 eval``; returns the exit status (2 after one ``error:`` line on bad input)."""
    safe_console()
    one_line_warnings()
    args = build_parser(prog).parse_args(argv)

    def work() -> None:
        import torch

        torch.manual_seed(args.seed)
        if hasattr(args, "device"):
            resolve_device(args.device)  # a bad --device fails before any work
        if hasattr(args, "out"):
            check_output_dir(args.out, "--out")  # so does an --out that is a file or cannot be written
        args.run(args)

    return run_command(work, getattr(args, "out", None))
