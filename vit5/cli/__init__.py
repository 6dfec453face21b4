"""The ``vit5`` command: every command line of the toolkit, in one package on top of the library.

``vit5 train``, ``vit5 eval COMMAND``, ``vit5 viz COMMAND``, ``vit5 predict``, ``vit5 data COMMAND``,
``vit5 bench``, ``vit5 ablate``, ``vit5 export`` and ``vit5 list`` (``python -m vit5 ...`` is the same;
``vit5 COMMAND --help`` for the options), one module each in this package; no library module parses
arguments. This module holds what they share: the parser class (:class:`Parser`: a subcommand's
mistake is reported with that subcommand's usage), the input-size syntax (:func:`parse_size`) and the
handling of a user error (:func:`run_command`: one ``error: ...`` line on stderr, exit status 2, no
traceback).

Start-up is fast: subcommands are imported only when asked for, and each builds its parser from
the standard library alone, importing torch and the library inside its work function, so
``vit5 --help``, ``vit5 COMMAND --help`` and argument errors answer without loading torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from vit5.errors import Vit5Error, user_message
from vit5.runtime import print_main

# name -> (module whose main(argv) runs it, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("vit5.cli.train", "train or fine-tune a ViT-5 (no arguments: the built-in digits demo)"),
    "eval": ("vit5.cli.eval", "classification metrics, resolution sweeps, dense features and probes"),
    "viz": ("vit5.cli.viz", "attention maps, token norms, register metrics, ablations, the register study"),
    "data": (
        "vit5.cli.data",
        "data sets as ImageFolder trees (the digits, Fashion-MNIST) or WebDataset shards",
    ),
    "bench": ("vit5.cli.bench", "speed, memory and FLOPs benchmarks with a report"),
    "ablate": ("vit5.cli.ablate", "component ablation: train each variant, compare accuracy and speed"),
    "export": ("vit5.cli.export", "export a model to ONNX (checked with onnxruntime) or torch.export"),
    "predict": ("vit5.cli.predict", "top-k class names and probabilities for each image of a folder"),
    "list": ("vit5.cli.catalog", "the model presets, the released weights and the packaged training recipes"),
}
OWN_PROG = {
    "train",
    "eval",
    "viz",
    "data",
    "predict",
    "list",
}  # main() takes the program name for usage lines
SIZE_HELP = "N or HxW (height x width, patch multiples; e.g. 224 or 96x128)"


class Parser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose subcommands report their own mistakes, in plain text.

    argparse leaves an unknown option of a subcommand to the top parser, which prints its own usage
    (``vit5 viz: error: unrecognized arguments``); here the subcommand that was given it says so,
    with its usage.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.is_subcommand = False

    def add_subparsers(self, **kwargs):
        action = super().add_subparsers(**kwargs)
        add_parser = action.add_parser

        def add_subcommand(name: str, **options) -> Parser:
            parser = add_parser(name, **options)
            parser.is_subcommand = True
            return parser

        action.add_parser = add_subcommand
        return action

    def format_help(self) -> str:
        """The help as plain text: the reST markup of docstrings used as descriptions (``:mod:`x```,
        double backticks) is dropped."""
        return re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", super().format_help()).replace("``", "")

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self.is_subcommand:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def add_weights_option(
    parser: argparse.ArgumentParser, auto: bool = False, subject: str = "checkpoint"
) -> None:
    """``--weights raw|ema`` (with ``auto``: raw, plus EMA when a checkpoint directory has it), the one
    spelling of every command; ``--ema`` stays as the short form of ``--weights ema``."""
    choices = ("auto", "raw", "ema") if auto else ("raw", "ema")
    summary = (
        "auto: raw, plus EMA when a checkpoint directory has it (default); raw; ema"
        if auto
        else f"raw (default) or the EMA weights of the {subject}"
    )
    parser.add_argument("--weights", choices=choices, default=choices[0], help=summary)
    parser.add_argument(
        "--ema", dest="weights", action="store_const", const="ema", help="the same as --weights ema"
    )


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


def run_command(work: Callable[[], int | None], out: str | os.PathLike[str] | None = None) -> int:
    """Run a command line's work; a user error ends in one ``error: ...`` line and exit status 2.

    User errors are :class:`vit5.errors.Vit5Error` (bad input, named with its fix) and ``OSError`` (a
    full or read-only disk, a missing file); anything else is a bug and keeps its traceback.
    ``out``: the command's output folder; when the command fails, the folders it created there are
    removed again if nothing was written into them (a failed command leaves no empty ``--out``).
    """
    created = _first_missing(Path(out)) if out is not None else None
    status = 2
    try:
        status = work() or 0
    except (Vit5Error, OSError) as err:
        print_main(f"error: {user_message(err)}", err=True)
    finally:
        if status != 0 and created is not None and created.is_dir() and _holds_no_file(created):
            shutil.rmtree(created, ignore_errors=True)
    return status


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (None: it exists)."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists() or folder.is_symlink():
            break
        missing = folder
    return missing


def _holds_no_file(folder: Path) -> bool:
    return all(p.is_dir() and not p.is_symlink() for p in folder.rglob("*"))


def build_parser() -> argparse.ArgumentParser:
    from vit5 import __version__

    parser = Parser(
        prog="vit5",
        description="ViT-5 (arXiv 2602.08071): train, evaluate, visualise, benchmark and export.",
        epilog="`vit5 COMMAND --help` lists its options; `vit5 list` the models and recipes. "
        "Multi-GPU: accelerate launch -m vit5 train ...",
    )
    parser.add_argument("--version", action="version", version=f"vit5 {__version__}")
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
