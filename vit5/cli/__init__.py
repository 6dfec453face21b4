"""The ``vit5`` command: every command line of the toolkit, in one package on top of the library.

``vit5 train``, ``vit5 eval COMMAND``, ``vit5 viz COMMAND``, ``vit5 data COMMAND``, ``vit5 bench``,
``vit5 ablate`` and ``vit5 export`` (``python -m vit5 ...`` is the same; ``vit5 COMMAND --help`` for the
options), one module each in this package; no library module parses arguments. This module holds what
they share: the input-size syntax (:func:`parse_size`) and the handling of a user error
(:func:`run_command`: one ``error: ...`` line on stderr, exit status 2, no traceback). Subcommands are
imported only when asked for, so ``vit5 --help`` does not load them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from vit5.errors import Vit5Error, user_message
from vit5.runtime import print_main

# name -> (module whose main(argv) runs it, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("vit5.cli.train", "train or fine-tune a ViT-5 (no arguments: the built-in digits demo)"),
    "eval": ("vit5.cli.eval", "classification metrics, resolution sweeps, dense features and probes"),
    "viz": ("vit5.cli.viz", "attention maps, token norms, register metrics, ablations, the register study"),
    "data": ("vit5.cli.data", "data sets written as ImageFolder trees (the digits)"),
    "bench": ("vit5.cli.bench", "speed, memory and FLOPs benchmarks with a report"),
    "ablate": ("vit5.cli.ablate", "component ablation: train each variant, compare accuracy and speed"),
    "export": ("vit5.cli.export", "export a model to ONNX (checked with onnxruntime) or torch.export"),
}
OWN_PROG = {"train", "eval", "viz", "data"}  # subcommands whose main() takes the program name for usage lines
SIZE_HELP = "N or HxW (height x width, patch multiples; e.g. 224 or 96x128)"


def parse_size(text: str) -> tuple[int, int]:
    """The one input-size syntax of every command line: ``"224"`` -> (224, 224), ``"96x128"`` -> (96, 128).

    An argparse ``type``: a bad value is an argparse error naming the option and the syntax.
    """
    parts = text.lower().split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or min(values, default=0) <= 0:
        raise argparse.ArgumentTypeError(
            f"size {text!r} is not N or HxW with positive integers (e.g. 224 or 96x128)"
        )
    return (values[0], values[-1])


def run_command(work: Callable[[], int | None]) -> int:
    """Run a command line's work; a user error ends in one ``error: ...`` line and exit status 2.

    User errors are :class:`vit5.errors.Vit5Error` (bad input, named with its fix) and ``OSError`` (a
    full or read-only disk, a missing file); anything else is a bug and keeps its traceback.
    """
    try:
        return work() or 0
    except (Vit5Error, OSError) as err:
        print_main(f"error: {user_message(err)}", err=True)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vit5",
        description="ViT-5 (arXiv 2602.08071): train, evaluate, visualise, benchmark and export.",
        epilog="`vit5 COMMAND --help` lists its options. Multi-GPU: accelerate launch -m vit5 train ...",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, summary) in COMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``vit5`` and ``python -m vit5``: dispatch to the subcommand's ``main(argv)``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        build_parser().parse_args(argv[:1])  # --help, or a usage error naming the commands
        return 2
    name, rest = argv[0], argv[1:]
    module = importlib.import_module(COMMANDS[name][0])
    if name in OWN_PROG:
        return run_command(lambda: module.main(rest, prog=f"vit5 {name}"))
    return run_command(lambda: module.main(rest))
