"""``vit5 viz COMMAND``: the figures and metrics of :mod:`vit5.viz` for one model, two side by side or
with test-time registers; the register ablation, the position probe, and the register study
(:mod:`vit5.cli.study`)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from vit5.cli import (
    SIZE_HELP,
    Parser,
    add_model_options,
    from_options,
    load_models,
    parse_size,
    per_model_args,
    run_command,
)
from vit5.errors import InputError, one_line_warnings, safe_console
from vit5.files import check_output_dir
from vit5.plotstyle import DPI
from vit5.runtime import resolve_device

if TYPE_CHECKING:
    from vit5.introspect.spec import LoadedModel
    from vit5.viz import RunConfig

# vit5.viz.register_ablation.METHODS / PLACES, named here so that --help loads no torch (tests: equal)
ABLATION_METHODS = ("zeros", "mean", "shuffle", "noise")
ABLATION_PLACES = ("input", "blocks")

SUBCOMMANDS = {  # name -> (the views it draws, None: every view; help)
    "attention": (
        {"attention", "registers", "rollout"},
        "CLS-to-patch maps per head and mean, register maps, rollout",
    ),
    "norms": (
        {"norms", "histograms", "profile", "massive"},
        "token-norm maps, per-layer norm histograms, layer profile, massive activations",
    ),
    "pca": ({"pca"}, "PCA of the patch features as RGB"),
    "metrics": ({"metrics"}, "per-layer artifact metrics with bootstrap intervals: JSON, CSV and a table"),
    "all": (None, "every figure and the metrics table for one model"),
    "compare": (set(), "two models side by side with shared colour scales (the garbage-collector figure)"),
    "ttr": (
        set(),
        "test-time registers: find the register neurons, then the model without and with an extra token",
    ),
}
ABLATE_HELP = (
    "register ablation at inference: zeros / mean / shuffled / noise registers, at the input or after every "
    "block; change in top-1, kNN accuracy, patch-feature cosine"
)
POSITION_HELP = (
    "position-artifact probe: norm and PCA maps of constant and noise images, for one or more models"
)
STUDY_HELP = (
    "the register study: train twins without / with registers on digit canvases, tracking the artifact "
    "metrics (resumable; `vit5 viz study --help`)"
)


def _outputs(p: argparse.ArgumentParser, batch_size: int, size_help: str, images: str | None) -> None:
    """The input and output options; ``images``: the help of ``--images`` (None: no such option)."""
    if images:
        p.add_argument("--images", nargs="+", required=True, metavar="PATH", help=images)
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--size", type=parse_size, metavar="N|HxW", help=f"input size, {SIZE_HELP}{size_help}")
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--formats", nargs="+", default=["png", "pdf"], choices=("png", "pdf", "svg"))
    p.add_argument("--dpi", type=int, default=DPI, help=f"PNG resolution (default {DPI})")
    p.add_argument("--quiet", dest="progress", action="store_false", help="no progress bar")


def _views(p: argparse.ArgumentParser, name: str) -> None:
    add_model_options(p)
    p.add_argument(
        "--label",
        metavar="TEXT",
        help="name of --model in titles, legends, tables (default: from its spec)",
    )
    if name == "compare":
        p.add_argument("--model-b", required=True, help="second model (same spec forms)")
        p.add_argument(
            "--model-b-args", nargs="+", default=[], metavar="KEY=VALUE", help="overrides for --model-b"
        )
        p.add_argument("--label-b", metavar="TEXT", help="like --label, for --model-b")
        p.add_argument(
            "--own-thresholds",
            dest="reuse_thresholds",
            action="store_false",
            help="score --model-b with its own outlier thresholds (default: reuse --model's, for twins)",
        )
    if name == "attention":
        p.add_argument(
            "--registers",
            dest="require_registers",
            action="store_true",
            help="require register maps (error for a model without registers)",
        )
    _outputs(
        p,
        8,
        "; images are resized to cover it and centre-cropped. Default: the images' aspect kept, short side = "
        "the model's (a patch multiple), long side = short x the images' median aspect rounded to a patch "
        "multiple",
        "image files, folders (searched recursively) or 'sklearn-samples' (scikit-learn's two photos)",
    )
    p.add_argument(
        "--layers",
        nargs="+",
        type=int,
        default=[-1],
        help="blocks drawn in per-image figures (negative counts from the end; default: the last). "
        "Metrics always cover every block",
    )
    p.add_argument(
        "--max-figures", type=int, default=16, help="per-image figures and summary rows: the first N images"
    )
    g = p.add_argument_group("maps")
    g.add_argument(
        "--renorm",
        dest="renormalise",
        action="store_true",
        help="CLS maps renormalised over patches (default: raw, the share of all tokens)",
    )
    g.add_argument(
        "--upsample",
        choices=("nearest", "bilinear"),
        default="nearest",
        help="map upsampling to pixels (default nearest: shows the token grid)",
    )
    g.add_argument("--cmap", default="viridis")
    g.add_argument("--alpha", type=float, default=0.5, help="overlay opacity")
    g.add_argument(
        "--clip",
        dest="clip_percentile",
        type=float,
        metavar="PCT",
        help="clip colour scales at this percentile (stated on the figure; default: no clipping)",
    )
    g.add_argument(
        "--title",
        metavar="TEXT",
        help="title of every figure instead of the generated one ('' for none, e.g. for a paper's caption)",
    )
    m = p.add_argument_group("metrics")
    m.add_argument(
        "--k", type=float, default=5.0, help="outlier threshold: median + k * MAD of log-norms (default 5)"
    )
    m.add_argument(
        "--threshold", type=float, help="explicit outlier norm threshold for every layer (instead of k * MAD)"
    )
    m.add_argument(
        "--threshold-from",
        type=Path,
        metavar="METRICS_JSON",
        help="reuse the per-layer thresholds of a reference model's metrics.json (e.g. its no-register twin)",
    )
    m.add_argument("--eps", type=float, default=0.3, help="sink-rate epsilon (default 0.3)")
    m.add_argument("--top-k", type=int, help="keys in the top-K sink mass (default: register count, or 4)")
    m.add_argument(
        "--bootstrap",
        dest="n_boot",
        type=int,
        default=1000,
        metavar="N",
        help="bootstrap resamples over images (default 1000)",
    )
    m.add_argument(
        "--save-raw", choices=("npz", "safetensors"), help="also save raw per-token norms and attention rows"
    )
    k = p.add_argument_group("planted artifacts (a pipeline self-check; every output is labelled PLANTED)")
    k.add_argument("--plant-layer", type=int, help="block whose output gets planted high-norm tokens")
    k.add_argument(
        "--plant-at", nargs=2, type=int, action="append", metavar=("ROW", "COL"), help="patch (repeatable)"
    )
    k.add_argument("--plant-scale", type=float, default=20.0, help="planted-token norm factor (default 20)")
    if name == "ttr":
        t = p.add_argument_group("register-neuron search (Jiang et al. 2025, Algorithm 1)")
        t.add_argument(
            "--detect-layer", type=int, help="block whose outliers are traced (default: most outliers)"
        )
        t.add_argument("--top-layer", type=int, help="search blocks <= this (default: the detect block)")
        t.add_argument("--neurons", type=int, default=10, help="register neurons to keep (top k; default 10)")
        t.add_argument("--count", type=int, default=1, help="test-time registers to append (default 1)")


def build_parser(prog: str = "vit5 viz") -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog,
        description="Attention maps, token norms and the register 'garbage collector' effect, as figures "
        "and numbers.",
        epilog="Example: vit5 viz all --model vit5_tiny --random-init --model-args depth=4 --images "
        "sklearn-samples --out runs/viz",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in SUBCOMMANDS.items():
        _views(sub.add_parser(name, help=help_text, description=help_text), name)
    p = sub.add_parser("ablate", help=ABLATE_HELP, description=ABLATE_HELP)
    add_model_options(p)
    p.add_argument(
        "--reference",
        nargs="+",
        metavar="PATH",
        help="reference images (register means, kNN bank); default: the first half of --images",
    )
    p.add_argument("--folder-labels", action="store_true", help="ImageFolders: label = class subfolder")
    p.add_argument("--methods", nargs="+", default=list(ABLATION_METHODS), choices=ABLATION_METHODS)
    p.add_argument("--places", nargs="+", default=list(ABLATION_PLACES), choices=ABLATION_PLACES)
    p.add_argument("--knn-k", type=int, default=20)
    p.add_argument("--max-images", type=int, help="at most the first N of --images and of --reference")
    images = "images to evaluate: files, folders, digits-val / digits-train (labelled), sklearn-samples"
    _outputs(p, 32, " (default: the model's own)", images)
    p = sub.add_parser("position", help=POSITION_HELP, description=POSITION_HELP)
    add_model_options(p, several=True)
    p.add_argument("--layer", type=int, default=-1, help="block whose output is probed (default: the last)")
    p.add_argument(
        "--levels",
        nargs="+",
        type=float,
        default=[0.0, 0.25, 0.5, 0.75, 1.0],
        help="constant grey levels in [0, 1]",
    )
    p.add_argument("--noise-images", type=int, default=16)
    _outputs(p, 32, " (default: the model's own)", None)
    sub.add_parser("study", help=STUDY_HELP, add_help=False)  # parsed by vit5.cli.study
    return parser


def _load(args: argparse.Namespace, specs=None, items=None) -> list[LoadedModel]:
    from vit5.viz.collect import recordable

    models = load_models(args, specs, items)
    for model in models:
        recordable(model.model)  # an architecture whose attention cannot be recorded fails now
        print(f"model: {model.description}")
    return models


def _ablate(args: argparse.Namespace) -> None:
    from vit5.viz import AblationConfig, ablation_figure, describe, load_images, run_ablation, save_figure
    from vit5.viz.runner import RANDOM_INIT_NOTE

    (model,) = _load(args)
    info = describe(model.model)
    size = tuple(args.size or info.img_size)

    def load(paths: list[str], limit: int | None) -> list:
        return load_images(paths, size, info.patch_size, args.folder_labels, limit)[0]

    if args.reference:
        images, reference = load(args.images, args.max_images), load(args.reference, args.max_images)
    else:
        images = load(args.images, args.max_images and 2 * args.max_images)
        if len(images) < 4:
            raise InputError("give --reference images, or at least 4 --images to split in halves")
        images, reference = images[len(images) // 2 :], images[: len(images) // 2]
    cfg = from_options(AblationConfig, args, device=str(resolve_device(args.device)))
    label = f"{model.label} ({'RANDOM INIT' if model.random_init else 'trained'})"
    notes = [RANDOM_INIT_NOTE] if model.random_init else []
    report = run_ablation(model.model, images, reference, label, cfg, notes)
    figure = ablation_figure(report, args.dpi)
    files = report.write(args.out) + save_figure(figure, args.out / "ablation", tuple(args.formats))
    print(report.table())
    print(f"wrote {len(files)} files to {args.out}")


def _position(args: argparse.Namespace) -> None:
    from vit5.viz import (
        MapStyle,
        PositionProbeConfig,
        position_figure,
        run_position_probe,
        save_figure,
        write_probes,
    )

    cfg = from_options(PositionProbeConfig, args, device=str(resolve_device(args.device)))
    overrides = per_model_args(args)
    common = set.intersection(*(set(items) for items in overrides))  # labels name only what differs
    probes = []
    for model, items in zip(_load(args), overrides):  # every model loads before any is probed
        kind = "RANDOM INIT" if model.random_init else "trained"
        label = " ".join([model.label, *(i for i in items if i not in common), f"({kind})"])
        probes.append(run_position_probe(model.model, label, cfg))
        s = probes[-1].summary()
        print(
            f"  block {s['layer']}: constant-image spatial share {s['constant_spatial_share']:.4f}, "
            f"noise-image position share {s['noise_position_share']:.4f}"
        )
    style = from_options(MapStyle, args)
    files = [
        write_probes(probes, args.out),
        *save_figure(position_figure(probes, style), args.out / "position_probe", style.formats),
    ]
    print(f"wrote {len(files)} files to {args.out}")


def _config(args: argparse.Namespace) -> RunConfig:
    from vit5.viz import VIEWS, MapStyle, MetricConfig, PlantSpec, RunConfig, load_thresholds

    thresholds, source = load_thresholds(args.threshold_from) if args.threshold_from else (None, "")
    plant = None
    if args.plant_layer is not None or args.plant_at:
        if args.plant_layer is None or not args.plant_at:
            raise InputError("planting needs both --plant-layer and at least one --plant-at ROW COL")
        plant = PlantSpec(args.plant_layer, tuple(tuple(rc) for rc in args.plant_at), args.plant_scale)
    return from_options(
        RunConfig,
        args,
        views=frozenset(SUBCOMMANDS[args.command][0] or VIEWS),
        device=str(resolve_device(args.device)),
        style=from_options(MapStyle, args),
        metrics=from_options(MetricConfig, args, thresholds=thresholds, threshold_source=source),
        plant=plant,
    )


def _relabel(model: LoadedModel, label: str | None) -> LoadedModel:
    if label is not None and not label.strip():
        raise InputError("--label / --label-b must name the model: give a non-empty TEXT")
    return model if label is None else replace(model, label=label)


def main(argv: list[str] | None = None, prog: str = "vit5 viz") -> int:
    """Entry point of ``vit5 viz``; returns the exit status (2 after one ``error:`` line on bad input)."""
    safe_console()
    one_line_warnings()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["study"]:
        from vit5.cli.study import main as study_main

        return study_main(argv[1:])
    args = build_parser(prog).parse_args(argv)
    return run_command(lambda: _run(args), args.out)


def _run(args: argparse.Namespace) -> None:
    from vit5.viz import NeuronSearch, run_compare, run_model, run_ttr

    check_output_dir(args.out, "--out")
    if args.command in ("ablate", "position"):
        (_ablate if args.command == "ablate" else _position)(args)
        return
    cfg = _config(args)
    if args.command == "compare":
        model, model_b = _load(args, [args.model, args.model_b], [args.model_args, args.model_b_args])
        run_compare(_relabel(model, args.label), _relabel(model_b, args.label_b), args.images, cfg)
    elif args.command == "ttr":
        search = NeuronSearch(args.detect_layer, args.top_layer, args.neurons, args.k, args.threshold)
        run_ttr(_relabel(*_load(args), args.label), args.images, cfg, search, args.count)
    else:
        run_model(_relabel(*_load(args), args.label), args.images, cfg)
