"""``vit5 ablate``: the ViT-5 component ablations, each variant trained and compared (vit5.bench.ablate)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from vit5.bench.ablate import ABLATIONS, SCALES, AblationPlan, run_ablation, select_ablations
from vit5.bench.report import markdown_table
from vit5.cli import Parser, run_command
from vit5.errors import InputError, safe_console
from vit5.train.config import recipe_path


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = Parser(
        prog="vit5 ablate",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--scale",
        choices=tuple(SCALES),
        default="digits",
        help="digits (default): the demo recipe at a reduced budget, for a CPU; fashion_mnist: the "
        "Fashion-MNIST CPU recipe at two epochs of a smaller model, scored on the test split, needs "
        "data.root=DIR of `vit5 data fashion-mnist DIR`; imagenet: configs/vit5_small_in1k.yaml, "
        "needs data.root=...",
    )
    parser.add_argument(
        "--config", type=Path, default=None, help="base training recipe instead of the scale's"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (default: the scale's)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run (default: the scale's)")
    parser.add_argument(
        "--only", default=None, help=f"comma-separated ablations (full is always run): {','.join(ABLATIONS)}"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default runs/ablate_<scale>)"
    )
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep finished runs' checkpoints/")
    parser.add_argument(
        "--list", action="store_true", help="print the ablations and their overrides, then exit"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="training-config overrides for every run, e.g. data.batch_size=32",
    )
    return parser.parse_args(argv)


def plan_from_args(args: argparse.Namespace) -> AblationPlan:
    """The plan the command line asks for; a bad name or value raises InputError."""
    scale = SCALES[args.scale]
    if args.epochs is not None and args.epochs < 1:
        raise InputError(f"--epochs must be at least 1, got {args.epochs}")
    epochs = args.epochs if args.epochs is not None else scale.epochs
    only = [s.strip() for s in args.only.split(",") if s.strip()] if args.only else None
    try:
        ablations = tuple(select_ablations(only))
    except ValueError as e:
        raise InputError(f"--only: {e}") from None
    base = args.config if args.config is not None else recipe_path(scale.config)
    if not base.is_file():
        raise InputError(f"config file {base} does not exist: pass --config PATH to a training recipe")
    out_dir = args.out or Path("runs") / f"ablate_{args.scale}"
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out {out_dir} is a file: give a folder for the runs and the report")
    return AblationPlan(
        base=base,
        ablations=ablations,
        seeds=tuple(args.seeds) if args.seeds is not None else scale.seeds,
        out_dir=out_dir,
        overrides=(*scale.overrides, *([f"schedule.epochs={epochs}"] if epochs else []), *args.overrides),
        timing_batch=scale.timing_batch,
        timing=scale.timing,
        keep_checkpoints=args.keep_checkpoints,
        label=args.scale,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 every run completed, 1 some diverged, 2 bad arguments, config or data."""
    safe_console()
    args = parse_args(argv)
    if args.list:
        for a in ABLATIONS.values():
            print(f"{a.name:14s} {a.what}\n{'':14s} {' '.join(a.overrides) or '(the base config)'}")
        return 0
    return run_command(lambda: _ablate(args))


def _ablate(args: argparse.Namespace) -> int:
    result = run_ablation(plan_from_args(args))
    if result.section is not None:
        for table in result.section.tables:
            print("\n" + markdown_table(table))
        print("\n" + "\n".join(f"- {note}" for note in result.section.notes))
        print(f"\nreport: {result.report} (and report.json)")
    return 0 if all(r.completed for r in result.records) else 1
