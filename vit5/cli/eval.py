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

from vit5.cli import (
    Parser,
    add_model_options,
    from_options,
    model_request,
    opt,
    parse_size,
    run_main,
    size_option,
)
from vit5.errors import InputError
from vit5.files import check_output_dir
from vit5.outputs import write_json
from vit5.runtime import resolve_device

# vit5.eval.classify.DEFAULT_SCALES, named here so that --help loads no torch (tests hold them equal)
DEFAULT_SCALES = ("0.5", "0.75", "1", "1.25", "1.5", "2", "1x2", "2x1")


def _models(args: argparse.Namespace, device=None, require: str = "any") -> list:
    """The models of the options on ``device`` (default ``--device``), their labels distinct."""
    from vit5.introspect.load import distinct_labels, load_models

    models = load_models(model_request(args, require=require))
    for m in models:
        m.model.to(device or args.device)
    return distinct_labels(models)


def _classify_data(args: argparse.Namespace):
    """The settings, the accelerator (one process of several, or the only one), the split and the models."""
    from accelerate import Accelerator

    from vit5.eval import ClassifySettings, open_split

    settings = from_options(ClassifySettings, args)
    # without cpu=True, Accelerate on a machine with no GPU ignores torchrun's process group
    accelerator = Accelerator(cpu=args.device.startswith("cpu"))
    return (
        settings,
        accelerator,
        open_split(args.data, args.split or None),
        _models(args, accelerator.device),
    )


def cmd_classify(args: argparse.Namespace) -> None:
    """top-1/top-5/loss/per-class accuracy, confusion matrix and img/s on an ImageFolder split"""
    from vit5.eval import evaluate, per_class_table, summary_table
    from vit5.eval.classify import plot_confusion

    settings, accelerator, dataset, models = _classify_data(args)
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
        plot_confusion(
            r.scores.confusion,
            r.class_names,
            confusion,
            title=f"{r.model}: confusion matrix",
        )
        for s in r.skipped:
            print(f"skipped {s['path']}: {s['reason']}")
    path = write_json(args.out / "classify.json", [r.to_dict() for r in results])
    print(f"\nwrote {path} and confusion_*.png")


def cmd_sweep(args: argparse.Namespace) -> None:
    """accuracy against input resolution (table + plot) for one or more models"""
    from vit5.eval import run_sweep, sizes_from_scales, sweep_plot, sweep_records, sweep_table

    settings, accelerator, dataset, models = _classify_data(args)
    first = models[0]
    patch = first.info.patch_size if first.info else 1
    sizes = args.sizes or sizes_from_scales(args.scales, first.input_size, patch)
    results = run_sweep(models, dataset, sizes, settings, accelerator)
    if accelerator.is_main_process:
        print(sweep_table(results))
        plot = sweep_plot(results, args.out / "sweep.png", train_size=first.input_size)
        print(f"\nwrote {write_json(args.out / 'sweep.json', sweep_records(results))} and {plot}")


def cmd_features(args: argparse.Namespace) -> None:
    """dense features of every image in a folder to safetensors + manifest (resumable)"""
    from vit5.eval import FeatureSettings, export_features
    from vit5.eval.registers import read_neurons

    if (args.clean == "ttr") != bool(args.neurons):
        raise InputError(
            "--clean ttr needs --neurons PATH (the register_neurons.json of `vit5 viz ttr` on "
            "these images), and --neurons is used only by it"
        )
    neurons = read_neurons(args.neurons) if args.neurons else ()
    settings = from_options(FeatureSettings, args, neurons=neurons)
    (model,) = _models(args, require="vit")
    print(export_features(model, args.images, args.out, settings, overwrite=args.overwrite))


def cmd_probe(args: argparse.Namespace) -> None:
    """kNN and logistic-regression probes on CLS / average-pooled features"""
    from vit5.eval import ProbeSettings, open_split, probe_table, run_probes

    train = open_split(args.data, args.train_split)
    val = open_split(args.data, args.val_split)
    settings = from_options(ProbeSettings, args, norm=not args.no_norm)
    models = _models(args, require="vit")
    rows = [row for m in models for row in run_probes(m, train, val, settings)]
    print(probe_table(rows, chance=1.0 / len(train.class_names)))
    print(f"\nwrote {write_json(args.out / 'probe.json', [vars(r) for r in rows])}")


