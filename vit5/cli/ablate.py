"""``vit5 ablate``: the ViT-5 component ablations, each variant trained and compared (vit5.bench.ablate)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from vit5.cli import Parser, run_command
from vit5.errors import safe_console

# the keys of vit5.bench.ablate.ABLATIONS and SCALES, named here so --help loads no torch
ABLATION_NAMES = "full,no_layerscale,no_rope,no_registers,layernorm,no_qk_norm,qkv_bias,swiglu,deit3,vanilla"
SCALE_NAMES = ("digits", "fashion_mnist", "imagenet")
SCALE_HELP = (
    "digits (default): the demo recipe at a reduced budget, for a CPU; fashion_mnist: the Fashion-MNIST "
    "CPU recipe at two epochs of a smaller model, scored on the test split, needs data.root=DIR of "
    "`vit5 data fashion-mnist DIR`; imagenet: configs/vit5_small_in1k.yaml, needs data.root=..."
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    fmt = argparse.RawDescriptionHelpFormatter
    p = Parser(prog="vit5 ablate", description=__doc__.split("\n")[0], formatter_class=fmt)
    p.add_argument("--scale", choices=SCALE_NAMES, default="digits", help=SCALE_HELP)
    p.add_argument("--config", type=Path, help="base training recipe instead of the scale's")
    p.add_argument("--seeds", type=int, nargs="+", help="seeds (default: the scale's)")
    p.add_argument("--epochs", type=int, help="epochs per run (default: the scale's)")
    p.add_argument("--only", help=f"comma-separated ablations (full is always run): {ABLATION_NAMES}")
    p.add_argument("--out", type=Path, help="output directory (default runs/ablate_<scale>)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep finished runs' checkpoints/")
    p.add_argument("--list", action="store_true", help="print the ablations and their overrides, then exit")
    overrides_help = "training-config overrides for every run, e.g. data.batch_size=32"
    p.add_argument("overrides", nargs="*", metavar="key=value", help=overrides_help)
    return p.parse_args(argv)


def plan_from_args(args: argparse.Namespace):
    """The :class:`~vit5.bench.ablate.AblationPlan` the command line asks for; bad input: InputError."""
    from vit5.bench.ablate import plan_for

    return plan_for(**{k: v for k, v in vars(args).items() if k != "list"})


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 every run completed, 1 some diverged, 2 bad arguments, config or data."""
    safe_console()
    args = parse_args(argv)
    return run_command(lambda: _ablate(args))


def _ablate(args: argparse.Namespace) -> int:
    from vit5.bench.ablate import ABLATIONS, run_ablation
    from vit5.bench.report import markdown_table

    if args.list:
        for a in ABLATIONS.values():
            print(f"{a.name:14s} {a.what}\n{'':14s} {' '.join(a.overrides) or '(the base config)'}")
        return 0
    result = run_ablation(plan_from_args(args))
    if result.section is not None:
        print(*("\n" + markdown_table(table) for table in result.section.tables), sep="\n")
        print("\n" + "\n".join(f"- {note}" for note in result.section.notes))
        print(f"\nreport: {result.report} (and report.json)")
    return 0 if all(r.completed for r in result.records) else 1
