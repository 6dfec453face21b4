"""``vit5 viz COMMAND``: the figures and metrics of :mod:`vit5.viz` for one model, two side by side or
with test-time registers; the register ablation, the position probe, and the register study (vit5.study)."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from vit5.cli import (
    Parser,
    add_model_options,
    from_options,
    model_request,
    opt,
    per_model_args,
    run_main,
    size_option,
)
from vit5.errors import InputError
from vit5.files import check_output_dir
from vit5.plotstyle import DPI
from vit5.runtime import resolve_device

if TYPE_CHECKING:
    from vit5.introspect.load import LoadedModel, ModelRequest
    from vit5.study.run import StudyConfig
    from vit5.viz import RunConfig

# vit5.viz.register_ablation.METHODS / PLACES and the keys of vit5.study.run.PRESETS, named here so that
# --help loads no torch (tests: equal)
ABLATION_METHODS = ("zeros", "mean", "shuffle", "noise")
ABLATION_PLACES = ("input", "blocks")
STUDY_PRESETS = ("full", "smoke")

SUBCOMMANDS = {  # name -> help
    "attention": "CLS-to-patch maps per head and mean, register maps, rollout",
    "norms": "token-norm maps, per-layer norm histograms, layer profile, massive activations",
    "pca": "PCA of the patch features as RGB",
    "metrics": "per-layer artifact metrics with bootstrap intervals: JSON, CSV and a table",
    "all": "every figure and the metrics table for one model",
    "compare": "two models side by side with shared colour scales (the garbage-collector figure)",
    "ttr": "test-time registers: find the register neurons, then the model without and with an extra token",
    "ablate": "register ablation at inference: zeros / mean / shuffled / noise registers, at the input or "
    "after every block; change in top-1, kNN accuracy, patch-feature cosine",
    "position": "position-artifact probe: norm and PCA maps of constant and noise images, for one or more "
    "models",
    "study": "the register study: train twins without / with registers on digit canvases that reward a "
    "storage token, tracking the artifact metrics through training (resumable: rerun the same command)",
}
DRAWS = {  # the views a subcommand draws; the others: every view
    "attention": {"attention", "registers", "rollout"},
    "norms": {"norms", "histograms", "profile", "massive"},
    "pca": {"pca"},
    "metrics": {"metrics"},
}
ASPECT_SIZE = (
    "; images are resized to cover it and centre-cropped. Default: the images' aspect kept, short side = the "
    "model's (a patch multiple), long side = short x the images' median aspect rounded to a patch multiple"
)


def _label(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must name the model: give a non-empty TEXT")
    return text


def _outputs(
    p: argparse.ArgumentParser,
    batch_size: int,
    size: str | None,
    images: str | None,
) -> None:
    """The input and output options; ``size``: what no --size means (None: the model's own size);
    ``images``: the help of ``--images`` (None: no such option)."""
    if images:
        opt(p, "--images", None, images, nargs="+", required=True, metavar="PATH")
    opt(p, "--out", Path, "output directory", required=True)
    size_option(p, size)
    opt(p, "--batch-size", batch_size)
    opt(p, "--formats", ["png", "pdf"], choices=("png", "pdf", "svg"))
    opt(p, "--dpi", DPI, "PNG resolution")
    opt(p, "--quiet", False, "no progress bar")


def _views(p: argparse.ArgumentParser, name: str) -> None:
    add_model_options(p)
    label = "name of --model in titles, legends, tables (default: from its spec)"
    opt(p, "--label", _label, label, metavar="TEXT")
    if name == "compare":
        opt(p, "--model-b", None, "second model (same spec forms)", required=True)
        opt(p, "--model-b-args", [], "overrides for --model-b", metavar="KEY=VALUE")
        opt(p, "--label-b", _label, "like --label, for --model-b", metavar="TEXT")
        own = (
            "score --model-b with its own outlier thresholds (default: reuse --model's, for twins)"
        )
        opt(p, "--own-thresholds", False, own)
    if name == "attention":
        registers = "require register maps (error for a model without registers)"
        opt(p, "--registers", False, registers, dest="require_registers")
    images = "image files, folders (searched recursively) or 'sklearn-samples' (scikit-learn's two photos)"
    _outputs(p, 8, ASPECT_SIZE, images)
    layers = "blocks drawn in per-image figures (negative counts from the end; default: the last). Metrics "
    opt(p, "--layers", [-1], layers + "always cover every block")
    opt(p, "--max-figures", 16, "per-image figures and summary rows: the first N images")
    g = p.add_argument_group("maps")
    renorm = "CLS maps renormalised over patches (default: raw, the share of all tokens)"
    opt(g, "--renorm", False, renorm, dest="renormalise")
    upsample = "map upsampling to pixels (default nearest: shows the token grid)"
    opt(g, "--upsample", "nearest", upsample, choices=("nearest", "bilinear"))
    opt(g, "--cmap", "viridis")
    opt(g, "--alpha", 0.5, "overlay opacity")
    clip = "clip colour scales at this percentile (stated on the figure; default: no clipping)"
    opt(g, "--clip", float, clip, dest="clip_percentile", metavar="PCT")
    title = "title of every figure instead of the generated one ('' for none, e.g. for a paper's caption)"
    opt(g, "--title", None, title, metavar="TEXT")
    m = p.add_argument_group("metrics")
    opt(m, "--k", 5.0, "outlier threshold: median + k * MAD of log-norms")
    opt(
        m,
        "--threshold",
        float,
        "explicit outlier norm threshold for every layer (instead of k * MAD)",
    )
    reuse = "reuse the per-layer thresholds of a reference model's metrics.json (e.g. its no-register twin)"
    opt(m, "--threshold-from", Path, reuse, metavar="METRICS_JSON")
    opt(m, "--eps", 0.3, "sink-rate epsilon")
    opt(m, "--top-k", int, "keys in the top-K sink mass (default: register count, or 4)")
    opt(m, "--bootstrap", 1000, "bootstrap resamples over images", dest="n_boot", metavar="N")
    raw = "also save raw per-token norms and attention rows"
    opt(m, "--save-raw", None, raw, choices=("npz", "safetensors"))
    k = p.add_argument_group(
        "planted artifacts (a pipeline self-check; every output is labelled PLANTED)",
    )
    opt(k, "--plant-layer", int, "block whose output gets planted high-norm tokens")
    opt(
        k,
        "--plant-at",
        int,
        "patch (repeatable)",
        nargs=2,
        action="append",
        metavar=("ROW", "COL"),
    )
    opt(k, "--plant-scale", 20.0, "planted-token norm factor")
    if name == "ttr":
        t = p.add_argument_group("register-neuron search (Jiang et al. 2025, Algorithm 1)")
        opt(t, "--detect-layer", int, "block whose outliers are traced (default: most outliers)")
        opt(t, "--top-layer", int, "search blocks <= this (default: the detect block)")
        opt(t, "--neurons", 10, "register neurons to keep (top k)")
        opt(t, "--count", 1, "test-time registers to append")


def build_parser(prog: str = "vit5 viz") -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog,
        description="Attention maps, token norms and the register 'garbage collector' effect, as figures "
        "and numbers.",
        epilog="Example: vit5 viz all --model vit5_tiny --random-init --model-args depth=4 --images "
        "sklearn-samples --out runs/viz",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    parsers = {}
    for name, text in SUBCOMMANDS.items():
        parsers[name] = p = sub.add_parser(name, help=text, description=text)
        if name not in ("ablate", "position", "study"):
            _views(p, name)
    p = parsers["ablate"]
    add_model_options(p)
    reference = "reference images (register means, kNN bank); default: the first half of --images"
    opt(p, "--reference", None, reference, nargs="+", metavar="PATH")
    opt(p, "--folder-labels", False, "ImageFolders: label = class subfolder")
    opt(p, "--methods", list(ABLATION_METHODS), choices=ABLATION_METHODS)
    opt(p, "--places", list(ABLATION_PLACES), choices=ABLATION_PLACES)
    opt(p, "--knn-k", 20)
    opt(p, "--max-images", int, "at most the first N of --images and of --reference")
    images = (
        "images to evaluate: files, folders, digits-val / digits-train (labelled), sklearn-samples"
    )
    _outputs(p, 32, None, images)
    p = parsers["position"]
    add_model_options(p, several=True)
    opt(p, "--layer", -1, "block whose output is probed (default: the last)")
    opt(p, "--levels", [0.0, 0.25, 0.5, 0.75, 1.0], "constant grey levels in [0, 1]")
    opt(p, "--noise-images", 16)
    _outputs(p, 32, None, None)
    p = parsers["study"]
    opt(p, "--out", Path, "study folder (created; rerun to resume)", required=True)
    opt(
        p,
        "--preset",
        "full",
        "full (default): the README study; smoke: seconds",
        choices=STUDY_PRESETS,
    )
    settings = "override settings, e.g. steps=500 lr=3e-3 background=noise model.qk_norm=False"
    opt(p, "--set", [], settings, metavar="KEY=VALUE", dest="settings")
    opt(
        p,
        "--max-minutes",
        float,
        "stop at the first checkpoint after this many minutes (resumable)",
    )
    skip = "skip the register ablation / test-time register analyses"
    opt(p, "--no-analysis", False, skip)
    analyse = "no training: write the figure, verdict and analyses of the twins as they are now"
    opt(p, "--analyse-only", False, analyse)
    opt(p, "--quiet", False, "no progress bar")
    return parser


def parse_settings(base: StudyConfig, items: Sequence[str]) -> StudyConfig:
    """``KEY=VALUE`` overrides of StudyConfig or CanvasConfig fields, or ``model.KEY`` (ViT5Config)."""
    from vit5.data.digits.canvases import CanvasConfig
    from vit5.introspect.load import parse_model_args as parse_overrides
    from vit5.study.run import StudyConfig

    study_keys = {f.name for f in fields(StudyConfig)} - {"canvas", "model_args"}
    canvas_keys = {f.name for f in fields(CanvasConfig)}
    study = {}
    canvas = {}
    model = dict(base.model_args)
    for key, value in parse_overrides(items).items():
        if key.startswith("model."):
            model[key[len("model.") :]] = value
        elif key in study_keys | canvas_keys:
            (study if key in study_keys else canvas)[key] = value
        else:
            close = difflib.get_close_matches(key, sorted(study_keys | canvas_keys), n=1)
            hint = "use a StudyConfig or CanvasConfig field, or model.<ViT5Config field>"
            hint = f"did you mean {close[0]!r}?" if close else hint
            raise InputError(f"unknown study setting {key!r}: {hint}")
    try:
        canvas_cfg = replace(base.canvas, **canvas)
        return replace(base, canvas=canvas_cfg, model_args=tuple(model.items()), **study)
    except TypeError as err:
        raise InputError(f"bad study setting: {err}") from None


def main(argv: Sequence[str] | None = None, prog: str = "vit5 viz") -> int:
    return run_main(build_parser(prog).parse_args, argv, _run)


def _study(args: argparse.Namespace) -> None:
    from vit5.study.run import PRESETS, run_study

    result = from_options(
        run_study,
        args,
        cfg=parse_settings(PRESETS[args.preset], args.settings),
        progress=not args.quiet,
        analyse=not args.no_analysis,
        train=not args.analyse_only,
    )
    print(f"wrote {len(result.files)} files to {args.out}")


def _request(args: argparse.Namespace) -> ModelRequest:
    """The models of a subcommand: each must be a ViT whose attention can be recorded."""
    if args.command == "compare":
        return model_request(
            args,
            specs=[args.model, args.model_b],
            items=[args.model_args, args.model_b_args],
            labels=(args.label, args.label_b),
            require="recording",
        )
    labels = (args.label,) if hasattr(args, "label") else ()  # ablate, position: no --label
    return model_request(args, labels=labels, require="recording")


def _run(args: argparse.Namespace) -> None:
    from vit5.introspect.load import load_models
    from vit5.viz import NeuronSearch, run_compare, run_model, run_ttr

    if args.command == "study":
        return _study(args)
    # a bad --device or --out fails before any work
    args.device = str(resolve_device(args.device))
    check_output_dir(args.out, "--out")
    models = load_models(_request(args))
    for loaded in models:
        print(f"model: {loaded.description}")
    if args.command == "ablate":
        return _ablate(args, models[0])
    if args.command == "position":
        return _position(args, models)
    cfg = _config(args)
    if args.command == "compare":
        run_compare(models[0], models[1], args.images, cfg)
    elif args.command == "ttr":
        search = NeuronSearch(
            detect_layer=args.detect_layer,
            top_layer=args.top_layer,
            top_k=args.neurons,
            k=args.k,
            threshold=args.threshold,
        )
        run_ttr(models[0], args.images, cfg, search, args.count)
    else:
        run_model(models[0], args.images, cfg)


def _ablate(args: argparse.Namespace, model: LoadedModel) -> None:
    from vit5.viz import AblationConfig, ablation_figure, load_images, run_ablation, save_figure
    from vit5.viz.runner import RANDOM_INIT_NOTE

    info = model.info
    size = tuple(args.size or info.img_size)
    limit = args.max_images

    def load(paths: list[str], limit: int | None) -> list:
        return load_images(paths, size, info.patch_size, args.folder_labels, limit)[0]

    if args.reference:
        images = load(args.images, limit)
        reference = load(args.reference, limit)
    else:
        images = load(args.images, limit and 2 * limit)
        if len(images) < 4:
            raise InputError("give --reference images, or at least 4 --images to split in halves")
        half = len(images) // 2
        reference = images[:half]
        images = images[half:]
    kind = "RANDOM INIT" if model.random_init else "trained"
    label = f"{model.label} ({kind})"
    notes = [RANDOM_INIT_NOTE] if model.random_init else []
    settings = from_options(AblationConfig, args)
    report = run_ablation(model.model, images, reference, label, settings, notes)
    figure = ablation_figure(report, args.dpi)
    saved = save_figure(figure, args.out / "ablation", tuple(args.formats))
    files = report.write(args.out) + saved
    print(report.table())
    print(f"wrote {len(files)} files to {args.out}")


def _position(args: argparse.Namespace, models: list[LoadedModel]) -> None:
    from vit5.viz import MapStyle, save_figure
    from vit5.viz.position import (
        PositionProbeConfig,
        position_figure,
        run_position_probe,
        write_probes,
    )

    cfg = from_options(PositionProbeConfig, args)
    style = from_options(MapStyle, args)
    overrides = per_model_args(args)
    # labels name only what differs
    common = set.intersection(*(set(items) for items in overrides))
    probes = []
    for model, items in zip(models, overrides):  # every model loads before any is probed
        kind = "RANDOM INIT" if model.random_init else "trained"
        differs = [i for i in items if i not in common]
        label = " ".join([model.label, *differs, f"({kind})"])
        probes.append(run_position_probe(model.model, label, cfg))
        s = probes[-1].summary()
        print(
            f"  block {s['layer']}: constant-image spatial share "
            f"{s['constant_spatial_share']:.4f}, noise-image position share "
            f"{s['noise_position_share']:.4f}",
        )
    figure = position_figure(probes, style)
    saved = save_figure(figure, args.out / "position_probe", style.formats)
    files = [write_probes(probes, args.out), *saved]
    print(f"wrote {len(files)} files to {args.out}")


def _config(args: argparse.Namespace) -> RunConfig:
    from vit5.viz import VIEWS, MapStyle, MetricConfig, PlantSpec, RunConfig, load_thresholds

    thresholds = None
    source = ""
    if args.threshold_from:
        thresholds, source = load_thresholds(args.threshold_from)
    if (args.plant_layer is not None) != bool(args.plant_at):  # one given without the other
        raise InputError("planting needs both --plant-layer and at least one --plant-at ROW COL")
    at = tuple(map(tuple, args.plant_at or ()))
    plant = None
    if at:
        plant = PlantSpec(layer=args.plant_layer, positions=at, scale=args.plant_scale)
    metrics = from_options(MetricConfig, args, thresholds=thresholds, threshold_source=source)
    return from_options(
        RunConfig,
        args,
        views=frozenset(DRAWS.get(args.command, VIEWS)),
        style=from_options(MapStyle, args),
        metrics=metrics,
        plant=plant,
        progress=not args.quiet,
        reuse_thresholds=not getattr(args, "own_thresholds", False),
    )