def cmd_segprobe(args: argparse.Namespace) -> None:
    """dense linear segmentation probe on patch features: mIoU, pixel accuracy"""
    from vit5.eval import (
        SegProbeSettings,
        dataset_info,
        default_splits,
        run_segmentation_probe,
        seg_tables,
    )

    info = dataset_info(args.data, args.num_classes, args.ignore_index, args.reduce_zero_label)
    splits = tuple(args.splits) if args.splits else default_splits(args.data)
    upsample = None
    if args.upsample == "jbu":
        from vit5.eval.upsample import JointBilateral

        upsample = from_options(JointBilateral, args)
    settings = from_options(SegProbeSettings, args, norm=not args.no_norm, upsample=upsample)
    models = _models(args, require="vit")
    results = [run_segmentation_probe(m, args.data, info, splits, settings) for m in models]
    print(seg_tables(results))
    print(f"\nwrote {write_json(args.out / 'segprobe.json', [r.to_dict() for r in results])}")


def cmd_make_seg(args: argparse.Namespace) -> None:
    """build the digits segmentation set (images + PNG masks) for segprobe"""
    from vit5.data.digits.segmentation import SegSetConfig, make_digit_segmentation

    try:
        info = make_digit_segmentation(args.root, from_options(SegSetConfig, args))
    except (ValueError, FileExistsError) as err:
        raise InputError(str(err)) from err
    splits = info["splits"]
    print(
        f"digits-seg -> {args.root}: {splits['train']} train / {splits['val']} val canvases of "
        f"{args.size}x{args.size}, {info['num_classes']} classes (0 = background, d + 1 = digit d)",
    )


def _loader(p: argparse.ArgumentParser, batch_size: int, workers: int | None) -> None:
    opt(p, "--batch-size", batch_size, "images per batch")
    default = (
        "min(4, CPUs - 1), and torch threads on the CPUs they leave" if workers is None else workers
    )
    text = f"data loader processes (default {default})"
    opt(p, "--workers", workers, text, type=int, dest="num_workers", metavar="N")


