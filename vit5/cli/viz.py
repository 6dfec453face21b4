"""Command line for vit5.viz:
``vit5 viz {attention,norms,compare,pca,metrics,all,ttr,ablate,position,study} ...`` (``python -m viz``
is the same).

Thin: parses options into :class:`vit5.viz.RunConfig` (or the analysis' own config) and calls
:func:`vit5.viz.run_model`, :func:`vit5.viz.run_compare`, :func:`vit5.viz.run_ttr`,
:func:`vit5.viz.run_ablation` or :func:`vit5.viz.run_position_probe`; ``study`` is the register
study's own command line (:mod:`vit5.study.run`). Bad input ends with one ``error: ...`` line and exit
code 2.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from vit5.cli import SIZE_HELP, Parser, add_weights_option, parse_size, run_command
from vit5.errors import InputError, one_line_warnings, safe_console
from vit5.files import check_output_dir
from vit5.plotstyle import DPI
from vit5.runtime import DEVICE_HELP, resolve_device

if TYPE_CHECKING:
    from vit5.introspect.spec import LoadedModel
    from vit5.viz import RunConfig

# the library's names (vit5.viz.register_ablation.METHODS / PLACES, vit5.model.footprint.DEFAULT_MAX_PARAMS),
# named here so that --help loads no torch; tests/test_cli.py holds them equal
ABLATION_METHODS = ("zeros", "mean", "shuffle", "noise")
ABLATION_PLACES = ("input", "blocks")
DEFAULT_MAX_PARAMS = 2_000_000_000

MODEL_HELP = (
    "model spec: a vit5 preset with its released weights (vit5_small) or a released name "
    "(vit5_base_patch16_384.in1k), PRESET@WEIGHTS, a vit5 checkpoint directory, a checkpoint file (official "
    "ViT-5 .pth), hf-hub:USER/REPO, or timm:NAME[.TAG][@CHECKPOINT] (timm's pretrained weights unless "
    "@CHECKPOINT)"
)
SUBCOMMANDS = {
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
    "all": (None, "every figure and the metrics table for one model"),  # None: every view
    "compare": (set(), "two models side by side with shared colour scales (the garbage-collector figure)"),
    "ttr": (
        set(),
        "test-time registers: find the register neurons, then the model without and with an extra token",
    ),
}
ANALYSES = {
    "ablate": "register ablation at inference: zeros / mean / shuffled / noise registers, at the input or "
    "after every block; change in top-1, kNN accuracy, patch-feature cosine",
    "position": "position-artifact probe: norm and PCA maps of constant and noise images, "
    "for one or more models",
}
STUDY_HELP = (
    "the register study: train twins without / with registers on digit canvases, tracking the artifact "
    "metrics (resumable; `vit5 viz study --help`)"
)


def _common(p: argparse.ArgumentParser, compare: bool) -> None:
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument(
        "--model-args",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="overrides for the model: vit5 config fields or timm.create_model kwargs (e.g. depth=2 "
        "img_size=64)",
    )
    add_weights_option(p, subject="checkpoint(s)")
    p.add_argument(
        "--label",
        metavar="TEXT",
        help="name of --model in titles, legends and tables (default: from its spec, e.g. demo-final)",
    )
    p.add_argument(
        "--random-init",
        action="store_true",
        help="build bare architecture names (vit5_tiny, timm:NAME) untrained instead of with their "
        "pretrained weights; checkpoints load as usual; every figure and table says random-init",
    )
    if compare:
        p.add_argument(
            "--model-b",
            required=True,
            help="second model (same spec forms); uses --model's outlier thresholds",
        )
        p.add_argument(
            "--model-b-args", nargs="+", default=[], metavar="KEY=VALUE", help="overrides for --model-b"
        )
        p.add_argument(
            "--label-b",
            metavar="TEXT",
            help="name of --model-b in titles, legends and tables (default: its spec)",
        )
        p.add_argument(
            "--own-thresholds",
            action="store_true",
            help="score --model-b with its own outlier thresholds (default: reuse --model's, for twins)",
        )
    p.add_argument(
        "--images",
        nargs="+",
        required=True,
        metavar="PATH",
        help="image files, folders (searched recursively) or 'sklearn-samples' (scikit-learn's two photos)",
    )
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument(
        "--layers",
        nargs="+",
        type=int,
        default=[-1],
        help="blocks drawn in per-image figures (negative counts from the end; default: the last). "
        "Metrics always cover every block",
    )
    p.add_argument(
        "--size",
        type=parse_size,
        metavar="N|HxW",
        help=f"input size, {SIZE_HELP}; images are resized to cover it and centre-cropped. Default: the "
        "images' aspect kept, short side = the model's (a patch multiple), long side = short x the images' "
        "median aspect rounded to a patch multiple",
    )
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument(
        "--max-params",
        type=float,
        metavar="N",
        help="refuse vit5 models larger than N parameters before building them (default "
        f"{DEFAULT_MAX_PARAMS:.0e})",
    )
    p.add_argument(
        "--max-figures",
        type=int,
        default=16,
        help="per-image figures and summary rows for the first N images",
    )
    g = p.add_argument_group("maps")
    g.add_argument(
        "--renorm",
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
        type=float,
        metavar="PCT",
        help="clip colour scales at this percentile (stated on the figure; default: no clipping)",
    )
    g.add_argument("--formats", nargs="+", default=["png", "pdf"], choices=("png", "pdf", "svg"))
    g.add_argument("--dpi", type=int, default=DPI, help=f"PNG resolution (default {DPI})")
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
    m.add_argument(
        "--top-k", type=int, help="keys in the top-K sink mass (default: the register count, or 4)"
    )
    m.add_argument(
        "--bootstrap", type=int, default=1000, help="bootstrap resamples over images (default 1000)"
    )
    m.add_argument(
        "--save-raw",
        choices=("npz", "safetensors"),
        help="also save the raw per-token norms and attention rows",
    )
    k = p.add_argument_group("planted artifacts (a pipeline self-check; every output is labelled PLANTED)")
    k.add_argument("--plant-layer", type=int, help="block whose output gets planted high-norm tokens")
    k.add_argument(
        "--plant-at",
        nargs=2,
        type=int,
        action="append",
        metavar=("ROW", "COL"),
        help="patch to plant (repeatable)",
    )
    k.add_argument(
        "--plant-scale", type=float, default=20.0, help="norm multiplier of planted tokens (default 20)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


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
        p = sub.add_parser(name, help=help_text, description=help_text)
        _common(p, compare=name == "compare")
        if name == "attention":
            p.add_argument(
                "--registers",
                action="store_true",
                help="require register maps (error for a model without registers)",
            )
        if name == "ttr":
            t = p.add_argument_group("register-neuron search (Jiang et al. 2025, Algorithm 1)")
            t.add_argument(
                "--detect-layer",
                type=int,
                help="block whose outliers are traced (default: highest outlier ratio)",
            )
            t.add_argument(
                "--top-layer", type=int, help="search neurons in blocks <= this (default: the detect block)"
            )
            t.add_argument(
                "--neurons", type=int, default=10, help="register neurons to keep (top k; default 10)"
            )
            t.add_argument("--count", type=int, default=1, help="test-time registers to append (default 1)")
    p = sub.add_parser("ablate", help=ANALYSES["ablate"], description=ANALYSES["ablate"])
    _model_args(p)
    p.add_argument(
        "--images",
        nargs="+",
        required=True,
        metavar="PATH",
        help="images to evaluate: files, folders, digits-val / digits-train (labelled), sklearn-samples",
    )
    p.add_argument(
        "--reference",
        nargs="+",
        metavar="PATH",
        help="reference images (register means, kNN bank); default: the first half of --images",
    )
    p.add_argument(
        "--folder-labels", action="store_true", help="folders are ImageFolders: label = class subfolder"
    )
    p.add_argument("--methods", nargs="+", default=list(ABLATION_METHODS), choices=ABLATION_METHODS)
    p.add_argument("--places", nargs="+", default=list(ABLATION_PLACES), choices=ABLATION_PLACES)
    p.add_argument("--knn-k", type=int, default=20)
    p.add_argument(
        "--max-images", type=int, help="use at most the first N images of --images and of --reference"
    )
    _run_args(p)
    p = sub.add_parser("position", help=ANALYSES["position"], description=ANALYSES["position"])
    p.add_argument(
        "--model",
        action="append",
        required=True,
        help="a model spec (same forms as above); repeat --model for several models, shown side by side",
    )
    p.add_argument(
        "--model-args",
        action="append",
        nargs="+",
        metavar="KEY=VALUE",
        help="overrides: given once, for every model; repeated, one per --model in order (e.g. ape=False)",
    )
    add_weights_option(p, subject="checkpoints")
    _init_args(p)
    p.add_argument("--layer", type=int, default=-1, help="block whose output is probed (default: the last)")
    p.add_argument(
        "--levels",
        nargs="+",
        type=float,
        default=[0.0, 0.25, 0.5, 0.75, 1.0],
        help="constant grey levels in [0, 1]",
    )
    p.add_argument("--noise-images", type=int, default=16)
    _run_args(p)
    sub.add_parser("study", help=STUDY_HELP, add_help=False)  # parsed by vit5.study.run
    return parser


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--model-args", nargs="+", default=[], metavar="KEY=VALUE", help="overrides for the model")
    add_weights_option(p)
    _init_args(p)


def _init_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--random-init",
        action="store_true",
        help="build bare architecture names untrained instead of with their pretrained weights "
        "(every table and figure says random-init)",
    )
    p.add_argument(
        "--max-params",
        type=float,
        metavar="N",
        help="refuse vit5 models larger than N parameters before building them (default "
        f"{DEFAULT_MAX_PARAMS:.0e})",
    )


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument(
        "--size", type=parse_size, metavar="N|HxW", help=f"input size, {SIZE_HELP} (default: the model's own)"
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--formats", nargs="+", default=["png", "pdf"], choices=("png", "pdf", "svg"))
    p.add_argument("--dpi", type=int, default=DPI, help=f"PNG resolution (default {DPI})")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _limit(args: argparse.Namespace) -> dict[str, float]:
    return {"max_params": args.max_params} if args.max_params is not None else {}


def _ablate(args: argparse.Namespace) -> None:
    from vit5.introspect.spec import random_init_flags
    from vit5.viz import (
        AblationConfig,
        ablation_figure,
        describe,
        load_images,
        load_model_spec,
        parse_overrides,
        run_ablation,
        save_figure,
    )
    from vit5.viz.runner import RANDOM_INIT_NOTE

    (random_init,) = random_init_flags([args.model], args.random_init)
    model = load_model_spec(
        args.model, {**parse_overrides(args.model_args), **_limit(args)}, args.weights == "ema", random_init
    )
    print(f"model: {model.description}")
    info = describe(model.model)
    size = tuple(args.size or info.img_size)
    limit = args.max_images
    if args.reference:
        images, _ = load_images(args.images, size, info.patch_size, args.folder_labels, limit)
        reference, _ = load_images(args.reference, size, info.patch_size, args.folder_labels, limit)
    else:
        images, _ = load_images(args.images, size, info.patch_size, args.folder_labels, limit and 2 * limit)
        if len(images) < 4:
            raise InputError("give --reference images, or at least 4 --images to split in halves")
        images, reference = images[len(images) // 2 :], images[: len(images) // 2]
    cfg = AblationConfig(
        tuple(args.methods),
        tuple(args.places),
        args.knn_k,
        batch_size=args.batch_size,
        device=str(resolve_device(args.device)),
    )
    notes = [RANDOM_INIT_NOTE] if model.random_init else []
    label = f"{model.label} ({'RANDOM INIT' if model.random_init else 'trained'})"
    report = run_ablation(model.model, images, reference, label, cfg, notes)
    files = report.write(args.out) + save_figure(
        ablation_figure(report, args.dpi), args.out / "ablation", tuple(args.formats)
    )
    print(report.table())
    print(f"wrote {len(files)} files to {args.out}")


def _position(args: argparse.Namespace) -> None:
    from vit5.introspect.spec import random_init_flags
    from vit5.viz import (
        MapStyle,
        PositionProbeConfig,
        load_model_spec,
        parse_overrides,
        position_figure,
        run_position_probe,
        save_figure,
        write_probes,
    )

    cfg = PositionProbeConfig(
        tuple(args.size) if args.size else None,
        tuple(args.levels),
        args.noise_images,
        args.layer,
        device=str(resolve_device(args.device)),
    )
    overrides = args.model_args or [[]]
    if len(overrides) == 1:
        overrides = overrides * len(args.model)
    if len(overrides) != len(args.model):
        raise InputError(
            f"give --model-args once (for every model) or once per --model: got {len(overrides)} for "
            f"{len(args.model)} models"
        )
    common = set.intersection(*(set(items) for items in overrides))  # labels name only what differs
    flags = random_init_flags(args.model, args.random_init)
    models = [  # every model loads before any is probed: a spec that cannot load fails at once
        load_model_spec(spec, {**parse_overrides(items), **_limit(args)}, args.weights == "ema", untrained)
        for spec, items, untrained in zip(args.model, overrides, flags)
    ]
    probes = []
    for model, items in zip(models, overrides):
        print(f"model: {model.description}")
        kind = "RANDOM INIT" if model.random_init else "trained"
        label = " ".join([model.label, *(i for i in items if i not in common), f"({kind})"])
        probe = run_position_probe(model.model, label, cfg)
        probes.append(probe)
        summary = probe.summary()
        print(
            f"  block {summary['layer']}: constant-image spatial share "
            f"{summary['constant_spatial_share']:.4f}, "
            f"noise-image position share {summary['noise_position_share']:.4f}"
        )
    style = MapStyle(dpi=args.dpi, formats=tuple(args.formats))
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
    device = str(resolve_device(args.device))
    return RunConfig(
        out=args.out,
        views=frozenset(SUBCOMMANDS[args.command][0] or VIEWS),
        size=tuple(args.size) if args.size else None,
        layers=tuple(args.layers),
        batch_size=args.batch_size,
        device=device,
        max_figures=args.max_figures,
        renormalise=args.renorm,
        require_registers=getattr(args, "registers", False),
        reuse_thresholds=not getattr(args, "own_thresholds", False),
        save_raw=args.save_raw,
        style=MapStyle(
            args.cmap,
            args.alpha,
            args.upsample,
            args.clip,
            args.dpi,
            formats=tuple(args.formats),
            title=args.title,
        ),
        metrics=MetricConfig(
            k=args.k,
            threshold=args.threshold,
            thresholds=thresholds,
            threshold_source=source,
            eps=args.eps,
            top_k=args.top_k,
            n_boot=args.bootstrap,
        ),
        plant=plant,
        progress=not args.quiet,
    )


def _relabel(model: LoadedModel, label: str | None) -> LoadedModel:
    if label is None:
        return model
    if not label.strip():
        raise InputError("--label / --label-b must name the model: give a non-empty TEXT")
    return replace(model, label=label)


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
    from vit5.introspect.spec import random_init_flags
    from vit5.viz import NeuronSearch, load_model_spec, parse_overrides, run_compare, run_model, run_ttr

    limit = _limit(args)
    check_output_dir(args.out, "--out")
    if args.command in ANALYSES:
        (_ablate if args.command == "ablate" else _position)(args)
        return
    cfg = _config(args)
    specs = [args.model] + ([args.model_b] if args.command == "compare" else [])
    random_a, *random_b = random_init_flags(specs, args.random_init)
    model = load_model_spec(
        args.model, {**parse_overrides(args.model_args), **limit}, args.weights == "ema", random_a
    )
    model = _relabel(model, args.label)
    print(f"model: {model.description}")
    if args.command == "compare":
        overrides_b = {**parse_overrides(args.model_b_args), **limit}
        model_b = load_model_spec(args.model_b, overrides_b, args.weights == "ema", random_b[0])
        model_b = _relabel(model_b, args.label_b)
        print(f"model B: {model_b.description}")
        run_compare(model, model_b, args.images, cfg)
    elif args.command == "ttr":
        search = NeuronSearch(args.detect_layer, args.top_layer, args.neurons, args.k, args.threshold)
        run_ttr(model, args.images, cfg, search, args.count)
    else:
        run_model(model, args.images, cfg)


if __name__ == "__main__":
    sys.exit(main())
