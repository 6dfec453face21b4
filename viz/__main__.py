"""Command line for vit5.viz: ``python -m viz {attention,norms,compare,pca,metrics,all} ...``.

Thin: parses options into :class:`vit5.viz.RunConfig` and calls :func:`vit5.viz.run_model` or
:func:`vit5.viz.run_compare`. Bad input ends with one ``viz: error: ...`` line and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vit5.errors import Vit5Error, one_line_warnings, safe_console, user_message
from vit5.files import check_output_dir
from vit5.model.footprint import DEFAULT_MAX_PARAMS
from vit5.model.spec import random_init_flags
from vit5.runtime import DEVICE_HELP, resolve_device
from vit5.viz import (
    VIEWS,
    MapStyle,
    MetricConfig,
    PlantSpec,
    RunConfig,
    VizError,
    load_model_spec,
    load_thresholds,
    parse_overrides,
    run_compare,
    run_model,
)

MODEL_HELP = (
    "model spec: a vit5 preset with its released weights (vit5_small) or a released name "
    "(vit5_base_patch16_384.in1k), PRESET@WEIGHTS, a vit5 checkpoint directory, a checkpoint file (official "
    "ViT-5 .pth), hf-hub:USER/REPO, or timm:NAME[.TAG][@CHECKPOINT] (timm's pretrained weights unless @CHECKPOINT)"
)
SUBCOMMANDS = {
    "attention": ({"attention", "registers", "rollout"}, "CLS-to-patch maps per head and mean, register maps, rollout"),
    "norms": ({"norms", "histograms", "profile"}, "token-norm maps, per-layer norm histograms, layer profile"),
    "pca": ({"pca"}, "PCA of the patch features as RGB"),
    "metrics": ({"metrics"}, "per-layer artifact metrics with bootstrap intervals: JSON, CSV and a table"),
    "all": (set(VIEWS), "every figure and the metrics table for one model"),
    "compare": (set(), "two models side by side with shared colour scales (the garbage-collector figure)"),
}


def _common(p: argparse.ArgumentParser, compare: bool) -> None:
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--model-args", nargs="+", default=[], metavar="KEY=VALUE",
                   help="overrides for the model: vit5 config fields or timm.create_model kwargs (e.g. depth=2 img_size=64)")
    p.add_argument("--ema", action="store_true", help="use the EMA weights of the checkpoint(s)")
    p.add_argument("--random-init", action="store_true",
                   help="build bare architecture names (vit5_tiny, timm:NAME) untrained instead of with their "
                        "pretrained weights; checkpoints load as usual; every figure and table says random-init")
    if compare:
        p.add_argument("--model-b", required=True, help="second model (same spec forms); uses --model's outlier thresholds")
        p.add_argument("--model-b-args", nargs="+", default=[], metavar="KEY=VALUE", help="overrides for --model-b")
        p.add_argument("--own-thresholds", action="store_true",
                       help="score --model-b with its own outlier thresholds (default: reuse --model's, for twins)")
    p.add_argument("--images", nargs="+", required=True, metavar="PATH",
                   help="image files, folders (searched recursively) or 'sklearn-samples' (scikit-learn's two photos)")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--layers", nargs="+", type=int, default=[-1],
                   help="blocks drawn in per-image figures (negative counts from the end; default: the last). "
                        "Metrics always cover every block")
    p.add_argument("--size", nargs=2, type=int, metavar=("H", "W"),
                   help="input size, multiples of the patch size, non-square allowed (default: the model's own size); "
                        "images are resized to cover it and centre-cropped")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--max-params", type=float, metavar="N",
                   help=f"refuse vit5 models larger than N parameters before building them (default {DEFAULT_MAX_PARAMS:.0e})")
    p.add_argument("--max-figures", type=int, default=16, help="per-image figures and summary rows for the first N images")
    g = p.add_argument_group("maps")
    g.add_argument("--renorm", action="store_true",
                   help="CLS maps renormalised over patches (default: raw, the share of all tokens)")
    g.add_argument("--upsample", choices=("nearest", "bilinear"), default="nearest",
                   help="map upsampling to pixels (default nearest: shows the token grid)")
    g.add_argument("--cmap", default="viridis")
    g.add_argument("--alpha", type=float, default=0.5, help="overlay opacity")
    g.add_argument("--clip", type=float, metavar="PCT",
                   help="clip colour scales at this percentile (stated on the figure; default: no clipping)")
    g.add_argument("--formats", nargs="+", default=["png", "pdf"], choices=("png", "pdf", "svg"))
    g.add_argument("--dpi", type=int, default=100)
    m = p.add_argument_group("metrics")
    m.add_argument("--k", type=float, default=5.0, help="outlier threshold: median + k * MAD of log-norms (default 5)")
    m.add_argument("--threshold", type=float, help="explicit outlier norm threshold for every layer (instead of k * MAD)")
    m.add_argument("--threshold-from", type=Path, metavar="METRICS_JSON",
                   help="reuse the per-layer thresholds of a reference model's metrics.json (e.g. its no-register twin)")
    m.add_argument("--eps", type=float, default=0.3, help="sink-rate epsilon (default 0.3)")
    m.add_argument("--top-k", type=int, help="keys in the top-K sink mass (default: the register count, or 4)")
    m.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples over images (default 1000)")
    m.add_argument("--save-raw", choices=("npz", "safetensors"), help="also save the raw per-token norms and attention rows")
    k = p.add_argument_group("planted artifacts (a pipeline self-check; every output is labelled PLANTED)")
    k.add_argument("--plant-layer", type=int, help="block whose output gets planted high-norm tokens")
    k.add_argument("--plant-at", nargs=2, type=int, action="append", metavar=("ROW", "COL"), help="patch to plant (repeatable)")
    k.add_argument("--plant-scale", type=float, default=20.0, help="norm multiplier of planted tokens (default 20)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m viz",
        description="Attention maps, token norms and the register 'garbage collector' effect, as figures and numbers.",
        epilog="Example: python -m viz all --model vit5_tiny --random-init --model-args depth=4 --images sklearn-samples --out runs/viz",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        _common(p, compare=name == "compare")
        if name == "attention":
            p.add_argument("--registers", action="store_true", help="require register maps (error for a model without registers)")
    return parser


def _config(args: argparse.Namespace) -> RunConfig:
    thresholds, source = load_thresholds(args.threshold_from) if args.threshold_from else (None, "")
    plant = None
    if args.plant_layer is not None or args.plant_at:
        if args.plant_layer is None or not args.plant_at:
            raise VizError("planting needs both --plant-layer and at least one --plant-at ROW COL")
        plant = PlantSpec(args.plant_layer, tuple(tuple(rc) for rc in args.plant_at), args.plant_scale)
    device = str(resolve_device(args.device))
    return RunConfig(
        out=args.out, views=frozenset(SUBCOMMANDS[args.command][0]), size=tuple(args.size) if args.size else None,
        layers=tuple(args.layers), batch_size=args.batch_size, device=device, max_figures=args.max_figures,
        renormalise=args.renorm, require_registers=getattr(args, "registers", False),
        reuse_thresholds=not getattr(args, "own_thresholds", False), save_raw=args.save_raw,
        style=MapStyle(args.cmap, args.alpha, args.upsample, args.clip, args.dpi, formats=tuple(args.formats)),
        metrics=MetricConfig(k=args.k, threshold=args.threshold, thresholds=thresholds, threshold_source=source,
                             eps=args.eps, top_k=args.top_k, n_boot=args.bootstrap),
        plant=plant, progress=not args.quiet,
    )


def main(argv: list[str] | None = None) -> int:
    safe_console()
    one_line_warnings()
    args = build_parser().parse_args(argv)
    limit = {"max_params": args.max_params} if args.max_params is not None else {}
    try:
        cfg = _config(args)
        check_output_dir(args.out, "--out")
        specs = [args.model] + ([args.model_b] if args.command == "compare" else [])
        random_a, *random_b = random_init_flags(specs, args.random_init)
        model = load_model_spec(args.model, {**parse_overrides(args.model_args), **limit}, args.ema, random_a)
        print(f"model: {model.description}")
        if args.command == "compare":
            overrides_b = {**parse_overrides(args.model_b_args), **limit}
            model_b = load_model_spec(args.model_b, overrides_b, args.ema, random_b[0])
            print(f"model B: {model_b.description}")
            run_compare(model, model_b, args.images, cfg)
        else:
            run_model(model, args.images, cfg)
    except (Vit5Error, OSError) as err:  # bad input, or a full / read-only disk: one line, no traceback
        print(f"viz: error: {user_message(err)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