def build_parser(prog: str = "vit5 eval") -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(run, out: str | None, several: bool | None = True) -> argparse.ArgumentParser:
        name = run.__name__[len("cmd_") :].replace("_", "-")
        p = commands.add_parser(name, help=run.__doc__)
        p.set_defaults(run=run)
        if out:
            opt(p, "--out", Path, out, required=True)
        if several is not None:
            add_model_options(p, several, auto=several)
        opt(p, "--seed", 0, "seeds --random-init models, probes and canvases")
        return p

    classify = command(cmd_classify, "writes classify.json and confusion_<model>.png here")
    sweep = command(cmd_sweep, "writes sweep.json and sweep.png here")
    for p in (classify, sweep):
        opt(p, "--data", None, "ImageFolder root holding SPLIT/<class>/<image>", required=True)
        opt(p, "--split", "val", "split folder (default val; '' when --data is the split itself)")
        ratio = "resize to size/ratio, centre crop (default: the model's, 1.0 for ViT-5)"
        opt(p, "--crop-ratio", float, ratio)
        _loader(p, 64, None)
    size_option(classify)
    group = sweep.add_mutually_exclusive_group()
    scales = (
        f"sizes as multiples of the first model's input size (default {' '.join(DEFAULT_SCALES)})"
    )
    opt(group, "--scales", list(DEFAULT_SCALES), scales, metavar="S|SHxSW")
    opt(
        group,
        "--sizes",
        parse_size,
        "absolute sizes instead of --scales",
        nargs="+",
        metavar="N|HxW",
    )

    p = command(
        cmd_features,
        "output folder: <image path>.safetensors files + manifest.json",
        several=False,
    )
    opt(p, "--images", None, "image folder (searched recursively) or one image", required=True)
    opt(p, "--layers", [-1], "blocks to save (default -1, the last)")
    size = p.add_mutually_exclusive_group()
    size_option(size, " (default: each image's own size)")
    opt(size, "--max-side", int, "own size, shrunk so the longer side is at most this")
    opt(p, "--norm", False, "apply the final norm to each block's output")
    opt(p, "--dtype", "float32", "storage dtype", choices=("float32", "float16", "bfloat16"))
    opt(p, "--overwrite", False, "recompute all, replacing features from other settings")
    clean = "against artifacts: test-time registers, or outlier patches replaced by neighbours"
    opt(p, "--clean", "none", clean, choices=("none", "ttr", "drop-outliers"))
    opt(p, "--neurons", Path, "register_neurons.json of `vit5 viz ttr` (for --clean ttr)")
    opt(p, "--outlier-k", 5.0, "MAD multiplier of the outlier rule (score, drop-outliers)")
    _loader(p, 8, 2)

    p = command(cmd_probe, "writes probe.json here")
    opt(p, "--data", None, "ImageFolder root with train and val splits", required=True)
    opt(p, "--train-split", "train")
    opt(p, "--val-split", "val")
    opt(
        p,
        "--pool",
        ["cls", "avg"],
        "global features to probe",
        choices=("cls", "avg"),
        dest="pools",
    )
    opt(p, "--k", [10, 20], "kNN neighbour counts", dest="knn_k", metavar="K")
    opt(p, "--temperature", 0.07, "kNN weight exp(cos/T)", dest="knn_temperature", metavar="T")
    opt(
        p,
        "--C",
        1.0,
        "inverse L2 strength of the logistic regression",
        dest="logreg_c",
        metavar="C",
    )
    opt(p, "--layer", -1, "block to probe")
    opt(p, "--no-norm", False, "raw block outputs instead of final-normed ones")
    size_option(p)
    _loader(p, 64, 2)

    p = command(cmd_segprobe, "writes segprobe.json here")
    data = "root with images/SPLIT/... and annotations/SPLIT/... (PNG class ids)"
    opt(p, "--data", None, data, required=True)
    opt(
        p,
        "--splits",
        None,
        "default: train val, or training validation",
        nargs=2,
        metavar=("TRAIN", "VAL"),
    )
    opt(p, "--num-classes", int, "default: from DATA/dataset.json")
    opt(p, "--ignore-index", int, "label value to ignore (default 255 or dataset.json's)")
    opt(p, "--reduce-zero-label", False, "ADE20K: id 0 is ignored, ids shift down by one")
    size_option(p)
    opt(p, "--layers", [-1], "blocks whose patch features are concatenated")
    opt(p, "--no-norm", False, "raw block outputs instead of final-normed ones")
    for flag, default in (
        ("--epochs", 30),
        ("--lr", 0.05),
        ("--weight-decay", 1e-4),
        ("--batch-size", 16),
    ):
        opt(p, flag, default)
    jbu = p.add_argument_group("edge-aware upsampling (joint bilateral, Kopf et al. 2007)")
    scored = "also score with logits upsampled to pixels, guided by the image"
    opt(jbu, "--upsample", "none", scored, choices=("none", "jbu"))
    opt(jbu, "--radius", 1, "window: grid cells on each side of the nearest")
    opt(jbu, "--sigma-spatial", 1.0, "spatial Gaussian, in patches")
    opt(jbu, "--sigma-range", 0.1, "colour Gaussian, on RGB in [0, 1]")

    p = command(cmd_make_seg, None, None)
    opt(p, "root", Path, "output folder")
    opt(p, "--train", 400, "train canvases", dest="num_train", metavar="N")
    opt(p, "--val", 100, "val canvases", dest="num_val", metavar="N")
    opt(p, "--size", 64, "canvas side in pixels")
    opt(
        p,
        "--digits",
        [2, 4],
        "digits per canvas",
        nargs=2,
        metavar=("MIN", "MAX"),
        dest="digits_per_image",
    )
    scale = "digit side as a fraction of the canvas side"
    opt(p, "--scale", [0.3, 0.55], scale, nargs=2, metavar=("MIN", "MAX"), dest="digit_scale")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "vit5 eval") -> int:
    return run_main(build_parser(prog).parse_args, argv, _run)


def _run(args: argparse.Namespace) -> None:
    import torch

    torch.manual_seed(args.seed)
    if hasattr(args, "device"):
        args.device = str(resolve_device(args.device))  # a bad --device fails before any work
    if hasattr(args, "out"):
        check_output_dir(args.out, "--out")  # so does an --out that is a file or cannot be written
    args.run(args)
