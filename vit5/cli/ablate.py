"""``vit5 ablate``: the ViT-5 component ablations, each variant trained and compared (vit5.bench.ablate)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from vit5.cli import Parser, opt, run_main

# the keys of vit5.bench.ablate.ABLATIONS and SCALES, named here so --help loads no torch
ABLATION_NAMES = (
    "full,no_layerscale,no_rope,no_registers,layernorm,no_qk_norm,qkv_bias,swiglu,deit3,vanilla"
)
SCALE_NAMES = ("digits", "fashion_mnist", "imagenet")
SCALE_HELP = (
    "digits (default): the demo recipe at a reduced budget, for a CPU; fashion_mnist: the Fashion-MNIST "
    "CPU recipe at two epochs of a smaller model, scored on the test split, needs data.root=DIR of "
    "`vit5 data fashion-mnist DIR`; imagenet: configs/vit5_small_in1k.yaml, needs data.root=..."
)


def parse_args(argv: Sequence[str] | None = None, prog: str = "vit5 ablate") -> argparse.Namespace:
    p = Parser(prog=prog, description=__doc__)
    opt(p, "--scale", "digits", SCALE_HELP, choices=SCALE_NAMES)
    opt(p, "--config", Path, "base training recipe instead of the scale's")
    opt(p, "--seeds", int, "seeds (default: the scale's)", nargs="+")
    opt(p, "--epochs", int, "epochs per run (default: the scale's)")
    opt(p, "--only", None, f"comma-separated ablations (full is always run): {ABLATION_NAMES}")
    opt(p, "--out", Path, "output directory (default runs/ablate_<scale>)")
    opt(p, "--keep-checkpoints", False, "keep finished runs' checkpoints/")
    opt(p, "--list", False, "print the ablations and their overrides, then exit")
    overrides = "training-config overrides for every run, e.g. data.batch_size=32"
    p.add_argument("overrides", nargs="*", metavar="key=value", help=overrides)
    return p.parse_args(argv)


def plan_from_args(args: argparse.Namespace):
    """The :class:`~vit5.bench.ablate.AblationPlan` the command line asks for; bad input: InputError."""
    from vit5.bench.ablate import plan_for

    return plan_for(**{k: v for k, v in vars(args).items() if k != "list"})


def main(argv: Sequence[str] | None = None, prog: str = "vit5 ablate") -> int:
    """Exit status: 0 every run completed, 1 some diverged, 2 bad arguments, config or data."""
    return run_main(lambda argv: parse_args(argv, prog), argv, _ablate)


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
